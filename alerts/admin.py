"""Admin for registry admins: notification destinations (write-only URL and secret) and the
per-channel rule overrides inline (shown on the channel form, see channels_registry.admin)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from alerts.actions import (
    do_delete_destination,
    do_record_rule_overrides,
    do_save_destination,
    override_snapshot,
)
from alerts.models import Destination, RuleKey, RuleOverride
from alerts.rule_keys import NOT_CHANNEL_RULES
from audit.actions import Actor
from channels_registry.admin import ChannelAdminPart, add_channel_admin_part


class DestinationForm(forms.ModelForm):
    url = forms.CharField(
        label="URL",
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Write-only (a Slack webhook URL is a credential). Blank keeps the stored one.",
    )
    secret = forms.CharField(
        label="Signing secret",
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="JSON webhooks: the HMAC-SHA256 key receivers verify the X-DLO-Signature "
        "header with. Write-only; blank keeps the stored one.",
    )

    class Meta:
        model = Destination
        fields = [
            "name",
            "kind",
            "url",
            "secret",
            "email_to",
            "min_severity",
            "owner_team",
            "send_resolved",
            "enabled",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk:
            stored = Destination.objects.get(pk=self.instance.pk)
            for name in ("url", "secret"):
                if not cleaned.get(name):
                    cleaned[name] = getattr(stored, name)
                    setattr(self.instance, name, cleaned[name])
        return cleaned


@admin.register(Destination)
class DestinationAdmin(admin.ModelAdmin):
    form = DestinationForm
    list_display = ["name", "kind", "target_display", "min_severity", "owner_team", "enabled"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name", "owner_team"]

    def save_model(self, request: HttpRequest, obj: Destination, form: Any, change: bool) -> None:
        before = Destination.objects.get(pk=obj.pk).audit_snapshot() if change else None
        do_save_destination(obj, actor=Actor.from_request(request), before=before)

    def delete_model(self, request: HttpRequest, obj: Destination) -> None:
        do_delete_destination(obj, actor=Actor.from_request(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Destination]) -> None:
        for destination in queryset:
            do_delete_destination(destination, actor=Actor.from_request(request))


class RuleOverrideForm(forms.ModelForm):
    rule = forms.ChoiceField(choices=[c for c in RuleKey.choices if c[0] not in NOT_CHANNEL_RULES])

    class Meta:
        model = RuleOverride
        fields = ["rule", "enabled", "for_s", "threshold", "window_s"]


class RuleOverrideInline(admin.TabularInline):
    """Per-channel changes to the default alert rules; saved with the channel and audited by
    ``alerts.actions.do_record_rule_overrides`` (called from the channel admin)."""

    model = RuleOverride
    form = RuleOverrideForm
    extra = 0
    verbose_name = "alert rule override"
    verbose_name_plural = (
        "Alert rule overrides (P10) — every channel gets the default rules; change one here"
    )


# The channel admin (the registry's) shows and saves these overrides through this part.
add_channel_admin_part(
    ChannelAdminPart(
        inline=RuleOverrideInline,
        before_save=override_snapshot,
        after_save=lambda channel, actor, before: do_record_rule_overrides(
            channel, actor=actor, before=before
        ),
    )
)
