"""What a replay sends and where: the outgoing message (original headers minus the broker's
death bookkeeping, plus ``x-dlq-replay-id``), the publishers per target address, (the
lineage of a replay that dead-lettered again is ``dlq.capture.lineage``)."""

from __future__ import annotations

import json
import logging
from typing import Any

from brokers.base import Address, BrokerError, OutgoingMessage, Publisher, PublishOutcome
from channels_registry.models import BrokerKind
from dlq.capture import adapters
from dlq.models import DeadLetter, ReplayItem, ReplayPlan
from dlq.models.plans import REPLAY_ID_HEADER

log = logging.getLogger(__name__)


# Headers the broker adds when it dead-letters a message: they describe the old death, and a
# replay that carried them would look dead already (and forged ones must change nothing).
DEATH_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")


# ActiveMQ's: the cause it wrote when it dead-lettered, and the expiry it cleared to do so.
DEATH_HEADERS = {"x-death", REPLAY_ID_HEADER, "dlqdeliveryfailurecause", "originalexpiration"}


# The same headers as the brokers spell them, which the relay's claim drops from the stored
# headers in the database (``dlq.plans.relay_items``): ``x-death`` is the largest header of a
# RabbitMQ dead letter, and decoding it only to drop it was the relay's largest Python cost.
# Only a saving: ``replay_headers`` still drops every spelling.
STORED_DEATH_HEADERS = (
    "x-death",
    REPLAY_ID_HEADER,
    *(f"x-{end}-death-{part}" for end in ("first", "last")
      for part in ("queue", "reason", "exchange")),
    "dlqDeliveryFailureCause",
    "originalExpiration",
)  # fmt: skip


def _header_value(value: Any) -> Any:
    """Stored JSON-safe header values back to what the broker had: ``{"$bytes": hex}`` → bytes."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"} and isinstance(value["$bytes"], str):
            try:
                return bytes.fromhex(value["$bytes"])
            except ValueError:
                return value
        return {k: _header_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_header_value(v) for v in value]
    return value


def replay_headers(headers: dict[str, Any], replay_id: str) -> dict[str, Any]:
    """Original headers minus the death bookkeeping, plus ``x-dlq-replay-id``. Everything
    else (the idempotency key first of all) is kept exactly."""
    kept = {}
    for k, v in (headers or {}).items():
        low = k.lower()
        if low in DEATH_HEADERS or low.startswith(DEATH_HEADER_PREFIXES):
            continue
        kept[k] = _header_value(v) if isinstance(v, dict | list) else v
    kept[REPLAY_ID_HEADER] = replay_id
    return kept


def outgoing(
    body: bytes | memoryview | None,
    headers: dict[str, Any] | None,
    properties: dict[str, Any] | None,
    item: ReplayItem,
) -> OutgoingMessage:
    """The message for one attempt of ``item``, from its entry's stored columns."""
    return OutgoingMessage(
        key=str(item.pk),
        body=bytes(body or b""),
        headers=replay_headers(headers or {}, item.replay_id),
        properties={
            k: v for k, v in (properties or {}).items() if k not in ("headers", "delivery_mode")
        },
    )


class Publishers:
    """Open publishers per target address, reopened after a connection loss. NATS messages go
    to the subject their stream stored them under (broker metadata, never a header)."""

    def __init__(self, plan: ReplayPlan) -> None:
        self.plan = plan
        self.adapter = adapters.adapter_for(plan.channel)
        self.nats = plan.channel.broker.kind == BrokerKind.NATS
        self.open: dict[Address, Publisher] = {}

    def target_for(self, properties: dict[str, Any] | None) -> Address:
        """Where one entry goes, from its stored broker properties."""
        base = Address(self.plan.target_name, self.plan.target_group)
        if self.nats:
            subject = (properties or {}).get("subject")
            stream = (properties or {}).get("stream")
            if isinstance(subject, str) and subject and stream == self.plan.target_name:
                return Address(subject)
        return base

    def send(
        self, items: list[ReplayItem], stored: dict[int, tuple[Any, Any, Any]]
    ) -> list[PublishOutcome]:
        """Build the items' messages (``outgoing_batch``) and publish them: the publisher
        thread's part of step 3."""
        return self.publish(outgoing_batch(self, items, stored))

    def publish(self, batch: list[tuple[Address, OutgoingMessage]]) -> list[PublishOutcome]:
        """Publish per target. A session the adapter reports lost (``connection_lost`` on an
        outcome, or any ``BrokerError`` from opening or publishing: the session is unusable)
        is closed and reopened next time; the targets after it are not tried in this batch."""
        groups: dict[Address, list[OutgoingMessage]] = {}
        for target, message in batch:
            groups.setdefault(target, []).append(message)
        outcomes: list[PublishOutcome] = []
        lost = ""
        for target, messages in groups.items():
            if lost:
                outcomes.extend(PublishOutcome.lost(m.key, f"not sent: {lost}") for m in messages)
                continue
            try:
                publisher = self.open.get(target)
                if publisher is None:
                    publisher = self.open[target] = self.adapter.open_publisher(target)
                result = publisher.publish(messages)
            except BrokerError as exc:
                result = [PublishOutcome.lost(m.key, f"broker error: {exc}") for m in messages]
            first_lost = next((o for o in result if o.connection_lost), None)
            if first_lost is not None:
                lost = first_lost.reason
                self.drop(target)
            outcomes.extend(result)
        return outcomes

    def probe(self) -> str | None:
        """Open (and close) a publisher to the plan's target: None when the broker answers,
        else why not."""
        try:
            publisher = self.adapter.open_publisher(
                Address(self.plan.target_name, self.plan.target_group)
            )
        except BrokerError as exc:
            return str(exc)
        except Exception as exc:  # an adapter bug must not end the wait in a traceback loop
            return f"{type(exc).__name__}: {exc}"
        try:
            publisher.close()
        except Exception:  # the broker answered; a failing close changes nothing
            log.debug("closing the probe publisher failed", exc_info=True)
        return None

    def drop(self, target: Address) -> None:
        publisher = self.open.pop(target, None)
        if publisher is not None:
            try:
                publisher.close()
            except Exception:  # closing a broken session must not hide the outcome
                log.debug("closing publisher failed", exc_info=True)

    def close(self) -> None:
        for target in list(self.open):
            self.drop(target)


def stored_columns(items: list[ReplayItem]) -> dict[int, tuple[Any, Any, Any]]:
    """The columns step 3's messages need for the items whose claim did not return them (one
    query per batch, no model instances), by entry id. On the relay's database thread."""
    missing = [i.entry_id for i in items if "_columns" not in i.__dict__]
    if not missing:
        return {}
    rows = DeadLetter.objects.filter(pk__any=missing).values_list(
        "id", "body", "headers", "properties"
    )
    return {pk: (body, headers, properties) for pk, body, headers, properties in rows}


def outgoing_batch(
    publishers: Publishers, items: list[ReplayItem], stored: dict[int, tuple[Any, Any, Any]]
) -> list[tuple[Address, OutgoingMessage]]:
    """Step 3's messages, bodies read once per attempt: returned by the claim itself
    (``_columns``: the stored JSON still as text, decoded here), else by ``stored_columns``.
    Touches no database, so that it runs on the publisher thread, beside the outcomes the
    relay's thread is recording."""
    batch = []
    for item in items:
        columns = item.__dict__.get("_columns")
        if columns is None:
            body, headers, properties = stored[item.entry_id]
        else:
            body, headers, properties = columns[0], _json(columns[1]), _json(columns[2])
        batch.append((publishers.target_for(properties), outgoing(body, headers, properties, item)))
    return batch


def _json(value: Any) -> Any:
    """A stored JSON column as a raw query returns it (text), decoded."""
    return json.loads(value) if isinstance(value, str) else value
