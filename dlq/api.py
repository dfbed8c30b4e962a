"""``GET /api/dead-letters/``: the list's filters, cursor pagination, redacted payloads.

The API never reveals: payloads of channels with redaction rules come back redacted for every
caller (a reveal is an audited action in the UI, with a reason). ``body_base64`` is the raw
body when the channel has no body rules, the redacted re-serialized JSON when it has, and
``null`` when the rules cannot be applied or the payload was purged.
"""

from __future__ import annotations

import base64
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path, reverse
from django.views.decorators.http import require_GET

from dashboard.api import api_error, api_view
from dlq import redaction, render
from dlq.access import VIEW_PERMISSION
from dlq.filters import MAX_PAGE_SIZE, PAGE_SIZE, EntryFilter, keyset_page
from dlq.models import DeadLetter

PREVIEW_CHARS = 1000


def serialize(entry: DeadLetter) -> dict[str, Any]:
    channel = entry.channel
    redact = redaction.has_rules(channel)
    raw = entry.body if entry.body is None else bytes(entry.body)
    shown = render.redacted_body_bytes(raw, channel) if redact else raw
    preview: str | None = None
    if shown is not None:
        try:
            preview = render.visible(shown[: PREVIEW_CHARS * 4].decode("utf-8")[:PREVIEW_CHARS])
        except UnicodeDecodeError:
            preview = None
    headers = redaction.redact_headers(entry.headers, channel) if redact else entry.headers
    return {
        "id": entry.pk,
        "url": entry.get_absolute_url(),
        "channel": channel.slug,
        "source": entry.source,
        "status": entry.status,
        "group": entry.group_id,
        "parent": entry.parent_id,
        "dedupe_key": entry.dedupe_key,
        "reason": entry.reason,
        "error_class": entry.error_class,
        "error_message": entry.error_message,
        "redelivery_count": entry.redelivery_count,
        "first_death_queue": entry.first_death_queue,
        "first_death_exchange": entry.first_death_exchange,
        "first_death_at": entry.first_death_at,
        "dead_lettered_at": entry.dead_lettered_at,
        "ingested_at": entry.ingested_at,
        "idempotency_key": entry.idempotency_key,
        "missing_idempotency_key": entry.missing_idempotency_key,
        "schema_version": entry.schema_version,
        "is_parseable": entry.is_parseable,
        "content_type": entry.content_type,
        "size": entry.size,
        "body_sha256": entry.body_sha256,
        "redacted": redact,
        "body_base64": base64.b64encode(shown).decode("ascii") if shown is not None else None,
        "text_preview": preview,
        "headers": headers,
        "properties": entry.properties,
        "death_history": entry.death_history,
        "purged_at": entry.purged_at,
    }


@api_view
@require_GET
def dead_letter_list(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(VIEW_PERMISSION):
        return api_error(403, "you need the viewer role to read dead letters")
    f = EntryFilter.from_params(request.GET)
    try:
        size = min(max(int(request.GET.get("limit", PAGE_SIZE)), 1), MAX_PAGE_SIZE)
    except ValueError:
        return api_error(400, "limit must be an integer")
    after = request.GET.get("after", "")
    if after and not (after.isdigit() and len(after) < 19):
        return api_error(400, "after must be an entry id")
    entries = f.apply(DeadLetter.objects.select_related("channel"))
    page = keyset_page(entries, int(after) if after else None, size)
    next_url = None
    if page.next_after:
        next_url = request.build_absolute_uri(
            reverse("dead_letter_api") + "?" + f.query_string(after=page.next_after, limit=size)
        )
    return JsonResponse(
        {
            "results": [serialize(e) for e in page.rows],
            "next": next_url,
            "filters": f.params(),
            "warnings": f.errors,
        }
    )


urlpatterns = [path("", dead_letter_list, name="dead_letter_api")]
