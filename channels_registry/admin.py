"""Django admin forms for registry admins. Saves and deletes go through the actions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from audit.actions import Actor
from channels_registry.actions import (
    do_delete_broker,
    do_delete_channel,
    do_register_schema,
    do_save_broker,
    do_save_channel,
    refresh_findings,
)
from channels_registry.forms import BrokerForm, ChannelForm
from channels_registry.models import Broker, Channel, MessageSchema
from channels_registry.principles import SEED_DEFAULTS, describe, seed_initial
from dashboard.admin_text import VisibleTextAdmin
from dashboard.text import visible


@dataclasses.dataclass(frozen=True)
class ChannelAdminPart:
    """What an app above the registry adds to the channel admin (alerts: the rule overrides):
    an inline, a snapshot taken before the inlines are saved, and what to do after (audit,
    re-check). Registered from that app's admin module, so the registry imports no app above
    it."""

    inline: type[admin.options.InlineModelAdmin[Any, Any]]
    before_save: Callable[[Channel], Any]
    after_save: Callable[[Channel, Actor, Any], object]


_parts: list[ChannelAdminPart] = []


def add_channel_admin_part(part: ChannelAdminPart) -> None:
    if part not in _parts:
        _parts.append(part)


def render_findings(findings: list[dict[str, Any]]) -> SafeString:
    if not findings:
        return format_html(
            '<p class="finding-none">{}</p>',
            "No findings: the declaration follows the delivery discipline.",
        )
    items = format_html_join(
        "",
        '<li class="finding finding-{}"><strong>{} · <a href="{}#{}">{} {}</a></strong> {} '
        "<em>Fix: {}</em><br><small>Why: {}</small></li>",
        (
            (
                d["severity"],
                d["severity"].upper(),
                reverse("principles"),
                d["principle"],
                d["principle"],
                d["principle_name"],
                visible(str(d["message"])),  # may quote the broker's configuration
                d["fix"],
                d["why"],
            )
            for d in map(describe, findings)
        ),
    )
    return format_html('<ul class="findings">{}</ul>', items)


def render_preset() -> SafeString:
    """On a blank channel form: the seeds' defaults, each explained, and a link filling them in."""
    rows = format_html_join(
        "",
        "<li><strong>{}: {}</strong> — {}</li>",
        (
            (label, ", ".join(value) if isinstance(value, list) else value, why)
            for _name, label, value, why in SEED_DEFAULTS
        ),
    )
    return format_html(
        '<p>Saved declarations are checked against <a href="{}">P1–P10</a>. '
        '<a class="button" href="?preset=seeds">Start from the recommended defaults</a></p>'
        '<ul class="seed-defaults">{}</ul>',
        reverse("principles"),
        rows,
    )


@admin.register(Broker)
class BrokerAdmin(VisibleTextAdmin):
    form = BrokerForm
    list_display = ["name", "kind", "url_source", "management_url", "enabled", "poll_interval_s"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name"]

    def save_model(self, request: HttpRequest, obj: Broker, form: Any, change: bool) -> None:
        before = Broker.objects.get(pk=obj.pk).audit_snapshot() if change else None
        do_save_broker(obj, actor=Actor.from_request(request), before=before)
        for problem in obj.config_problems():
            messages.warning(request, f"Broker {obj.name}: {problem}")

    def delete_model(self, request: HttpRequest, obj: Broker) -> None:
        do_delete_broker(obj, actor=Actor.from_request(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Broker]) -> None:
        for broker in queryset:
            do_delete_broker(broker, actor=Actor.from_request(request))


@admin.register(Channel)
class ChannelAdmin(VisibleTextAdmin):
    form = ChannelForm
    list_select_related = ["broker"]  # the columns are callables: no automatic join
    list_display = [
        "name",
        "slug",
        "broker",
        "address_display",
        "owner_team",
        "semantic",
        "error_count",
        "warning_count",
        "enabled",
    ]
    list_filter = ["broker", "owner_team", "semantic", "enabled"]
    search_fields = ["name", "slug", "address", "owner_team"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["declaration_findings", "observed_findings"]
    # The inlines come from the parts other apps register (``add_channel_admin_part``).
    fieldsets = [
        ("Findings", {"fields": ["declaration_findings", "observed_findings"]}),
        (
            "Channel",
            {
                "fields": [
                    "broker",
                    "name",
                    "slug",
                    "address",
                    "address_group",
                    "owner_team",
                    "runbook_url",
                    "description",
                    "enabled",
                ]
            },
        ),
        (
            "Delivery semantic (P4) and idempotency (P3)",
            {
                "fields": [
                    "semantic",
                    "idempotency_source",
                    "idempotency_key",
                    "dedup_scope",
                    "dedup_ttl_s",
                    "dedup_store_shared",
                    "shared_subscription",
                    "consumer_idempotent",
                    "mark_in_transaction",
                ]
            },
        ),
        (
            "Ordering and partitioning (P2, P7)",
            {
                "fields": [
                    "ordering",
                    "ordering_key",
                    "ordering_rationale",
                    "single_active_consumer",
                    "partition_mechanism",
                ]
            },
        ),
        (
            "Retry budget and backoff (P5, P6)",
            {
                "fields": [
                    "retry_max_attempts",
                    "retry_ttl_s",
                    "backoff_base_s",
                    "backoff_factor",
                    "backoff_cap_s",
                    "backoff_jitter",
                    "max_in_flight",
                    "ack_timeout_s",
                    "retry_address",
                ]
            },
        ),
        (
            "Dead letters (P5)",
            {
                "fields": [
                    "dlq_strategies",
                    "dlq_address",
                    "poison_address",
                    "nats_advisory_capture",
                    "dlq_records_reason",
                ]
            },
        ),
        (
            "Retention and schema (P1, P8, P9)",
            {"fields": ["retention_s", "schema_name", "schema_version", "schema_compatibility"]},
        ),
        (
            "How messages are written (Redis entry layout, job type)",
            {
                "fields": [
                    "entry_layout",
                    "entry_body_field",
                    "entry_metadata_fields",
                    "message_type_source",
                    "message_type_key",
                ]
            },
        ),
        (
            "Alert thresholds (P10)",
            {
                "fields": [
                    "alert_dlq_depth",
                    "alert_lag_messages",
                    "alert_lag_seconds",
                    "alert_oldest_age_s",
                    "alert_min_consumers",
                ]
            },
        ),
        ("Redaction", {"fields": ["redact_json_paths", "redact_headers"]}),
    ]

    @admin.display(description="Declaration checks")
    def declaration_findings(self, obj: Channel | None) -> SafeString:
        if obj is None or obj.pk is None:
            return render_preset()
        return render_findings(obj.findings)

    @admin.display(description="Declared vs observed")
    def observed_findings(self, obj: Channel | None) -> SafeString:
        """What the last read of the broker's configuration found against this declaration."""
        health = getattr(obj, "health", None) if obj is not None and obj.pk else None
        if health is None or health.observed_at is None:
            problems = obj.broker.config_problems() if obj is not None and obj.pk else []
            return format_html(
                '<p class="sub">{}</p>',
                visible(problems[0])
                if problems
                else "The broker's configuration has not been read yet (every few polls).",
            )
        if not health.observed_findings:
            return format_html(
                '<p class="ok">The broker matches the declaration (read {} UTC).</p>',
                f"{health.observed_at:%Y-%m-%d %H:%M}",
            )
        return render_findings(health.observed_findings)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        if request.GET.get("preset") == "seeds":
            initial = {**seed_initial(), **initial}
        return initial

    def save_model(self, request: HttpRequest, obj: Channel, form: Any, change: bool) -> None:
        before = Channel.objects.get(pk=obj.pk).audit_snapshot() if change else None
        do_save_channel(obj, actor=Actor.from_request(request), before=before)
        for problem in obj.broker.config_problems():
            messages.warning(request, f"Broker {obj.broker.name}: {problem}")
        errors = [f for f in obj.findings if f["severity"] == "error"]
        if errors:
            messages.warning(
                request,
                f"Saved with {len(errors)} declaration error(s): "
                + "; ".join(f"{f['principle']} {f['message']}" for f in errors[:3]),
            )

    def get_inlines(self, request: HttpRequest, obj: Channel | None) -> list[Any]:
        return [part.inline for part in _parts]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # The registered parts' inlines (the alert rule overrides) are saved after the channel;
        # each part then does its own after-save (alerts: rerun the checks, since a disabled
        # DLQ alert is a finding, and audit the change).
        channel = form.instance
        before = [part.before_save(channel) if change else {} for part in _parts]
        super().save_related(request, form, formsets, change)
        actor = Actor.from_request(request)
        for part, snapshot in zip(_parts, before, strict=True):
            part.after_save(channel, actor, snapshot)

    def delete_model(self, request: HttpRequest, obj: Channel) -> None:
        do_delete_channel(obj, actor=Actor.from_request(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Channel]) -> None:
        for channel in queryset:
            do_delete_channel(channel, actor=Actor.from_request(request))

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        obj = kwargs.get("obj")
        if obj is not None and not obj.findings:
            refresh_findings(obj)
        return super().render_change_form(request, context, *args, **kwargs)


class MessageSchemaForm(forms.ModelForm):
    class Meta:
        model = MessageSchema
        fields = ["name", "version", "schema"]

    def clean(self) -> dict[str, Any]:
        from channels_registry.schemas import registration_problems

        cleaned = super().clean() or {}
        if not self.errors:
            candidate = MessageSchema(
                pk=self.instance.pk,
                name=cleaned.get("name", ""),
                version=cleaned.get("version", ""),
                schema=cleaned.get("schema"),
            )
            problems = registration_problems(candidate)
            if problems:
                raise forms.ValidationError(problems)
        return cleaned


@admin.register(MessageSchema)
class MessageSchemaAdmin(admin.ModelAdmin):
    """Registered JSON Schemas; a channel's schema name and version select one."""

    form = MessageSchemaForm
    list_display = ["name", "version", "created_at"]
    search_fields = ["name"]

    def save_model(self, request: HttpRequest, obj: MessageSchema, form: Any, change: bool) -> None:
        before = MessageSchema.objects.get(pk=obj.pk).audit_snapshot() if change else None
        do_register_schema(obj, actor=Actor.from_request(request), before=before)
