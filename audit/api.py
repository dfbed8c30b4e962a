"""``GET /api/audit-events/``: the audit trail as JSON, with the audit page's filters.

Newest first, keyset-paginated on ``seq``: follow ``next`` (``?before=<seq>``) until it is
null. Each event carries exactly the hashed fields plus ``hash``, like the JSON Lines export.
Query parameters: ``actor action target_type target_id channel outcome since until before
limit`` (``limit`` ≤ 500).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.http import require_GET

from audit.access import events_for_user
from audit.chain import canonical_time
from audit.export import COLUMNS
from audit.filters import API_MAX_PAGE_SIZE, API_PAGE_SIZE, AuditFilterForm, page_of
from audit.models import AuditEvent
from dashboard.api import api_error, api_view


def _limit(raw: str | None) -> int | None:
    if not raw:
        return API_PAGE_SIZE
    try:
        limit = int(raw)
    except ValueError:
        return None
    return limit if 1 <= limit <= API_MAX_PAGE_SIZE else None


def event_json(event: AuditEvent) -> dict[str, Any]:
    data = {name: getattr(event, name) for name in COLUMNS}
    data["created_at"] = canonical_time(event.created_at)
    return data


@api_view
@require_GET
def event_list(request: HttpRequest) -> JsonResponse:
    try:
        events = events_for_user(request)
    except PermissionDenied:
        return api_error(403, "the audit.view_auditevent permission (compliance role) is needed")
    form = AuditFilterForm(request.GET)
    limit = _limit(request.GET.get("limit"))
    if not form.is_valid() or limit is None:
        errors = form.errors.get_json_data() if form.errors else {}
        if limit is None:
            errors["limit"] = [{"message": f"an integer from 1 to {API_MAX_PAGE_SIZE}"}]
        return JsonResponse({"error": "invalid filters", "fields": errors}, status=400)
    rows, next_before = page_of(form.apply(events), form.cursor, limit)
    next_url = None
    if next_before is not None:
        extra = {"before": next_before, "limit": request.GET.get("limit")}
        next_url = request.build_absolute_uri(f"{request.path}?{form.querystring(**extra)}")
    return JsonResponse({"results": [event_json(e) for e in rows], "next": next_url})


urlpatterns = [path("", event_list, name="api_audit_events")]
