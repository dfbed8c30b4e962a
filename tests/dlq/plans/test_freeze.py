"""Freezing a plan in the background, in chunks (``dlq.plans.freeze``): replay order, the id bound,
resuming after a crash, cancel and approval while freezing, the relay keeping off, progress on
the plan page and in the API, and other writers never waiting for a chunk."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from audit.actions import Actor, record
from audit.models import AuditEvent
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem, ReplayPlan, Status
from dlq.plans import freeze, relay
from dlq.plans.actions import PlanRefused, do_approve_plan, do_cancel_plan, do_create_plan
from dlq.plans.preview import Selection, ids_digest
from dlq.plans.relay_items import orphaned_plans
from dlq.triage.filters import EntryFilter
from dlq.triage.views import entry_history
from tests.conftest import client_for, make_channel, make_user
from tests.dlq.conftest import letter, store, update_entries

HOSTILE_REASON = 'fixed <img src=x onerror=alert(1)> "quoted"'

pytestmark = pytest.mark.django_db


@pytest.fixture
def small(settings: Any) -> Any:
    """Anything above 2 entries frozen in the background, 3 per chunk, no second person.
    (Through the ``settings`` fixture only: mixed with ``override_settings`` its teardown
    would restore the overridden values for the tests that follow.)"""
    settings.DLO_FREEZE_INLINE, settings.DLO_FREEZE_CHUNK = 2, 3
    settings.DLO_FOUR_EYES_THRESHOLD = 100
    return settings


SMALL = pytest.mark.usefixtures("small")


def _entries(n: int = 10, channel: Any = None) -> list[DeadLetter]:
    """``n`` entries whose dead-letter times run opposite to their ids (replay order is
    dead-letter order, so a walk by id alone would freeze them in the wrong order)."""
    channel = channel or make_channel()
    base = 1_700_000_000.0
    return store(channel, *[letter(dead_lettered_at=base + (n - i) * 60) for i in range(n)])


def _replay_order(entries: list[DeadLetter]) -> list[int]:
    return [e.pk for e in sorted(entries, key=lambda e: (e.dead_lettered_at, e.pk))]


def _create(user: User, kind: str = "replay", channel: str = "orders", **options: Any) -> Any:
    plan, created = do_create_plan(
        kind, Selection(EntryFilter(channel=channel)), DeadLetter.objects.all(),
        actor=Actor.for_user(user, "192.0.2.7"), reason="consumer fixed", **options,
    )  # fmt: skip
    assert created
    return plan


def _positions(plan: ReplayPlan) -> list[int]:
    return list(plan.items.order_by("position").values_list("entry_id", flat=True))


@SMALL
def test_a_large_selection_is_frozen_in_the_background_in_chunks_in_replay_order(
    oncall: User,
) -> None:
    entries = _entries(10)
    plan = _create(oncall)
    assert plan.status == PlanStatus.FREEZING and plan.total == 10 and plan.frozen == 0
    assert not plan.items.exists()  # the request froze nothing itself
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.NEW}
    [created] = AuditEvent.objects.filter(action="dlq.replay.plan")
    assert created.after["entries"] == 10 and created.after["freezing"] == "background"
    assert created.source_ip == "192.0.2.7"

    later = store(plan.channel, letter())  # arrives after the confirmation: never joins
    result = freeze.run_freeze(plan.pk)
    plan.refresh_from_db()

    assert result.chunks == 4 and result.frozen == 10  # 3 + 3 + 3 + 1
    assert plan.status == PlanStatus.QUEUED and plan.total == plan.frozen == 10
    assert plan.lease_owner == "" and plan.frozen_at is not None
    assert _positions(plan) == _replay_order(entries)
    assert list(plan.items.order_by("position").values_list("position", flat=True)) == list(
        range(10)
    )
    assert DeadLetter.objects.get(pk=later[0].pk).status == Status.NEW
    assert set(
        DeadLetter.objects.exclude(pk=later[0].pk).values_list("state__status", flat=True)
    ) == {Status.REPLAYING}
    # One request event per chunk, naming the plan, the person and their reason; together
    # the chunks' digests cover exactly the items, in plan order.
    requests = AuditEvent.objects.filter(action="dlq.replay.request").order_by("id")
    assert [e.after["entries"] for e in requests] == [3, 3, 3, 1]
    assert {(e.target_id, e.actor_username, e.source_ip, e.reason) for e in requests} == {
        (str(plan.pk), "otto", "192.0.2.7", "consumer fixed")
    }
    assert requests[0].after["ids_sha256"] == ids_digest(_replay_order(entries)[:3])
    assert freeze.chunk_mismatches(plan) == []
    [frozen] = AuditEvent.objects.filter(action="dlq.replay.frozen")
    assert frozen.after["entries"] == 10 and frozen.after["selected"] == 10
    assert frozen.after["ids_sha256"] == ids_digest(_replay_order(entries))


@SMALL
def test_the_chunk_requests_give_away_an_item_changed_after_the_freeze(oncall: User) -> None:
    entries = _entries(10)
    plan = _create(oncall)
    freeze.run_freeze(plan.pk)
    assert freeze.chunk_mismatches(plan) == [] and freeze.altered_items(plan) == ""
    other = store(plan.channel, letter())[0]
    # Someone with write access swaps an entry of the second chunk, then drops the last item.
    ReplayItem.objects.filter(plan=plan, position=4).update(entry_id=other.pk)
    assert freeze.chunk_mismatches(plan) == ["positions 3-5: the items differ from the request"]
    reason = freeze.altered_items(plan)
    assert "recorded when it was frozen (positions 3-5: the items differ" in reason
    assert reason.endswith("cancel the plan and plan the replay again")
    ReplayItem.objects.filter(plan=plan, position=4).update(entry_id=_replay_order(entries)[4])
    ReplayItem.objects.filter(plan=plan, position=9).delete()
    assert freeze.chunk_mismatches(plan) == ["positions 9-9: the items differ from the request"]
    ReplayItem.objects.create(plan=plan, entry=other, position=10)  # one no request covers
    assert freeze.chunk_mismatches(plan)[-1] == "the items from position 10 on are in no request"
    # A discard plan writes no chunk requests: nothing to compare with, not "all differ".
    _entries(4, channel=make_channel(slug="payments", name="Payments", address="payments"))
    discard = _create(oncall, kind="discard", channel="payments")
    freeze.run_freeze(discard.pk)
    assert freeze.chunk_mismatches(discard) is None


@SMALL
def test_an_entry_page_shows_the_request_of_the_chunk_that_holds_it(oncall: User) -> None:
    entries = _entries(10)
    plan, _ = do_create_plan(
        "replay", Selection(EntryFilter(channel="orders")), DeadLetter.objects.all(),
        actor=Actor.for_user(oncall), reason=HOSTILE_REASON,
    )  # fmt: skip
    freeze.run_freeze(plan.pk)
    entry = DeadLetter.objects.get(pk=_replay_order(entries)[4])  # the second chunk
    [shown] = [e for e in entry_history(entry) if e.action == "dlq.replay.request"]
    assert shown.after["first_position"] == 3 and shown.after["last_position"] == 5
    page = client_for(oncall).get(entry.get_absolute_url()).content.decode()
    assert page.count("dlq.replay.request") == 1
    assert HOSTILE_REASON not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


@SMALL
def test_a_crash_between_chunks_resumes_from_the_last_committed_chunk(
    oncall: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = _entries(10)
    plan = _create(oncall)
    real, calls = freeze._insert_items, []

    def crash_in_third_chunk(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("worker killed")
        return real(*args)

    monkeypatch.setattr(freeze, "_insert_items", crash_in_third_chunk)
    with pytest.raises(RuntimeError):
        freeze.run_freeze(plan.pk, owner="worker-1")
    plan.refresh_from_db()
    assert plan.status == PlanStatus.FREEZING and plan.frozen == 6 and plan.items.count() == 6
    assert AuditEvent.objects.filter(action="dlq.replay.request").count() == 2  # 3 + 3
    # A killed worker leaves its lease behind: nobody takes the plan until it expires.
    ReplayPlan.objects.filter(pk=plan.pk).update(
        lease_owner="worker-1", lease_until=timezone.now() + dt.timedelta(seconds=60)
    )
    monkeypatch.setattr(freeze, "_insert_items", real)
    assert not freeze.run_freeze(plan.pk, owner="worker-2").claimed
    assert plan.pk not in freeze.orphaned_freezes(grace_s=0)
    ReplayPlan.objects.filter(pk=plan.pk).update(lease_until=timezone.now())
    assert freeze.orphaned_freezes(grace_s=0) == [plan.pk]

    result = freeze.run_freeze(plan.pk, owner="worker-2")
    plan.refresh_from_db()
    assert result.chunks == 2 and plan.status == PlanStatus.QUEUED and plan.total == 10
    assert _positions(plan) == _replay_order(entries)  # no gap, no entry twice
    requests = AuditEvent.objects.filter(action="dlq.replay.request")
    assert sorted(e.after["first_position"] for e in requests) == [0, 3, 6, 9]
    assert freeze.chunk_mismatches(plan) == []


@SMALL
def test_entries_another_plan_took_meanwhile_are_left_out_and_the_total_says_so(
    oncall: User, small: Any
) -> None:
    entries = _entries(10)
    plan = _create(oncall)
    freeze.run_freeze(plan.pk, max_chunks=1)
    taken = _replay_order(entries)[3:5]
    replay, _ = do_create_plan(
        "replay", Selection(EntryFilter(), taken[:1]), DeadLetter.objects.all(),
        actor=Actor.for_user(oncall), reason="urgent one",
    )  # fmt: skip
    small.DLO_FOUR_EYES_THRESHOLD = 0  # awaits approval: held by its items, state unchanged
    discard, _ = do_create_plan(
        "discard", Selection(EntryFilter(), taken[1:]), DeadLetter.objects.all(),
        actor=Actor.for_user(oncall), reason="junk",
    )  # fmt: skip
    small.DLO_FOUR_EYES_THRESHOLD = 100
    assert replay.status == PlanStatus.QUEUED
    assert discard.status == PlanStatus.AWAITING_APPROVAL
    freeze.run_freeze(plan.pk)
    plan.refresh_from_db()
    assert plan.status == PlanStatus.QUEUED and plan.total == plan.frozen == 8
    assert not set(taken) & set(_positions(plan))
    assert "10 entries were selected; 2 changed state" in plan.status_note


@SMALL
def test_the_relay_does_not_start_a_plan_until_it_is_frozen(oncall: User) -> None:
    _entries(10)
    plan = _create(oncall)
    freeze.run_freeze(plan.pk, max_chunks=1)
    assert plan.pk not in orphaned_plans()
    result = relay.run_plan(plan.pk, max_seconds=5)
    assert not result.claimed
    assert set(plan.items.values_list("status", flat=True)) == {ItemStatus.PENDING}
    assert ReplayPlan.objects.get(pk=plan.pk).status == PlanStatus.FREEZING
    freeze.run_freeze(plan.pk)
    assert plan.pk in orphaned_plans()  # frozen: now the relay's


@SMALL
def test_cancelling_a_freezing_plan_stops_the_freeze_and_frees_what_was_frozen(
    oncall: User,
) -> None:
    _entries(10)
    plan = _create(oncall)
    freeze.run_freeze(plan.pk, max_chunks=1)
    cancelled = do_cancel_plan(plan.pk, actor=Actor.for_user(oncall), reason="wrong channel")
    assert cancelled.status == PlanStatus.CANCELLED
    assert cancelled.total == cancelled.cancelled == 3 and cancelled.pending == 0
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.NEW}
    result = freeze.run_freeze(plan.pk)
    assert not result.claimed and plan.items.count() == 3
    [event] = AuditEvent.objects.filter(action="dlq.replay.cancel")
    assert event.reason == "wrong channel" and event.after["while_freezing"] is True
    assert AuditEvent.objects.filter(action="dlq.replay.cancelled").count() == 3


@SMALL
def test_approving_a_freezing_plan_is_refused_until_it_is_frozen(
    oncall: User, settings: Any
) -> None:
    approver = make_user("olivia", "oncall")  # on-call may approve another's plan
    _entries(10)
    settings.DLO_FOUR_EYES_THRESHOLD = 5
    plan = _create(oncall)
    assert plan.status == PlanStatus.FREEZING and plan.needs_approval
    freeze.run_freeze(plan.pk, max_chunks=1)
    with pytest.raises(PlanRefused, match=r"still freezing its entries \(3 of 10\)"):
        do_approve_plan(plan.pk, actor=Actor.for_user(approver), reason="checked")
    freeze.run_freeze(plan.pk)
    assert ReplayPlan.objects.get(pk=plan.pk).status == PlanStatus.AWAITING_APPROVAL
    approved = do_approve_plan(plan.pk, actor=Actor.for_user(approver), reason="checked")
    assert approved.status == PlanStatus.QUEUED and approved.approved_by_username == "olivia"


@SMALL
def test_a_small_selection_is_still_frozen_in_the_request(oncall: User) -> None:
    entries = _entries(2)
    plan = _create(oncall)
    assert plan.status == PlanStatus.QUEUED and plan.total == 2
    assert _positions(plan) == _replay_order(entries)
    [event] = AuditEvent.objects.filter(action="dlq.replay.plan")
    assert event.after["ids_sha256"] == ids_digest(_replay_order(entries))
    assert not AuditEvent.objects.filter(action="dlq.replay.frozen").exists()


@SMALL
def test_a_large_discard_freezes_in_the_background_and_then_runs(oncall: User) -> None:
    _entries(10)
    plan = _create(oncall, kind="discard")
    assert plan.status == PlanStatus.FREEZING
    freeze.run_freeze(plan.pk)
    plan.refresh_from_db()
    assert plan.status == PlanStatus.DONE and plan.discarded == 10  # a small discard: at once
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.DISCARDED}


@SMALL
def test_the_scheduler_tick_freezes_plans_without_celery(oncall: User, settings: Any) -> None:
    from config.periodic import PERIODIC_JOBS
    from dlq.tasks import resume_freezing_plans_task

    assert PERIODIC_JOBS["dlq-freeze-plans"][0] == "dlq.tasks.resume_freezing_plans_task"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    _entries(10)
    plan = _create(oncall)
    assert resume_freezing_plans_task() == 1
    assert ReplayPlan.objects.get(pk=plan.pk).status == PlanStatus.QUEUED


@SMALL
def test_the_plan_page_and_the_api_show_the_freeze_progress(oncall: User) -> None:
    _entries(10)
    client = client_for(oncall)
    response = client.post(
        "/dead-letters/replay/",
        {"channel": "orders", "action_reason": "consumer fixed", "request_key": "f1"},
    )
    plan = ReplayPlan.objects.get()
    assert response.status_code == 302 and plan.status == PlanStatus.FREEZING
    freeze.run_freeze(plan.pk, max_chunks=2)
    page = client.get(plan.get_absolute_url(), follow=True).content.decode()
    assert "10 entries selected: the plan is freezing them in the background" in page
    assert "Freezing the selection: 6 of 10 entries (60%)" in page
    assert '<progress class="replay-bar freeze-bar" max="10" value="6"' in page
    assert 'hx-trigger="every 2s"' in page  # polled until frozen
    polled = client.get(f"{plan.get_absolute_url()}?freezing=1", HTTP_HX_REQUEST="true")
    assert "6 of 10 entries" in polled.content.decode() and not polled.has_header("HX-Refresh")
    freeze.run_freeze(plan.pk)
    polled = client.get(f"{plan.get_absolute_url()}?freezing=1", HTTP_HX_REQUEST="true")
    assert polled["HX-Refresh"] == "true"  # frozen: the page reloads its items and controls
    ReplayPlan.objects.filter(pk=plan.pk).update(status=PlanStatus.FREEZING, frozen=6)
    listing = client.get("/dead-letters/replays/").content.decode()
    assert "freezing 60%" in listing
    api = client.get(f"/api/replay-plans/{plan.pk}/").json()
    assert api["status"] == "freezing" and api["frozen"] == 6 and api["total"] == 10


# -- other writers never wait for a chunk (PostgreSQL: row locks) -----------------------------


@pytest.mark.django_db(transaction=True)
def test_other_audited_writers_and_ingest_go_on_while_a_chunk_is_open(
    small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk's transaction is held open (after its items, status changes and request audit
    events, before its commit) while another connection records audited actions, ingests a
    batch into the same channel and failure group, and confirms another plan: all of that
    completes while the chunk is still open. A lock wait would fail them (lock_timeout)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks and concurrent transactions: PostgreSQL")
    small.DLO_FREEZE_CHUNK = 4
    small.DLO_AUDIT_SEALER = "thread"  # production's: no writer takes the audit head lock
    user = make_user("otto", "oncall")
    channel = make_channel()
    resolved = _entries(6, channel)
    # Entries replayed before: freezing them again reopens them (a failure-group recount).
    update_entries(
        DeadLetter.objects.filter(pk__in=[e.pk for e in resolved[:2]]), status=Status.REPLAYED
    )
    other = store(channel, letter(), letter())  # the second plan's: not in the first one
    plan, _ = do_create_plan(
        "replay", Selection(EntryFilter(), [e.pk for e in resolved]), DeadLetter.objects.all(),
        actor=Actor.for_user(user), reason="first",
    )  # fmt: skip
    assert plan.status == PlanStatus.FREEZING
    chunk_open, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    real = freeze._audit_request

    def hold_the_chunk_open(*args: Any) -> None:
        real(*args)
        if threading.current_thread().name == "freezer":
            chunk_open.set()
            release.wait(timeout=60)

    monkeypatch.setattr(freeze, "_audit_request", hold_the_chunk_open)

    def freezer() -> None:
        try:
            freeze.run_freeze(plan.pk, max_chunks=1)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=freezer, name="freezer")
    thread.start()
    try:
        assert chunk_open.wait(timeout=60)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        for i in range(3):
            with transaction.atomic():
                record("test.other", actor=Actor.system("other"), target_id=str(i))
        store(channel, letter(), letter())  # same channel, same failure group
        second, _ = do_create_plan(
            "replay", Selection(EntryFilter(), [e.pk for e in other]), DeadLetter.objects.all(),
            actor=Actor.for_user(user), reason="second",
        )  # fmt: skip
        assert second.status == PlanStatus.QUEUED and second.total == 2
        assert thread.is_alive() and not release.is_set()  # all that while the chunk was open
        assert ReplayPlan.objects.get(pk=plan.pk).frozen == 0  # …and uncommitted
    finally:
        release.set()
        thread.join(timeout=60)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not errors
    plan.refresh_from_db()
    assert plan.frozen == 4
    freeze.run_freeze(plan.pk)
    plan.refresh_from_db()
    assert plan.status == PlanStatus.QUEUED and plan.total == 6
    group = DeadLetter.objects.get(pk=resolved[0].pk).group
    assert group is not None
    group.refresh_from_db()
    assert group.open_count == DeadLetter.objects.filter(group=group).count()  # all open again
    _wait_sealed()


def _wait_sealed() -> None:
    from audit.actions import verify_chain
    from audit.sealer import unsealed_status

    deadline = time.monotonic() + 60
    while unsealed_status()["count"]:
        assert time.monotonic() < deadline, "the sealer did not seal within 60 s"
        time.sleep(0.05)
    assert verify_chain().ok


@pytest.mark.django_db(transaction=True)
def test_a_cancel_during_an_open_chunk_rolls_that_chunk_back(
    small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("concurrent transactions: PostgreSQL")
    # Production's sealer: "inline" (the suite's) makes every recording transaction, a
    # chunk's too, hold the audit head lock until it commits, so a cancel would queue on it.
    small.DLO_AUDIT_SEALER = "thread"
    user = make_user("otto", "oncall")
    entries = _entries(10)
    plan = _create(user)
    freeze.run_freeze(plan.pk, max_chunks=1)
    chunk_open, release = threading.Event(), threading.Event()
    real = freeze._audit_request

    def hold_the_chunk_open(*args: Any) -> None:
        real(*args)
        if threading.current_thread().name == "freezer":
            chunk_open.set()
            release.wait(timeout=60)

    monkeypatch.setattr(freeze, "_audit_request", hold_the_chunk_open)
    results: list[Any] = []

    def freezer() -> None:
        try:
            results.append(freeze.run_freeze(plan.pk))
        except BaseException as exc:  # surfaced below
            results.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=freezer, name="freezer")
    thread.start()
    try:
        assert chunk_open.wait(timeout=60)
        cancelled = do_cancel_plan(plan.pk, actor=Actor.for_user(user), reason="stop")
        assert cancelled.total == cancelled.cancelled == 3
    finally:
        release.set()
        thread.join(timeout=60)
    assert [getattr(r, "status", r) for r in results] == [PlanStatus.CANCELLED]
    assert plan.items.count() == 3  # the open chunk's items rolled back with it
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.NEW}
    [requested] = AuditEvent.objects.filter(action="dlq.replay.request")
    assert requested.after["ids_sha256"] == ids_digest(_replay_order(entries)[:3])
    assert ReplayItem.objects.filter(plan=plan, status=ItemStatus.CANCELLED).count() == 3
    _wait_sealed()
