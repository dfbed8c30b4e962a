"""``GET /api/dead-letters/``: the list's filters, cursor pagination, redacted payloads.

The API never reveals: payloads of channels with redaction rules come back redacted for every
caller (a reveal is an audited action in the UI, with a reason). ``body_base64`` is the raw
body when the channel has no body rules, the redacted re-serialized JSON when it has, and
``null`` when the rules cannot be applied or the payload was purged.

Pagination is the list page's keyset: follow ``next`` (``?after=<id>``) until it is null.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from django.urls import path, reverse
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from dlq.models import DeadLetter, Source, Status
from dlq.text import redaction, render
from dlq.triage.access import entries_for_user
from dlq.triage.filters import MAX_PAGE_SIZE, PAGE_SIZE, EntryFilter, keyset_page, parse_id

PREVIEW_CHARS = 1000
CURSOR_ERRORS = ("invalid", "min_value", "max_value", "max_string_length")


def in_utc_range(value: dt.datetime) -> bool:
    """``9999-12-31T23:59:59-14:00`` parses but has no UTC equivalent: the query would fail."""
    try:
        value.astimezone(dt.UTC)
    except OverflowError:
        return False
    return True


class EntryFilterParams(serializers.Serializer[Any]):
    """The list's filters as query parameters (``EntryFilter`` applies them). Text is refused
    with a 400 when it holds a NUL byte (DRF's ``CharField`` does that), which no column can
    store; an unknown status or source and an unreadable or out-of-range time are 400s too."""

    channel = serializers.CharField(required=False, allow_blank=True, help_text="Channel slug.")
    # Field names a serializer field's own attributes (source, parent) are fine at runtime: the
    # metaclass moves declared fields out of the class body.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=Source.choices, required=False, allow_blank=True
    )
    status = serializers.ChoiceField(choices=Status.choices, required=False, allow_blank=True)
    group = serializers.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, help_text="Failure group id."
    )
    reason = serializers.CharField(required=False, allow_blank=True)
    since = serializers.DateTimeField(
        required=False, help_text="Dead-lettered at or after (ISO 8601; no offset means UTC)."
    )
    until = serializers.DateTimeField(required=False, help_text="Dead-lettered before.")
    key = serializers.CharField(required=False, allow_blank=True, help_text="Idempotency key.")
    q = serializers.CharField(
        required=False, allow_blank=True, help_text="Text search (3 characters or more)."
    )

    def validate_since(self, value: dt.datetime) -> dt.datetime:
        if not in_utc_range(value):
            raise serializers.ValidationError("That time is out of range.")
        return value

    validate_until = validate_since


class DeadLetterListParams(EntryFilterParams):
    limit = serializers.IntegerField(
        required=False,
        error_messages={"invalid": "limit must be an integer"},
        help_text=f"Page size, default {PAGE_SIZE}; clamped to 1..{MAX_PAGE_SIZE}.",
    )
    after = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        error_messages=dict.fromkeys(CURSOR_ERRORS, "after must be an entry id"),
        help_text="Cursor: entries with a smaller id (what `next` carries).",
    )


def entry_filter(params: dict[str, Any]) -> EntryFilter:
    """The validated parameters as the list page's filter (one definition of "which")."""
    raw = {key: value.isoformat() if isinstance(value, dt.datetime) else value
           for key, value in params.items()}  # fmt: skip
    return EntryFilter.from_params(raw)


def _shown(entry: DeadLetter) -> tuple[bool, bytes | None, Any]:
    """(redacted?, the body the API may show, the headers it may show), computed once."""
    cached = getattr(entry, "_api_shown", None)
    if cached is None:
        channel = entry.channel
        redact = redaction.has_rules(channel)
        raw = entry.body if entry.body is None else bytes(entry.body)
        body = render.redacted_body_bytes(raw, channel) if redact else raw
        headers = redaction.redact_headers(entry.headers, channel) if redact else entry.headers
        cached = (redact, body, headers)
        entry._api_shown = cached  # type: ignore[attr-defined]
    return cached


class DeadLetterSerializer(serializers.Serializer[DeadLetter]):
    id = serializers.IntegerField(source="pk")
    url = serializers.CharField(source="get_absolute_url", help_text="The entry's page.")
    channel = serializers.CharField(source="channel.slug", help_text="Channel slug.")
    source = serializers.ChoiceField(choices=Source.choices)  # type: ignore[assignment]
    status = serializers.ChoiceField(choices=Status.choices)
    group = serializers.IntegerField(source="group_id", allow_null=True)
    parent = serializers.IntegerField(  # type: ignore[assignment]
        source="parent_id", allow_null=True
    )
    dedupe_key = serializers.CharField()
    reason = serializers.CharField()
    error_class = serializers.CharField()
    error_message = serializers.CharField()
    redelivery_count = serializers.IntegerField(allow_null=True)
    first_death_queue = serializers.CharField()
    first_death_exchange = serializers.CharField()
    first_death_at = serializers.DateTimeField(allow_null=True)
    dead_lettered_at = serializers.DateTimeField()
    ingested_at = serializers.DateTimeField()
    idempotency_key = serializers.CharField()
    missing_idempotency_key = serializers.BooleanField()
    schema_version = serializers.CharField()
    is_parseable = serializers.BooleanField(allow_null=True)
    content_type = serializers.CharField()
    size = serializers.IntegerField()
    body_sha256 = serializers.CharField()
    redacted = serializers.SerializerMethodField()
    body_base64 = serializers.SerializerMethodField()
    text_preview = serializers.SerializerMethodField()
    headers = serializers.SerializerMethodField()
    properties = serializers.JSONField()
    death_history = serializers.JSONField()
    purged_at = serializers.DateTimeField(allow_null=True)

    def get_redacted(self, entry: DeadLetter) -> bool:
        return _shown(entry)[0]

    @extend_schema_field({"type": "string", "format": "byte", "nullable": True})
    def get_body_base64(self, entry: DeadLetter) -> str | None:
        body = _shown(entry)[1]
        return base64.b64encode(body).decode("ascii") if body is not None else None

    @extend_schema_field({"type": "string", "nullable": True})
    def get_text_preview(self, entry: DeadLetter) -> str | None:
        body = _shown(entry)[1]
        if body is None:
            return None
        try:
            return render.visible(body[: PREVIEW_CHARS * 4].decode("utf-8")[:PREVIEW_CHARS])
        except UnicodeDecodeError:
            return None

    @extend_schema_field({"type": "object", "additionalProperties": True})
    def get_headers(self, entry: DeadLetter) -> Any:
        return _shown(entry)[2]


class DeadLetterPageSerializer(serializers.Serializer[Any]):
    results = DeadLetterSerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="The next page, or null.")
    filters = serializers.DictField(child=serializers.CharField(), help_text="Filters applied.")
    warnings = serializers.ListField(child=serializers.CharField())


@extend_schema(
    operation_id="dead_letters_list",
    parameters=[DeadLetterListParams],
    responses={200: DeadLetterPageSerializer},
)
@api_view(["GET"])
def dead_letter_list(request: Request) -> Response:
    """Dead letters, newest first, with the triage list's filters (viewer role)."""
    entries_visible = entries_for_user(request._request)
    params = DeadLetterListParams(data=request.query_params)
    params.is_valid(raise_exception=True)
    data = dict(params.validated_data)
    size = min(max(data.pop("limit", PAGE_SIZE), 1), MAX_PAGE_SIZE)
    after_id = parse_id(data.pop("after", None))
    f = entry_filter(data)
    entries = f.apply(entries_visible.select_related("channel", "state"))
    page = keyset_page(entries, after_id, size)
    next_url = None
    if page.next_after:
        next_url = request.build_absolute_uri(
            reverse("dead_letter_api") + "?" + f.query_string(after=page.next_after, limit=size)
        )
    body = {
        "results": DeadLetterSerializer(page.rows, many=True).data,  # type: ignore[arg-type]
        "next": next_url,
        "filters": f.params(),
        "warnings": f.errors,
    }
    return Response(body)


urlpatterns = [path("", dead_letter_list, name="dead_letter_api")]
