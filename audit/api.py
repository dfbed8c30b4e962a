"""``GET /api/audit-events/``: the audit trail as JSON, with the audit page's filters.

A thin layer over the audit page's query code (``audit.filters``, ``audit.access``): newest
first, keyset-paginated on ``seq``: follow ``next`` (``?before=<seq>``) until it is null. Each
event carries exactly the hashed fields plus ``hash``, like the JSON Lines export.

Only sealed events are listed: an event recorded a moment ago has no ``seq`` or ``hash`` until
the sealer chains it (within seconds), and the schema promises both. A time range may be empty
(``since`` at or after ``until``): it matches nothing, which is an empty page, not an error.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from audit.access import events_for_user
from audit.chain import canonical_time
from audit.export import COLUMNS
from audit.filters import API_MAX_PAGE_SIZE, API_PAGE_SIZE, AuditFilterForm, page_of
from audit.models import AuditEvent, Outcome


def event_json(event: AuditEvent) -> dict[str, Any]:
    data = {name: getattr(event, name) for name in COLUMNS}
    data["created_at"] = canonical_time(event.created_at)
    return data


class AuditEventSerializer(serializers.Serializer[AuditEvent]):
    """The hashed fields plus ``hash``, exactly as the chain and the JSON Lines export have
    them (``created_at`` in the chain's canonical form)."""

    seq = serializers.IntegerField()
    created_at = serializers.CharField(help_text="UTC, microseconds: 2026-01-02T03:04:05.000006Z")
    actor_id = serializers.IntegerField(allow_null=True)
    actor_username = serializers.CharField()
    source_ip = serializers.CharField(allow_null=True)
    action = serializers.CharField()
    target_type = serializers.CharField()
    target_id = serializers.CharField()
    target_repr = serializers.CharField()
    channel_slug = serializers.CharField()
    reason = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    changes = serializers.JSONField(allow_null=True)
    outcome = serializers.ChoiceField(choices=Outcome.choices)
    prev_hash = serializers.CharField()
    hash = serializers.CharField()

    def to_representation(self, instance: AuditEvent) -> dict[str, Any]:
        return event_json(instance)


class AuditPageSerializer(serializers.Serializer[Any]):
    results = AuditEventSerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="The next (older) page, or null.")


class AuditParams(serializers.Serializer[Any]):
    """For the schema only: ``AuditFilterForm`` validates (the audit page's one definition)."""

    actor = serializers.CharField(required=False, max_length=150)
    action = serializers.CharField(
        required=False, max_length=64, help_text="Exact, or a prefix ending in * (dlq.*)."
    )
    target_type = serializers.CharField(required=False, max_length=64)
    target_id = serializers.CharField(required=False, max_length=64)
    channel = serializers.CharField(required=False, max_length=100)
    outcome = serializers.ChoiceField(choices=Outcome.choices, required=False)
    since = serializers.DateTimeField(required=False, help_text="Inclusive; no offset is UTC.")
    until = serializers.DateTimeField(required=False, help_text="Exclusive.")
    before = serializers.IntegerField(required=False, min_value=1, help_text="Cursor: seq.")
    limit = serializers.IntegerField(
        required=False, min_value=1, max_value=API_MAX_PAGE_SIZE, help_text="Page size."
    )


def _limit(raw: str | None) -> int | None:
    if not raw:
        return API_PAGE_SIZE
    try:
        limit = int(raw)
    except ValueError:
        return None
    return limit if 1 <= limit <= API_MAX_PAGE_SIZE else None


@extend_schema(
    operation_id="audit_events_list",
    parameters=[AuditParams],
    responses={200: AuditPageSerializer},
)
@api_view(["GET"])
def event_list(request: Request) -> Response:
    """Audit events, newest first (compliance role; a refusal is itself audited)."""
    events = events_for_user(request._request).filter(seq__isnull=False)
    form = AuditFilterForm(request.query_params, empty_range_ok=True)
    limit = _limit(request.query_params.get("limit"))
    if not form.is_valid() or limit is None:
        errors = {key: [e["message"] for e in value]
                  for key, value in form.errors.get_json_data().items()}  # fmt: skip
        if limit is None:
            errors["limit"] = [f"an integer from 1 to {API_MAX_PAGE_SIZE}"]
        raise serializers.ValidationError(errors)
    rows, next_before = page_of(form.apply(events), form.cursor, limit)
    next_url = None
    if next_before is not None:
        extra = {"before": next_before, "limit": request.query_params.get("limit")}
        next_url = request.build_absolute_uri(f"{request.path}?{form.querystring(**extra)}")
    return Response({"results": [event_json(e) for e in rows], "next": next_url})


urlpatterns = [path("", event_list, name="api_audit_events")]
