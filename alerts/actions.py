"""State changes of alerts made by people: acknowledge, silence, and registry admins' rule
overrides and destinations. Each is atomic and audited in the same transaction.

Evaluation (``alerts.evaluate``) and delivery (``alerts.notify``) live in their topic modules:
they are system work spanning many rows (delivery also a network call outside any
transaction), which does not fit the one-atomic-block shape of these.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from alerts.models import Alert, Destination, RuleKey, RuleOverride, Silence
from audit.actions import Actor, record
from channels_registry.models import Channel

MAX_SILENCE = dt.timedelta(days=7)


@transaction.atomic
def do_acknowledge_alert(alert_id: int, *, actor: Actor, note: str = "") -> Alert:
    """Mark an active alert as seen by someone. Idempotent: a second ack keeps the first."""
    alert = (
        Alert.objects.select_for_update(of=("self",))
        .select_related("channel", "broker")
        .get(pk=alert_id)
    )
    if not alert.is_active:
        raise ValidationError("Only a pending or firing alert can be acknowledged.")
    if alert.acknowledged_at is not None:
        return alert
    alert.acknowledged_at = timezone.now()
    alert.acknowledged_by_id = actor.user_id
    alert.ack_note = note.strip()[:2000]
    alert.save(update_fields=["acknowledged_at", "acknowledged_by", "ack_note"])
    record(
        "alert.acknowledge",
        actor=actor,
        target=alert,
        channel_slug=alert.channel.slug if alert.channel else "",
        reason=alert.ack_note,
        after={"rule": alert.rule, "state": alert.state, "summary": alert.summary},
    )
    return alert


@transaction.atomic
def do_create_silence(
    *,
    actor: Actor,
    channel: Channel | None,
    rule: str,
    duration: dt.timedelta,
    reason: str,
    now: dt.datetime | None = None,
) -> Silence:
    """Mute notifications of the channel's alerts (of one rule, or all) for ``duration``.
    The next evaluation applies it; alerts keep being evaluated and shown."""
    now = now or timezone.now()
    if not reason.strip():
        raise ValidationError("Say why: a silence needs a reason.")
    if channel is None and not rule:
        raise ValidationError("Silence a channel, a rule, or both — not everything.")
    if rule and rule not in RuleKey.values:
        raise ValidationError("Unknown rule.")
    if not dt.timedelta(minutes=1) <= duration <= MAX_SILENCE:
        raise ValidationError("A silence lasts between 1 minute and 7 days.")
    silence = Silence.objects.create(
        channel=channel,
        rule=rule,
        starts_at=now,
        ends_at=now + duration,
        reason=reason.strip(),
        created_by_id=actor.user_id,
    )
    record(
        "alert.silence",
        actor=actor,
        target=silence,
        channel_slug=channel.slug if channel else "",
        reason=silence.reason,
        after={
            "channel": channel.slug if channel else None,
            "rule": rule or None,
            "starts_at": silence.starts_at,
            "ends_at": silence.ends_at,
        },
    )
    return silence


@transaction.atomic
def do_expire_silence(silence_id: int, *, actor: Actor, reason: str = "") -> Silence:
    silence = (
        Silence.objects.select_for_update(of=("self",)).select_related("channel").get(pk=silence_id)
    )
    now = timezone.now()
    if silence.ends_at <= now:
        return silence
    before = {"ends_at": silence.ends_at}
    silence.ends_at = now
    silence.save(update_fields=["ends_at"])
    record(
        "alert.silence.expire",
        actor=actor,
        target=silence,
        channel_slug=silence.channel.slug if silence.channel else "",
        reason=reason,
        before=before,
        after={"ends_at": silence.ends_at},
    )
    return silence


def override_snapshot(channel: Channel) -> dict[str, Any]:
    return {o.rule: o.snapshot() for o in RuleOverride.objects.filter(channel=channel)}


@transaction.atomic
def do_record_rule_overrides(
    channel: Channel, *, actor: Actor, before: dict[str, Any]
) -> dict[str, Any]:
    """After the admin saved a channel's rule overrides: rerun the declaration checks (a
    disabled DLQ alert is a finding) and audit the change when there is one."""
    from channels_registry.actions import refresh_findings

    after = override_snapshot(channel)
    refresh_findings(channel)
    Channel.objects.filter(pk=channel.pk).update(
        findings=channel.findings,
        error_count=channel.error_count,
        warning_count=channel.warning_count,
    )
    if after != before:
        record(
            "registry.channel.alert_rules",
            actor=actor,
            target=channel,
            channel_slug=channel.slug,
            before=before,
            after=after,
        )
    return after


@transaction.atomic
def do_save_destination(
    destination: Destination, *, actor: Actor, before: dict[str, Any] | None
) -> Destination:
    destination.full_clean()
    destination.save()
    record(
        "alert.destination.create" if before is None else "alert.destination.update",
        actor=actor,
        target=destination,
        before=before,
        after=destination.audit_snapshot(),
    )
    return destination


@transaction.atomic
def do_delete_destination(destination: Destination, *, actor: Actor) -> None:
    snapshot = destination.audit_snapshot()
    target_id, target_repr = str(destination.pk), str(destination)
    destination.delete()
    record(
        "alert.destination.delete",
        actor=actor,
        target_type="alerts.destination",
        target_id=target_id,
        target_repr=target_repr,
        before=snapshot,
    )


# The system's own actions, in their topic modules (see the module docstring).
from alerts.evaluate import do_evaluate_alerts  # noqa: E402, F401
from alerts.notify import do_deliver_notifications  # noqa: E402, F401
