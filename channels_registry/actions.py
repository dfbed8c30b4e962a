"""State changes of the registry: every save and delete is atomic and audited."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import F, Q

from audit.actions import Actor, record
from channels_registry.checks import ERROR, check_channel
from channels_registry.models import Broker, Channel, ChannelHealth, MessageSchema


def refresh_findings(channel: Channel) -> None:
    """Recompute the declaration checks into the cached fields (no save)."""
    findings = check_channel(channel)
    channel.findings = [f.as_dict() for f in findings]
    channel.error_count = sum(1 for f in findings if f.severity == ERROR)
    channel.warning_count = len(findings) - channel.error_count


@transaction.atomic
def do_save_broker(broker: Broker, *, actor: Actor, before: dict[str, Any] | None) -> Broker:
    """Create or update a broker; ``before`` is its snapshot before the edit (None: new)."""
    broker.full_clean()
    broker.save()
    # A new poll interval moves the moment its channels' health turns stale on the board.
    ChannelHealth.objects.filter(channel__broker=broker, updated_at__isnull=False).update(
        stale_at=F("updated_at") + dt.timedelta(seconds=broker.stale_after_s)
    )
    record(
        "registry.broker.create" if before is None else "registry.broker.update",
        actor=actor,
        target=broker,
        before=before,
        after=broker.audit_snapshot(),
    )
    return broker


@transaction.atomic
def do_delete_broker(broker: Broker, *, actor: Actor, reason: str = "") -> None:
    snapshot = broker.audit_snapshot()
    target_id, target_repr = str(broker.pk), str(broker)
    broker.delete()
    record(
        "registry.broker.delete",
        actor=actor,
        target_type="channels_registry.broker",
        target_id=target_id,
        target_repr=target_repr,
        reason=reason,
        before=snapshot,
    )


@transaction.atomic
def do_save_channel(channel: Channel, *, actor: Actor, before: dict[str, Any] | None) -> Channel:
    """Create or update a channel declaration and rerun its checks."""
    channel.full_clean()
    refresh_findings(channel)
    channel.save()
    _refresh_sharers(channel, before)
    # A renamed channel keeps its place on the board (sorted by the name its health row keeps).
    ChannelHealth.objects.filter(channel=channel).update(sort_name=channel.name.lower()[:200])
    record(
        "registry.channel.create" if before is None else "registry.channel.update",
        actor=actor,
        target=channel,
        channel_slug=channel.slug,
        before=before,
        after={**channel.audit_snapshot(), "findings": [f["code"] for f in channel.findings]},
    )
    return channel


def _refresh_sharers(channel: Channel, before: dict[str, Any] | None) -> None:
    """The cached findings of the channels declaring a dead-letter address this one declares
    or declared (``dlq-shared-by-channels`` on them changes with this save or delete)."""
    earlier = before or {}
    candidates = (
        channel.dlq_address,
        channel.poison_address,
        earlier.get("dlq_address"),
        earlier.get("poison_address"),
    )
    names = {str(name) for name in candidates if name}
    if not names or not channel.broker_id:
        return
    sharers = (
        Channel.objects.filter(broker_id=channel.broker_id)
        .filter(Q(dlq_address__in=names) | Q(poison_address__in=names))
        .exclude(pk=channel.pk)
        .select_related("broker")
    )
    for other in sharers[:100]:  # bounded: a DLQ declared by more is a finding of its own
        refresh_findings(other)
        Channel.objects.filter(pk=other.pk).update(
            findings=other.findings,
            error_count=other.error_count,
            warning_count=other.warning_count,
        )


@transaction.atomic
def do_delete_channel(channel: Channel, *, actor: Actor, reason: str = "") -> None:
    snapshot = channel.audit_snapshot()
    target_id, target_repr, slug = str(channel.pk), str(channel), channel.slug
    channel.delete()
    channel.pk = None
    _refresh_sharers(channel, snapshot)
    record(
        "registry.channel.delete",
        actor=actor,
        target_type="channels_registry.channel",
        target_id=target_id,
        target_repr=target_repr,
        channel_slug=slug,
        reason=reason,
        before=snapshot,
    )


class SchemaRejected(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@transaction.atomic
def do_register_schema(
    schema: MessageSchema, *, actor: Actor, before: dict[str, Any] | None = None
) -> MessageSchema:
    """Register (or edit) one version of a message schema. Refused with ``SchemaRejected``
    when it is not a JSON Schema or breaks the compatibility mode declared by the channels that
    use the name (see ``schemas.registration_problems``)."""
    from channels_registry.schemas import registration_problems

    problems = registration_problems(schema)
    if problems:
        raise SchemaRejected(problems)
    schema.save()
    record(
        "registry.schema.register" if before is None else "registry.schema.update",
        actor=actor,
        target=schema,
        before=before,
        after=schema.audit_snapshot(),
    )
    return schema


# Polling's action lives in its topic module: it spans two short transactions around a network
# call, which does not fit the one-atomic-block shape of the actions above.
from channels_registry.polling import do_poll_broker  # noqa: E402, F401
