"""Alerts, silences, per-channel rule overrides, notification destinations and deliveries.

An ``Alert`` row is one episode of one rule on one channel (or broker): pending → firing →
resolved. A new episode after a resolve is a new row, so a ``Notification`` is unique on
(alert, transition, destination) and nothing is sent twice by design. Rule logic lives in
``alerts.rules`` (pure) and ``alerts.evaluate`` (the database side).
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.urls import reverse

from alerts.rule_keys import NOT_CHANNEL_RULES, THRESHOLD_RULES, WINDOW_RULES, RuleKey, Severity
from channels_registry.models import Broker, Channel

SEVERITY_RANK = {Severity.WARNING: 1, Severity.CRITICAL: 2}


class AlertState(models.TextChoices):
    PENDING = "pending", "Pending"
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


ACTIVE_STATES = (AlertState.PENDING, AlertState.FIRING)


class RuleOverride(models.Model):
    """A registry admin's change to one default rule of one channel. Thresholds the channel
    declares itself (``Channel.alert_*``) are edited there; ``threshold`` is only for rules
    without a declared one (DLQ age, inflow counts)."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="alert_overrides")
    rule = models.CharField(max_length=32, choices=RuleKey.choices)
    enabled = models.BooleanField(default=True)
    for_s = models.PositiveIntegerField(
        "for (s)", null=True, blank=True, help_text="How long the condition must hold to fire."
    )
    threshold = models.FloatField(
        null=True,
        blank=True,
        help_text="DLQ age (s) or inflow count; other thresholds are the channel's own fields.",
    )
    window_s = models.PositiveIntegerField(
        "window (s)", null=True, blank=True, help_text="Inflow rules: the counting window."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "rule"], name="ruleoverride_unique_rule")
        ]

    def __str__(self) -> str:
        return f"{self.rule} on {self.channel_id}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.rule == RuleKey.POLLER_STALE:
            errors["rule"] = "The poller-stale rule belongs to the broker, not a channel."
        elif self.rule in NOT_CHANNEL_RULES:
            errors["rule"] = "This rule belongs to replay plans, not a channel: silence it instead."
        if self.threshold is not None and self.rule not in THRESHOLD_RULES:
            errors["threshold"] = "Change this rule's threshold on the channel's alert fields."
        if self.threshold is not None and self.threshold < 0:
            errors["threshold"] = "Use a threshold of 0 or more."
        if self.window_s is not None and self.rule not in WINDOW_RULES:
            errors["window_s"] = "Only inflow rules count over a window."
        if self.window_s is not None and self.window_s < 15:
            errors["window_s"] = "Use a window of at least 15 s (one evaluation)."
        if errors:
            raise ValidationError(errors)

    def snapshot(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "enabled": self.enabled,
            "for_s": self.for_s,
            "threshold": self.threshold,
            "window_s": self.window_s,
        }


class Silence(models.Model):
    """Mutes notifications of matching alerts (channel and/or rule) until ``ends_at``."""

    channel = models.ForeignKey(
        Channel, on_delete=models.CASCADE, null=True, blank=True, related_name="silences"
    )
    rule = models.CharField(max_length=32, choices=RuleKey.choices, blank=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(db_index=True)
    reason = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-ends_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(channel__isnull=False) | ~Q(rule=""), name="silence_matches_something"
            )
        ]

    def __str__(self) -> str:
        return f"silence of {self.scope} until {self.ends_at:%Y-%m-%d %H:%M}"

    @property
    def scope(self) -> str:
        parts = []
        if self.channel_id:
            parts.append(self.channel.slug if self.channel else str(self.channel_id))
        if self.rule:
            parts.append(RuleKey(self.rule).label)
        return " · ".join(parts) or "everything"

    def is_active(self, now: dt.datetime) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, channel_id: int | None, rule: str) -> bool:
        if self.channel_id is not None and self.channel_id != channel_id:
            return False
        return not self.rule or self.rule == rule


class Alert(models.Model):
    """One episode of one rule on one channel or broker (see the module docstring)."""

    rule = models.CharField(max_length=32, choices=RuleKey.choices)
    key = models.CharField(max_length=100, db_index=True)
    broker = models.ForeignKey(Broker, on_delete=models.CASCADE, related_name="alerts")
    channel = models.ForeignKey(
        Channel, on_delete=models.CASCADE, null=True, blank=True, related_name="alerts"
    )
    state = models.CharField(max_length=10, choices=AlertState.choices, db_index=True)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    summary = models.CharField(max_length=300)
    value = models.FloatField(null=True, blank=True)
    # The observed value when it fired (``value`` moves with each change of state).
    fired_value = models.FloatField(null=True, blank=True)
    threshold = models.FloatField(null=True, blank=True)
    # Evidence as it was when the alert fired (and, separately, when it resolved).
    evidence = models.JSONField(default=list, blank=True)
    resolve_evidence = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True, db_index=True)
    clear_since = models.DateTimeField(null=True, blank=True)
    # The evaluation that last changed this row (steady alerts are not rewritten).
    last_evaluated_at = models.DateTimeField()
    inhibited = models.BooleanField(default=False)
    silence = models.ForeignKey(
        Silence, on_delete=models.SET_NULL, null=True, blank=True, related_name="alerts"
    )
    # True once a firing notification was queued: only then is a resolve sent.
    notified = models.BooleanField(default=False)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    ack_note = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=Q(state__in=["pending", "firing"]),
                name="alert_one_active_per_key",
            )
        ]
        indexes = [models.Index(fields=["state", "-id"], name="alert_state_id")]
        permissions = [("ack_alert", "Can acknowledge alerts")]

    def __str__(self) -> str:
        return f"{self.get_rule_display()}: {self.subject}"

    def get_absolute_url(self) -> str:
        return reverse("alerts:alert_detail", args=[self.pk])

    @property
    def subject(self) -> str:
        return self.channel.slug if self.channel_id and self.channel else self.broker.name

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def muted(self) -> bool:
        return self.inhibited or self.silence_id is not None


class EvaluatorState(models.Model):
    """A singleton: the evaluation lock row and the monotonic counters ``/metrics`` exports."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_duration_ms = models.PositiveIntegerField(null=True, blank=True)
    evaluations = models.PositiveBigIntegerField(default=0)
    alerts_fired = models.PositiveBigIntegerField(default=0)
    alerts_resolved = models.PositiveBigIntegerField(default=0)
    notifications_sent = models.PositiveBigIntegerField(default=0)
    notifications_failed = models.PositiveBigIntegerField(default=0)
    delivery_attempts = models.PositiveBigIntegerField(default=0)
    delivery_errors = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return "alert evaluator"


class DestinationKind(models.TextChoices):
    WEBHOOK = "webhook", "JSON webhook (HMAC-signed)"
    SLACK = "slack", "Slack-compatible webhook"
    EMAIL = "email", "Email"


class Destination(models.Model):
    """Where notifications go. ``url`` and ``secret`` are write-only in the admin: a Slack
    webhook URL is itself a credential, and the HMAC secret signs every webhook body."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=DestinationKind.choices)
    url = models.CharField("URL", max_length=500, blank=True)
    secret = models.CharField("signing secret", max_length=200, blank=True)
    email_to = models.CharField(
        "email recipients", max_length=500, blank=True, help_text="Comma-separated addresses."
    )
    min_severity = models.CharField(
        max_length=10, choices=Severity.choices, default=Severity.WARNING
    )
    owner_team = models.CharField(
        max_length=100,
        blank=True,
        help_text="Only channel alerts of this team (broker alerts always go). Blank: all.",
    )
    send_resolved = models.BooleanField(default=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.kind in (DestinationKind.WEBHOOK, DestinationKind.SLACK):
            if not self.url:
                errors["url"] = "A webhook needs its URL."
            elif not _is_http_url(self.url):
                errors["url"] = "Give an http:// or https:// URL with a host (and a valid port)."
        if self.kind == DestinationKind.WEBHOOK and not self.secret:
            errors["secret"] = "A JSON webhook needs a signing secret (receivers verify it)."
        if self.kind == DestinationKind.EMAIL and not self.recipients():
            errors["email_to"] = "Give at least one address."
        if errors:
            raise ValidationError(errors)

    def recipients(self) -> list[str]:
        return [a.strip() for a in self.email_to.split(",") if a.strip()]

    @property
    def target_display(self) -> str:
        """Where it goes, safe to display (no path, query or credentials)."""
        if self.kind == DestinationKind.EMAIL:
            return ", ".join(self.recipients())
        if not self.url:
            return "not configured"
        if not _is_http_url(self.url):
            return "invalid URL"
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname or ''}"

    def wants(self, alert: Alert) -> bool:
        if not self.enabled:
            return False
        if SEVERITY_RANK[Severity(alert.severity)] < SEVERITY_RANK[Severity(self.min_severity)]:
            return False
        if self.owner_team and alert.channel is not None:
            return alert.channel.owner_team == self.owner_team
        return True

    def audit_snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "url": "(set)" if self.url else "",
            "secret": "(set)" if self.secret else "",
            "email_to": self.email_to,
            "min_severity": self.min_severity,
            "owner_team": self.owner_team,
            "send_resolved": self.send_resolved,
            "enabled": self.enabled,
        }


def _is_http_url(url: str) -> bool:
    """True when the sender (httpx) can post to ``url``: http(s), a host, a valid port. Parsed
    with httpx so that what the form accepts is exactly what delivery can use."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return False
    return parsed.scheme in ("http", "https") and bool(parsed.host)


class Transition(models.TextChoices):
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


class NotificationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class Notification(models.Model):
    """One transition of one alert for one destination; sent (with others of the same broker)
    by ``alerts.notify``, retried with backoff until sent or its retry budget is spent."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    transition = models.CharField(max_length=10, choices=Transition.choices)
    destination = models.ForeignKey(
        Destination, on_delete=models.CASCADE, related_name="notifications"
    )
    group_key = models.CharField(max_length=100)
    status = models.CharField(
        max_length=10, choices=NotificationStatus.choices, default=NotificationStatus.PENDING
    )
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField()
    lease_until = models.DateTimeField(null=True, blank=True)
    batch = models.CharField(max_length=32, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alert", "transition", "destination"], name="notification_once"
            )
        ]
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="notification_due"),
        ]

    def __str__(self) -> str:
        return f"{self.transition} of alert {self.alert_id} to {self.destination_id}"


class DeliveryAttempt(models.Model):
    """One HTTP call or email: the message carrying a batch of notifications."""

    destination = models.ForeignKey(Destination, on_delete=models.CASCADE, related_name="attempts")
    batch = models.CharField(max_length=32, db_index=True)
    started_at = models.DateTimeField(db_index=True)
    duration_ms = models.PositiveIntegerField(default=0)
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    notifications = models.JSONField(default=list)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"delivery {self.batch} to {self.destination_id}: {'ok' if self.ok else 'failed'}"
