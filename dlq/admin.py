"""Read-only admin pages for dead letters and failure groups (set-up, and the triage
benchmark's baseline; triage is /dead-letters/).

Message-controlled text is hostile here as on the pages, and registry admins are staff
without the reveal permission, so the admin shows exactly what the entry page shows a user
who has not revealed: headers and body redacted per the channel's rules, every text through
``visible``. There is no reveal in the admin, whoever looks (superusers too): revealing is
the entry page's audited action, linked from here. No raw field is rendered: every shown
value is a method below, none of the stored JSON columns as a widget."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from dashboard.admin_text import VisibleTextAdmin, visible_value
from dlq.models import DeadLetter, FailureGroup
from dlq.text import redaction
from dlq.text import render as body_render


class ReadOnlyAdmin(VisibleTextAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _shown(attribute: str, label: str) -> Any:
    """A read-only admin field showing the model's ``attribute`` through ``visible``."""

    def shown(self: Any, obj: Any) -> str:
        return visible_value(getattr(obj, attribute) or "—")

    shown.short_description = label  # type: ignore[attr-defined]
    return shown


def _table(rows: list[tuple[str, str]]) -> SafeString:
    """(name, value) rows (already through ``visible``) as an escaped two-column table."""
    if not rows:
        return format_html("{}", "—")
    return format_html(
        "<table><tbody>{}</tbody></table>",
        format_html_join("", "<tr><td><code>{}</code></td><td><code>{}</code></td></tr>", rows),
    )


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = ["id", "channel", "source", "status", "reason", "dead_lettered_at"]
    list_filter = ["source", ("state__status", admin.ChoicesFieldListFilter), "channel"]
    search_fields = ["search_text"]
    list_select_related = ["channel", "state"]
    fields = readonly_fields = (
        "entry_page",
        "channel_shown",
        "source",
        "status",
        "reason_shown",
        "error_class_shown",
        "error_message_shown",
        "dead_lettered_at",
        "ingested_at",
        "redelivery_count",
        "first_death_queue_shown",
        "idempotency_key_shown",
        "message_type_shown",
        "content_type_shown",
        "size",
        "body_sha256",
        "headers_shown",
        "body_shown",
        "properties_shown",
    )

    channel_shown = _shown("channel", "channel")
    reason_shown = _shown("reason", "reason")
    error_class_shown = _shown("error_class", "error class")
    error_message_shown = _shown("error_message", "error message")
    first_death_queue_shown = _shown("first_death_queue", "first death queue")
    idempotency_key_shown = _shown("idempotency_key", "idempotency key")
    message_type_shown = _shown("message_type", "message type")
    content_type_shown = _shown("content_type", "content type")

    @admin.display(description="status", ordering="state__status")
    def status(self, obj: DeadLetter) -> str:
        return obj.get_status_display()

    @admin.display(description="triage")
    def entry_page(self, obj: DeadLetter) -> SafeString:
        return format_html(
            '<a href="{}">The entry page</a>: replay, discard and, with the reveal permission, '
            "reveal redacted fields (audited). The admin never reveals them.",
            obj.get_absolute_url(),
        )

    def _redact(self, obj: DeadLetter) -> bool:
        # The pages redact unless the viewer revealed, which is never the case here.
        return redaction.has_rules(obj.channel)

    @admin.display(description="headers")
    def headers_shown(self, obj: DeadLetter) -> SafeString:
        headers = obj.headers if isinstance(obj.headers, dict) else {}
        if self._redact(obj):
            headers = redaction.redact_headers(headers, obj.channel)
        rows, hidden = body_render.header_rows(headers)
        more = format_html("<p>… and {} more</p>", hidden) if hidden else ""
        return format_html("{}{}", _table(rows), more)

    @admin.display(description="body")
    def body_shown(self, obj: DeadLetter) -> SafeString:
        body = obj.body if obj.body is None else bytes(obj.body)
        shown = body_render.render_body(body, obj.channel, redact=self._redact(obj))
        note = format_html("<p>{}</p>", shown.note) if shown.note else ""
        text = format_html("<pre>{}</pre>", shown.text) if shown.text else ""
        cut = format_html("<p>{}</p>", "Truncated for display.") if shown.truncated else ""
        return format_html("{}{}{}", note, text, cut)

    @admin.display(description="properties")
    def properties_shown(self, obj: DeadLetter) -> SafeString:
        properties = obj.properties if isinstance(obj.properties, dict) else {}
        return _table(body_render.property_rows(properties))


@admin.register(FailureGroup)
class FailureGroupAdmin(ReadOnlyAdmin):
    list_display = ["id", "channel", "reason", "error_class", "count", "last_seen"]
    list_select_related = ["channel"]
    fields = readonly_fields = (
        "group_page",
        "channel_shown",
        "reason_shown",
        "error_class_shown",
        "normalized_error_shown",
        "message_type_shown",
        "fingerprint",
        "count",
        "open_count",
        "first_seen",
        "last_seen",
    )

    channel_shown = _shown("channel", "channel")
    reason_shown = _shown("reason", "reason")
    error_class_shown = _shown("error_class", "error class")
    normalized_error_shown = _shown("normalized_error", "normalized error")
    message_type_shown = _shown("message_type", "message type")

    @admin.display(description="triage")
    def group_page(self, obj: FailureGroup) -> SafeString:
        return format_html('<a href="{}">The group\'s entries</a>', obj.get_absolute_url())
