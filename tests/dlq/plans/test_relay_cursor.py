"""First attempts are taken by the plan's cursor (issue 24, decision 3): the freeze writes each
item's first replay id, a claim reads the items and moves the cursor without writing them, and
the item is written once, with its outcome. What a claim leaves in flight is never cancelled
under the relay, and what a run that is gone left in flight goes out again with the same ids."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import connection

from audit.actions import Actor
from brokers.base import PublishOutcome as Outcome
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem, ReplayPlan, Status
from dlq.plans import relay
from dlq.plans.actions import do_cancel_plan, do_pause_plan
from dlq.plans.relay_items import claim_plan, orphaned_plans, release_lease, take_batch
from dlq.plans.relay_outcomes import record_outcomes
from tests.conftest import client_for, make_channel
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import RecordingAdapter, plan_for

pytestmark = pytest.mark.django_db
publisher = replay_helpers.publisher  # the fixture


def _plan(oncall: User, n: int, **channel_fields: Any) -> ReplayPlan:
    channel = make_channel(**channel_fields)
    entries = store(channel, *[letter(headers={"Idempotency-Key": f"k-{i}"}) for i in range(n)])
    return plan_for(entries, oncall)


def _items(plan: ReplayPlan) -> list[ReplayItem]:
    return list(ReplayItem.objects.filter(plan=plan).order_by("position"))


def _versions(plan: ReplayPlan) -> dict[int, tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, ctid::text, xmin::text FROM dlq_replayitem WHERE plan_id = %s", [plan.pk]
        )
        return {pk: (ctid, xmin) for pk, ctid, xmin in cursor.fetchall()}


def _ids(sent: list[Any]) -> list[str]:
    return [m.headers["x-dlq-replay-id"] for _, m in sent]


def test_the_freeze_gives_each_item_the_replay_id_of_its_first_attempt(oncall: User) -> None:
    plan = _plan(oncall, 3)
    assert [i.replay_id for i in _items(plan)] == [f"{plan.pk}:{i.pk}:1" for i in _items(plan)]
    assert plan.claimed_through == 0


def test_a_claim_moves_the_cursor_and_writes_no_item(oncall: User) -> None:
    plan = _plan(oncall, 5)
    before = _versions(plan) if connection.vendor == "postgresql" else {}
    taken = take_batch(plan, 2, only_in_doubt=False)
    assert [i.position for i in taken] == [0, 1]
    assert [i.replay_id for i in taken] == [f"{plan.pk}:{i.pk}:1" for i in taken]
    plan.refresh_from_db()
    assert (plan.claimed_through, plan.sent, plan.sent_entries) == (2, 2, 2)
    # The item rows are as the freeze wrote them: not updated, not even locked.
    untouched = {(ItemStatus.PENDING, 0, 0)}
    assert {(i.status, i.attempts, i.publishes) for i in _items(plan)} == untouched
    if connection.vendor == "postgresql":
        assert _versions(plan) == before
    # The next claim goes on from the cursor.
    assert [i.position for i in take_batch(plan, 10, only_in_doubt=False)] == [2, 3, 4]


def test_the_outcome_is_the_items_one_write(oncall: User) -> None:
    plan = _plan(oncall, 2)
    taken = take_batch(plan, 10, only_in_doubt=False)
    record_outcomes(plan, taken, [Outcome(str(i.pk), True) for i in taken], Actor.system("t"))
    for item in _items(plan):
        assert (item.status, item.attempts, item.publishes) == (ItemStatus.CONFIRMED, 1, 1)
        assert item.replay_id == f"{plan.pk}:{item.pk}:1" and item.outcome_event_id is not None
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}


def test_a_cancel_leaves_the_batch_in_flight_to_its_outcome(oncall: User) -> None:
    plan = _plan(oncall, 5)
    taken = take_batch(plan, 2, only_in_doubt=False)  # published, outcome not yet recorded
    do_cancel_plan(plan.pk, actor=Actor.for_user(oncall), reason="wrong fix")
    plan.refresh_from_db()
    assert plan.status == PlanStatus.CANCELLED and plan.cancelled == 3
    record_outcomes(plan, taken, [Outcome(str(i.pk), True) for i in taken], Actor.system("t"))
    statuses = [i.status for i in _items(plan)]
    assert statuses == [ItemStatus.CONFIRMED] * 2 + [ItemStatus.CANCELLED] * 3
    by_entry = dict(DeadLetter.objects.values_list("pk", "state__status"))
    assert [by_entry[i.entry_id] for i in _items(plan)] == [Status.REPLAYED] * 2 + [Status.NEW] * 3


def test_a_refused_first_attempt_is_written_with_its_attempt_and_retried(
    oncall: User,
) -> None:
    plan = _plan(oncall, 1)
    taken = take_batch(plan, 10, only_in_doubt=False)
    record_outcomes(plan, taken, [Outcome(str(taken[0].pk), False, "nack", refused=True)],
                    Actor.system("t"))  # fmt: skip
    [item] = _items(plan)
    assert (item.status, item.attempts, item.publishes) == (ItemStatus.PENDING, 1, 1)
    assert item.replay_id == "" and item.next_attempt_at is not None  # a new id next time


def test_first_attempts_a_crashed_run_left_in_flight_go_out_again_with_their_ids(
    oncall: User, publisher: RecordingAdapter
) -> None:
    plan = _plan(oncall, 4)
    crashed = take_batch(plan, 2, only_in_doubt=False)  # published, then the run died
    first_ids = [i.replay_id for i in crashed]
    assert orphaned_plans() == [plan.pk]
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    # In doubt first, with the ids they had; then the rest, each once.
    assert _ids(publisher.sent)[:2] == first_ids
    assert sorted(_ids(publisher.sent)[2:]) == sorted(i.replay_id for i in _items(plan)[2:])
    plan.refresh_from_db()
    assert (plan.sent, plan.sent_entries, plan.maybe_twice, plan.confirmed) == (6, 4, 2, 4)
    for item in _items(plan):
        assert item.status == ItemStatus.CONFIRMED and item.attempts == 1
        assert item.publishes == (2 if item.replay_id in first_ids else 1)
        assert item.republished == (item.replay_id in first_ids)
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}


def test_a_stopped_plan_with_first_attempts_in_flight_is_still_a_relays_work(
    oncall: User, publisher: RecordingAdapter
) -> None:
    plan = _plan(oncall, 3)
    crashed = take_batch(plan, 1, only_in_doubt=False)
    do_pause_plan(plan.pk, actor=Actor.for_user(oncall), reason="look")
    assert orphaned_plans() == [plan.pk]
    assert claim_plan(plan.pk, "someone")
    release_lease(plan.pk, "someone")
    assert relay.run_plan(plan.pk).status == PlanStatus.PAUSED
    assert _ids(publisher.sent) == [crashed[0].replay_id]  # the one in doubt, nothing new
    assert [i.status for i in _items(plan)] == [ItemStatus.CONFIRMED] + [ItemStatus.PENDING] * 2
    assert orphaned_plans() == []


def test_the_migration_puts_a_running_plans_cursor_past_what_it_published(
    oncall: User,
) -> None:
    plan = _plan(oncall, 5)
    # As the relay before the cursor left it: the first three claimed (one still in doubt).
    items = _items(plan)
    ReplayItem.objects.filter(pk__in=[i.pk for i in items[:2]]).update(
        status=ItemStatus.CONFIRMED, attempts=1, publishes=1
    )
    ReplayItem.objects.filter(pk=items[2].pk).update(
        status=ItemStatus.SENDING, attempts=1, publishes=1
    )
    ReplayItem.objects.filter(pk__in=[i.pk for i in items[3:]]).update(replay_id="")
    done = _plan(oncall, 1, name="Other", slug="other", address="other")
    ReplayPlan.objects.filter(pk=done.pk).update(status=PlanStatus.DONE)
    migration = importlib.import_module("dlq.migrations.0016_relay_cursor")
    migration.place_cursors(apps, None)
    assert ReplayPlan.objects.get(pk=plan.pk).claimed_through == 3
    assert ReplayPlan.objects.get(pk=done.pk).claimed_through == 0
    # The item in doubt first, then the two never sent, the id computed for them.
    plan.refresh_from_db()
    assert [i.pk for i in take_batch(plan, 10, only_in_doubt=False)] == [items[2].pk]
    fresh = take_batch(plan, 10, only_in_doubt=False, doubt=False)
    assert [i.replay_id for i in fresh] == [f"{plan.pk}:{i.pk}:1" for i in items[3:]]
    # Their outcome stores the id they went out with.
    record_outcomes(plan, fresh, [Outcome(str(i.pk), True) for i in fresh], Actor.system("t"))
    assert [i.replay_id for i in _items(plan)[3:]] == [f"{plan.pk}:{i.pk}:1" for i in items[3:]]


def test_the_death_headers_are_dropped_in_any_spelling(
    oncall: User, publisher: RecordingAdapter
) -> None:
    """The claim drops the brokers' spellings in the database (``STORED_DEATH_HEADERS``);
    the message drops every other spelling of them, and keeps the rest exactly."""
    channel = make_channel()
    headers = {
        "x-death": [{"queue": "orders", "count": 3}],
        "X-Death": [{"queue": "forged"}],
        "x-first-death-queue": "orders",
        "X-Last-Death-Reason": "expired",
        "dlqDeliveryFailureCause": "poison",
        "x-dlq-replay-id": "9:9:9",
        "Idempotency-Key": "k-1",
        "x-tenant": ["a", {"b": 1}],
    }
    entries = store(channel, letter(headers=headers))
    plan = plan_for(entries, oncall)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    [(_, sent)] = publisher.sent
    item = _items(plan)[0]
    assert sent.headers == {
        "Idempotency-Key": "k-1",
        "x-tenant": ["a", {"b": 1}],
        "x-dlq-replay-id": f"{plan.pk}:{item.pk}:1",
    }


def test_pages_say_sending_for_a_first_attempt_in_flight(oncall: User) -> None:
    plan = _plan(oncall, 2)
    [taken] = take_batch(plan, 1, only_in_doubt=False)
    first, second = _items(plan)
    assert (first.in_flight, second.in_flight) == (True, False)
    client = client_for(oncall)
    page = client.get(plan.get_absolute_url()).content.decode()
    assert f"#{first.entry_id}</a></td><td>Sending</td>" in page
    assert f"#{second.entry_id}</a></td><td>Pending</td>" in page
    entry_page = client.get(f"/dead-letters/{taken.entry_id}/").content.decode()
    assert "<td>Sending</td>" in entry_page and "<td>Pending</td>" not in entry_page
    # Recorded, it is what its row says.
    record_outcomes(plan, [taken], [Outcome(str(taken.pk), True)], Actor.system("t"))
    page = client.get(plan.get_absolute_url()).content.decode()
    assert f"#{first.entry_id}</a></td><td>Confirmed</td>" in page
