"""Forms for declarations; the admin and the YAML import validate through the same ones."""

from __future__ import annotations

from typing import Any

from django import forms

from channels_registry.models import Broker, Channel, DlqStrategy


class LinesField(forms.CharField):
    """A list of strings edited one per line (also accepts a list, for imports)."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        if isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise forms.ValidationError("Give a list of strings.")
            return [v.strip() for v in value if v.strip()]
        text = super().to_python(value) or ""
        return [line.strip() for line in str(text).splitlines() if line.strip()]


class BrokerForm(forms.ModelForm):
    url_secret = forms.CharField(
        label="Stored connection URL",
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Write-only. Leave blank to keep the stored URL; prefer an environment variable.",
    )
    clear_url_secret = forms.BooleanField(label="Forget the stored URL", required=False)

    class Meta:
        model = Broker
        fields = [
            "name",
            "kind",
            "url_env",
            "url_secret",
            "management_url",
            "enabled",
            "poll_interval_s",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # A blank secret on an existing broker keeps what is stored.
        if (
            not cleaned.get("url_secret")
            and self.instance.pk
            and not cleaned.get("clear_url_secret")
        ):
            cleaned["url_secret"] = Broker.objects.get(pk=self.instance.pk).url_secret
        if cleaned.get("clear_url_secret"):
            cleaned["url_secret"] = ""
        return cleaned


CHANNEL_FORM_FIELDS = [
    "broker",
    "name",
    "slug",
    "address",
    "address_group",
    "owner_team",
    "runbook_url",
    "description",
    "enabled",
    "semantic",
    "idempotency_source",
    "idempotency_key",
    "dedup_scope",
    "dedup_ttl_s",
    "dedup_store_shared",
    "shared_subscription",
    "consumer_idempotent",
    "mark_in_transaction",
    "ordering",
    "ordering_key",
    "ordering_rationale",
    "single_active_consumer",
    "partition_mechanism",
    "retry_max_attempts",
    "retry_ttl_s",
    "backoff_base_s",
    "backoff_factor",
    "backoff_cap_s",
    "backoff_jitter",
    "max_in_flight",
    "ack_timeout_s",
    "retry_address",
    "dlq_strategies",
    "dlq_address",
    "poison_address",
    "nats_advisory_capture",
    "dlq_records_reason",
    "retention_s",
    "schema_name",
    "schema_version",
    "schema_compatibility",
    "entry_layout",
    "entry_body_field",
    "entry_metadata_fields",
    "message_type_source",
    "message_type_key",
    "alert_dlq_depth",
    "alert_lag_messages",
    "alert_lag_seconds",
    "alert_oldest_age_s",
    "alert_min_consumers",
    "redact_json_paths",
    "redact_headers",
]


class ChannelForm(forms.ModelForm):
    dlq_strategies = forms.MultipleChoiceField(
        label="DLQ strategy",
        choices=DlqStrategy.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    redact_json_paths = LinesField(
        required=False, help_text="One JSON path per line, e.g. $.customer.email"
    )
    redact_headers = LinesField(required=False, help_text="One header name per line.")
    entry_metadata_fields = LinesField(
        label="Redis error / metadata fields",
        required=False,
        help_text="Field-map layout: one field name per line (a trailing * matches a prefix). "
        "Empty: reason, error, error_class, delivery_count, source_stream, source_id, "
        "dead_lettered_at, x-error-*, x-dlq-*.",
    )

    class Meta:
        model = Channel
        fields = CHANNEL_FORM_FIELDS
