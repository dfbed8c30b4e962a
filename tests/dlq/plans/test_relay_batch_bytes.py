"""A relay batch is bounded by the bytes of its bodies as well as by its count: two batches are
held in memory while one is published and the other recorded, and 5,000 messages of a few MB
each would not fit in a worker. Every claim stops once the bodies before the next item reach
``BATCH_BYTES``, and always takes at least one item (a message larger than the budget goes
alone). Checked on each claim: first attempts from the cursor, due retries, items in doubt."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from audit.actions import Actor
from brokers.base import PublishOutcome as Outcome
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem, ReplayPlan, Status
from dlq.plans import relay, relay_items
from dlq.plans.relay_items import adopt_in_flight, take_batch
from dlq.plans.relay_outcomes import record_outcomes
from tests.conftest import make_channel
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import RecordingAdapter, plan_for

pytestmark = pytest.mark.django_db
publisher = replay_helpers.publisher  # the fixture

KB = 1000
# Bodies by position: three fit in 100 KB, a fourth would start past it; the 250 KB body is
# larger than the budget on its own and still goes (alone or last).
SIZES = [40 * KB, 40 * KB, 40 * KB, 40 * KB, 250 * KB, 10 * KB]


@pytest.fixture(autouse=True)
def budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_items, "BATCH_BYTES", 100 * KB)


def _plan(oncall: User) -> ReplayPlan:
    channel = make_channel()
    bodies = [bytes([65 + n]) * size for n, size in enumerate(SIZES)]
    entries = store(channel, *[letter(body=b, headers={"Idempotency-Key": f"k-{n}"})
                               for n, b in enumerate(bodies)])  # fmt: skip
    return plan_for(entries, oncall)


def _positions(items: list[ReplayItem]) -> list[int]:
    return [i.position for i in items]


def _claims(plan: ReplayPlan, **kwargs: bool) -> list[list[int]]:
    """Claim until nothing is left, as the relay does: what it has in flight is ``busy``."""
    batches: list[list[int]] = []
    busy: set[int] = set()
    for _ in range(len(SIZES) + 1):  # bounded: one item per claim at least
        items = take_batch(plan, 10, only_in_doubt=False, busy=busy, **kwargs)
        if not items:
            return batches
        batches.append(_positions(items))
        busy |= {i.pk for i in items}
    raise AssertionError(f"claims did not end: {batches}")


def test_first_attempts_stop_at_the_budget_and_take_at_least_one(oncall: User) -> None:
    plan = _plan(oncall)
    # 0+40+40 = 80 KB before the third: taken; 120 KB before the fourth: the next batch. The
    # 250 KB body starts the third batch with 40 KB before it, so it goes with the fourth.
    assert _claims(plan) == [[0, 1, 2], [3, 4], [5]]
    plan.refresh_from_db()
    assert (plan.claimed_through, plan.sent) == (6, 6)


def test_a_body_larger_than_the_budget_goes_alone(
    oncall: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_items, "BATCH_BYTES", 30 * KB)
    plan = _plan(oncall)
    assert _claims(plan) == [[0], [1], [2], [3], [4], [5]]


def test_due_retries_stop_at_the_budget(oncall: User) -> None:
    plan = _plan(oncall)
    taken = [i for _ in range(3) for i in take_batch(plan, 10, only_in_doubt=False)]
    assert len(taken) == len(SIZES)
    refused = [Outcome(str(i.pk), False, "nack", refused=True) for i in taken]
    record_outcomes(plan, taken, refused, Actor.system("t"))
    ReplayItem.objects.filter(plan=plan).update(next_attempt_at=None)  # due now
    assert _claims(plan, doubt=False) == [[0, 1, 2], [3, 4], [5]]
    assert set(ReplayItem.objects.values_list("status", flat=True)) == {ItemStatus.SENDING}


def test_items_in_doubt_stop_at_the_budget(oncall: User) -> None:
    plan = _plan(oncall)
    for _ in range(3):
        take_batch(plan, 10, only_in_doubt=False)  # published, then the run died
    assert adopt_in_flight(plan) == len(SIZES)
    assert _claims(plan) == [[0, 1, 2], [3, 4], [5]]


def test_a_plan_of_large_messages_is_replayed_whole_in_bounded_batches(
    oncall: User, publisher: RecordingAdapter
) -> None:
    sizes: list[int] = []
    original = replay_helpers.RecordingPublisher.publish

    def publish(self, messages):  # type: ignore[no-untyped-def]
        sizes.append(sum(len(m.body) for m in messages))
        return original(self, messages)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_helpers.RecordingPublisher, "publish", publish)
        plan = _plan(oncall)
        assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    assert sorted(len(m.body) for _, m in publisher.sent) == sorted(SIZES)
    assert sizes == [120 * KB, 290 * KB, 10 * KB]  # each batch: under 100 KB before its last
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}
