"""A recording publisher for relay tests without a broker, and plan helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from audit.actions import Actor
from brokers.base import (
    Address,
    BrokerAdapter,
    BrokerError,
    DrainSession,
    OutgoingMessage,
    Publisher,
)
from brokers.base import PublishOutcome as Outcome
from dlq.capture import adapters
from dlq.models import DeadLetter, PlanStatus, ReplayPlan
from dlq.models.plans import OUTCOME_ACTION, OUTCOME_FIELDS
from dlq.plans import freeze, relay, relay_outcomes
from dlq.plans.actions import do_create_plan
from dlq.plans.preview import Selection
from dlq.triage.filters import EntryFilter

Policy = Callable[[OutgoingMessage, int], Outcome]


class RecordingPublisher(Publisher):
    def __init__(self, adapter: RecordingAdapter, target: Address) -> None:
        self.adapter, self.target = adapter, target

    def publish(self, messages: Sequence[OutgoingMessage]) -> list[Outcome]:
        outcomes = []
        for message in messages:
            self.adapter.sent.append((self.target, message))
            n = sum(1 for _, m in self.adapter.sent if m.key == message.key)
            outcomes.append(self.adapter.policy(message, n))
        self.adapter.unhooked.append(messages)
        return outcomes

    def close(self) -> None:
        return None


class RecordingAdapter(BrokerAdapter):
    kind = "fake"

    def __init__(self) -> None:
        super().__init__("fake://")
        self.sent: list[tuple[Address, OutgoingMessage]] = []
        self.policy: Policy = lambda m, n: Outcome(m.key, True)
        # Side effects of a publish (a consumer dead-letters the message again). They run on
        # the relay's own thread when the batch's outcomes are recorded, not on the publisher
        # thread: the test database connection is not shared across threads.
        self.after_publish: list[Callable[[Sequence[OutgoingMessage]], None]] = []
        self.unhooked: list[Sequence[OutgoingMessage]] = []
        self.unreachable = 0

    def run_hooks(self) -> None:
        while self.unhooked:
            messages = self.unhooked.pop(0)
            for hook in self.after_publish:
                hook(messages)

    def ping(self) -> None:
        return None

    def poll(self, addresses: Sequence[Address]) -> Any:
        raise NotImplementedError

    def inspect(self, addresses: Sequence[Address]) -> Any:
        raise NotImplementedError

    def open_drain(self, address: Address) -> DrainSession:
        raise NotImplementedError

    def open_publisher(self, target: Address) -> Publisher:
        if self.unreachable > 0:  # the broker is down for this many more connection attempts
            self.unreachable -= 1
            raise BrokerError("connection refused", connection_lost=True)
        return RecordingPublisher(self, target)


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingAdapter]:
    adapter = RecordingAdapter()
    monkeypatch.setattr(adapters, "adapter_for", lambda channel: adapter)
    monkeypatch.setattr(relay_outcomes, "backoff", lambda attempt: 0.0)
    record_outcomes = relay.record_outcomes

    def hooked(*args: Any, **kwargs: Any) -> tuple[int, int]:
        adapter.run_hooks()
        return record_outcomes(*args, **kwargs)

    monkeypatch.setattr(relay, "record_outcomes", hooked)
    yield adapter


def plan_for(
    entries: list[DeadLetter], user: Any, kind: str = "replay", **options: Any
) -> ReplayPlan:
    selection = Selection(EntryFilter(), [e.pk for e in entries])
    options.setdefault("reason", "fixed the consumer")
    options.setdefault("velocity", None)
    plan, created = do_create_plan(
        kind, selection, DeadLetter.objects.all(), actor=Actor.for_user(user), **options
    )
    assert created
    if plan.status == PlanStatus.FREEZING:  # a large selection: the background job's part
        plan = freeze.freeze_to_end(plan.pk)
    return plan


def recorded_outcomes(outcome: str | None = None) -> list[dict[str, Any]]:
    """Every message outcome the relay batches' audit records list (``OUTCOME_FIELDS`` each,
    plus the record's ``event``), oldest record first; ``outcome``: only those."""
    from audit.models import AuditEvent

    rows = []
    for event in AuditEvent.objects.filter(action=OUTCOME_ACTION).order_by("id"):
        after = event.after
        assert isinstance(after, dict) and after["fields"] == list(OUTCOME_FIELDS)
        for message in after["messages"]:
            row = dict(zip(OUTCOME_FIELDS, message, strict=True), event=event)
            if outcome is None or row["outcome"] == outcome:
                rows.append(row)
    return rows
