"""Replay: permissions, preview warnings, the frozen plan, four eyes, and the relay against a
recording publisher (the real brokers are in test_replay_brokers.py)."""

from __future__ import annotations

import collections
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import override_settings

from audit.actions import Actor
from audit.chain import GENESIS
from audit.models import AuditEvent
from brokers.base import OutgoingMessage
from brokers.base import PublishOutcome as Outcome
from channels_registry.models import ChannelHealth
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem, ReplayPlan, Status
from dlq.models.plans import (
    OUTCOME_ACTION,
    first_items,
    items_in_status,
    items_with_errors,
    outcome_line,
)
from dlq.plans import freeze, relay
from dlq.plans.actions import (
    PlanRefused,
    do_approve_plan,
    do_cancel_plan,
    do_pause_plan,
    do_resume_plan,
)
from dlq.plans.preview import Selection, build_preview, ids_digest
from dlq.plans.relay_items import orphaned_plans
from dlq.triage.views import entry_history
from tests.conftest import client_for, make_channel, make_user
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store, update_entries
from tests.dlq.replay_helpers import RecordingAdapter, plan_for

pytestmark = pytest.mark.django_db
publisher = replay_helpers.publisher  # the fixture


@pytest.fixture
def second_oncall(db: Any) -> User:
    return make_user("olivia", "oncall")


def _entries(n: int = 3, **channel: Any) -> list[DeadLetter]:
    ch = make_channel(**channel)
    return store(ch, *[letter(headers={"Idempotency-Key": f"k-{i}", "order_id": i})
                       for i in range(n)])  # fmt: skip


def _post(client: Any, entries: list[DeadLetter], **data: Any) -> Any:
    fields = {"id": ",".join(str(e.pk) for e in entries), "action_reason": "consumer fixed",
              "request_key": "k1", "velocity": "50"}  # fmt: skip
    fields.update(data)
    return client.post("/dead-letters/replay/", fields)


# -- permissions ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["viewer", "compliance"])
def test_replay_and_discard_need_the_oncall_role(role: str) -> None:
    user = make_user("someone", role)
    entries = _entries(1)
    client = client_for(user)
    for kind in ("replay", "discard"):
        assert client.get(f"/dead-letters/{kind}/?id={entries[0].pk}").status_code == 403
        response = client.post(f"/dead-letters/{kind}/", {"id": entries[0].pk, "reason": "x"})
        assert response.status_code == 403  # a forged POST changes nothing
    assert not ReplayPlan.objects.exists()
    assert DeadLetter.objects.get().status == Status.NEW
    denied = AuditEvent.objects.filter(outcome="denied", actor_username="someone")
    assert {e.action for e in denied} == {"dlq.replay", "dlq.discard"}
    assert denied.count() == 4


def test_entry_list_offers_checkboxes_only_to_oncall(oncall: User, viewer: User) -> None:
    entries = _entries(2)
    html = client_for(oncall).get("/dead-letters/list/?channel=orders").content.decode()
    assert f'name="id" value="{entries[0].pk}"' in html and "Replay all matching" in html
    html = client_for(viewer).get("/dead-letters/list/?channel=orders").content.decode()
    assert 'name="id"' not in html and "Replay selected" not in html


# -- preview -------------------------------------------------------------------------------


def _codes(response: Any) -> set[str]:
    import re

    return set(re.findall(r'data-code="([a-z_]+)"', response.content.decode()))


def test_preview_shows_exact_count_target_and_each_warning(oncall: User) -> None:
    channel = make_channel(schema_version="3")
    ChannelHealth.objects.create(channel=channel, consumers=0)
    [plain, no_key, old, replayed, no_order] = store(
        channel,
        letter(headers={"Idempotency-Key": "a", "order_id": 1, "schema-version": "3"}),
        letter(headers={"order_id": 2}),
        letter(headers={"Idempotency-Key": "c", "order_id": 3, "schema-version": "2"}),
        letter(headers={"Idempotency-Key": "d", "order_id": 4}),
        letter(b'{"no": "order key"}', headers={"Idempotency-Key": "e"}),
    )
    update_entries(DeadLetter.objects.filter(pk=replayed.pk), status=Status.REPLAYED)
    response = client_for(oncall).get("/dead-letters/replay/?channel=orders")
    html = response.content.decode()
    assert response.status_code == 200
    assert '<strong class="replay-count">5</strong>' in html
    assert "<code>orders</code>" in html  # the channel's own queue
    assert _codes(response) >= {
        "missing_idempotency_key",
        "replayed_before",
        "ordered",
        "ordering_key_unknown",
        "schema_older",
        "no_consumers",
    }
    preview = build_preview("replay", Selection.from_params({"channel": "orders"}),
                             DeadLetter.objects.all())  # fmt: skip
    counts = {w.code: w.count for w in preview.warnings}
    assert counts["missing_idempotency_key"] == 1
    assert counts["replayed_before"] == 1
    assert counts["schema_older"] == 1
    assert counts["ordering_key_unknown"] == 1
    assert preview.matched == preview.eligible == 5


def test_preview_count_is_the_list_filters_count(oncall: User) -> None:
    channel = make_channel()
    store(channel, *[letter(reason="expired") for _ in range(3)], letter(reason="rejected"))
    params = {"channel": "orders", "reason": "expired"}
    preview = build_preview("replay", Selection.from_params(params),
                             DeadLetter.objects.all())  # fmt: skip
    from dlq.triage.filters import EntryFilter

    assert preview.matched == EntryFilter.from_params(params).apply(DeadLetter.objects).count()
    assert preview.matched == 3


def test_global_order_and_unstated_semantic_warn(oncall: User) -> None:
    entries = _entries(1, ordering="global", single_active_consumer=True)
    response = client_for(oncall).get(f"/dead-letters/replay/?id={entries[0].pk}")
    assert "ordered_global" in _codes(response)


def test_selection_across_channels_is_refused(oncall: User) -> None:
    a = _entries(1)
    b = store(make_channel(slug="billing", address="billing", dlq_address="billing.dlq"),
              letter())  # fmt: skip
    response = client_for(oncall).get(f"/dead-letters/replay/?id={a[0].pk},{b[0].pk}")
    assert "several channels" in response.content.decode()
    assert _post(client_for(oncall), a + b).status_code == 400
    assert not ReplayPlan.objects.exists()


def test_at_most_once_is_blocked_without_an_override(oncall: User) -> None:
    entries = _entries(2, semantic="at-most-once")
    client = client_for(oncall)
    response = client.get(f"/dead-letters/replay/?id={entries[0].pk}")
    assert "at_most_once" in _codes(response) and 'name="override"' in response.content.decode()
    assert _post(client, entries).status_code == 400
    assert _post(client, entries, override="on", request_key="k2").status_code == 400
    assert not ReplayPlan.objects.exists()
    response = _post(client, entries, override="on", override_reason="consumer dedups now",
                     request_key="k3")  # fmt: skip
    plan = ReplayPlan.objects.get()
    assert response.status_code == 302 and response["Location"] == plan.get_absolute_url()
    assert plan.override and plan.status == PlanStatus.AWAITING_APPROVAL  # override: four eyes


# -- the frozen plan -----------------------------------------------------------------------


def test_confirming_freezes_a_plan_audited_in_one_go(oncall: User) -> None:
    entries = _entries(3)
    response = _post(client_for(oncall), entries)
    plan = ReplayPlan.objects.get()
    assert response.status_code == 302
    assert plan.status == PlanStatus.QUEUED and plan.total == 3 and plan.velocity == 50
    assert plan.target_name == "orders" and plan.requested_by_username == "otto"
    assert {w["code"] for w in plan.warnings} >= {"ordered"}
    items = list(plan.items.order_by("position"))
    assert [i.entry_id for i in items] == [e.pk for e in entries]  # original order
    assert {i.status for i in items} == {ItemStatus.PENDING}  # nothing sent in the request
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYING}
    [event] = AuditEvent.objects.filter(action="dlq.replay.plan")
    assert event.reason == "consumer fixed" and event.after["entries"] == 3
    assert event.after["ids_sha256"] == ids_digest(e.pk for e in entries)
    [request] = AuditEvent.objects.filter(action="dlq.replay.request")
    assert request.target_id == str(plan.pk) and request.reason == "consumer fixed"
    assert request.after["ids_sha256"] == ids_digest(e.pk for e in entries)
    assert freeze.chunk_mismatches(plan) == []
    _assert_chain_intact()


def test_a_double_submitted_form_creates_one_plan(oncall: User) -> None:
    entries = _entries(2)
    client = client_for(oncall)
    first, second = _post(client, entries), _post(client, entries)
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"]
    assert ReplayPlan.objects.count() == 1
    assert AuditEvent.objects.filter(action="dlq.replay.plan").count() == 1


def test_a_reason_is_required(oncall: User) -> None:
    entries = _entries(1)
    assert _post(client_for(oncall), entries, action_reason="  ").status_code == 400
    assert not ReplayPlan.objects.exists()


def test_entries_in_a_running_plan_are_not_planned_twice(oncall: User) -> None:
    entries = _entries(2)
    plan_for(entries[:1], oncall)
    preview = build_preview("replay", Selection.from_params({"channel": "orders"}),
                             DeadLetter.objects.all())  # fmt: skip
    assert preview.matched == 2 and preview.eligible == 1
    assert preview.excluded == {"being replayed": 1}


# -- four eyes -----------------------------------------------------------------------------


@override_settings(DLO_FOUR_EYES_THRESHOLD=2)
def test_bulk_replay_above_the_threshold_needs_a_second_person(
    oncall: User, second_oncall: User, viewer: User
) -> None:
    entries = _entries(3)
    _post(client_for(oncall), entries)
    plan = ReplayPlan.objects.get()
    assert plan.status == PlanStatus.AWAITING_APPROVAL and plan.needs_approval
    page = client_for(oncall).get(plan.get_absolute_url()).content.decode()
    assert "cannot approve it" in page
    url = f"/dead-letters/replays/{plan.pk}/approve/"
    client_for(oncall).post(url, {"reason": "me"})
    assert ReplayPlan.objects.get().status == PlanStatus.AWAITING_APPROVAL
    with pytest.raises(PlanRefused):
        do_approve_plan(plan.pk, actor=Actor.for_user(oncall))
    assert client_for(viewer).post(url, {"reason": "me"}).status_code == 403
    response = client_for(second_oncall).post(url, {"reason": "checked the fix"})
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.status == PlanStatus.QUEUED and plan.approved_by_username == "olivia"
    event = AuditEvent.objects.get(action="dlq.replay.approve")
    assert event.actor_username == "olivia" and event.reason == "checked the fix"


# -- the relay -----------------------------------------------------------------------------


def test_relay_publishes_to_the_declared_target_with_a_replay_id(
    oncall: User, publisher: RecordingAdapter
) -> None:
    channel = make_channel()
    entries = store(
        channel,
        *[
            letter(
                headers={
                    "Idempotency-Key": f"k-{i}",
                    "x-death": [{"queue": "orders", "count": 1}],
                    "x-first-death-queue": "evil.target",
                    "x-first-death-exchange": "evil-exchange",
                    "x-last-death-reason": "rejected",
                    "x-bin": {"$bytes": "00ff"},
                }
            )
            for i in range(3)
        ],
    )
    plan = plan_for(entries, oncall)
    result = relay.run_plan(plan.pk)
    assert result.confirmed == 3 and result.status == PlanStatus.DONE
    assert {target.name for target, _ in publisher.sent} == {"orders"}
    for (_, message), entry in zip(publisher.sent, entries, strict=True):
        item = ReplayItem.objects.get(plan=plan, entry=entry)
        assert message.headers["x-dlq-replay-id"] == f"{plan.pk}:{item.pk}:1" == item.replay_id
        assert message.headers["Idempotency-Key"] == entry.headers["Idempotency-Key"]
        assert message.headers["x-bin"] == b"\x00\xff"
        assert not [h for h in message.headers if h.startswith(("x-death", "x-first", "x-last"))]
        assert message.body == bytes(entry.body)
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}
    plan.refresh_from_db()
    assert (plan.confirmed, plan.failed, plan.sent, plan.pending) == (3, 0, 3, 0)
    _assert_one_request_and_one_outcome_each(entries)
    assert AuditEvent.objects.filter(action="dlq.replay.finished").count() == 1


def test_unroutable_is_retried_then_failed_with_the_reason(
    oncall: User, publisher: RecordingAdapter
) -> None:
    entries = _entries(2)
    plan = plan_for(entries, oncall)
    first_item = plan.items.order_by("position").first()
    assert first_item is not None
    publisher.policy = lambda m, n: (
        Outcome(m.key, False, "unroutable: 312 NO_ROUTE", refused=True)
        if m.key == str(first_item.pk)
        else Outcome(m.key, True)
    )
    ReplayPlan.objects.filter(pk=plan.pk).update(max_attempts=3)
    result = relay.run_plan(plan.pk)
    # A plan that ends with failures says so, in its status and its audit outcome.
    assert result.status == PlanStatus.DONE_WITH_FAILURES
    finished = AuditEvent.objects.get(action="dlq.replay.finished")
    assert finished.outcome == "failed" and finished.after["failed"] == 1
    first_item.refresh_from_db()
    assert first_item.status == ItemStatus.FAILED and first_item.attempts == 3
    assert "NO_ROUTE" in first_item.last_error
    ids = [m.headers["x-dlq-replay-id"] for _, m in publisher.sent if m.key == str(first_item.pk)]
    # A definite refusal: nothing was enqueued, so every attempt has its own id.
    assert ids == [f"{plan.pk}:{first_item.pk}:{n}" for n in (1, 2, 3)]
    assert DeadLetter.objects.get(pk=first_item.entry_id).status == Status.FAILED
    assert DeadLetter.objects.get(pk=entries[1].pk).status == Status.REPLAYED
    [failed] = replay_helpers.recorded_outcomes("failed")
    assert failed["entry"] == first_item.entry_id and "NO_ROUTE" in failed["error"]
    # The batch that held the failure says so in its outcome and reason.
    assert failed["event"].outcome == "failed" and "NO_ROUTE" in failed["event"].reason
    _assert_one_request_and_one_outcome_each(entries)


def test_a_lost_confirm_republishes_with_the_same_replay_id(
    oncall: User, publisher: RecordingAdapter
) -> None:
    entries = _entries(1)
    plan = plan_for(entries, oncall)
    publisher.policy = lambda m, n: Outcome(m.key, n > 1, "" if n > 1 else "timeout")
    relay.run_plan(plan.pk)
    ids = [m.headers["x-dlq-replay-id"] for _, m in publisher.sent]
    assert len(ids) == 2 and ids[0] == ids[1]
    assert DeadLetter.objects.get().status == Status.REPLAYED


def test_a_lost_connection_waits_for_the_broker_and_spends_no_attempt(
    oncall: User, publisher: RecordingAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks with the first publish of every entry, and the broker refuses
    two reconnections: the plan pauses itself (visible, audited), resumes on its own, and
    every entry is REPLAYED with its first attempt and its first replay id."""
    monkeypatch.setattr(relay, "PROBE_MIN_S", 0.01)
    entries = _entries(3)
    plan = plan_for(entries, oncall)

    def policy(message: OutgoingMessage, n: int) -> Outcome:
        if n == 1:
            publisher.unreachable = 2
            return Outcome.lost(message.key, "connection closed: reset by peer")
        return Outcome(message.key, True)

    publisher.policy = policy
    result = relay.run_plan(plan.pk)
    assert result.status == PlanStatus.DONE and result.confirmed == 3
    plan.refresh_from_db()
    assert (plan.sent, plan.sent_entries, plan.maybe_twice, plan.outages) == (6, 3, 3, 1)
    assert plan.republishes == 3 and plan.status_note == "" and plan.waiting_since is None
    for item in plan.items.all():
        ids = [m.headers["x-dlq-replay-id"] for _, m in publisher.sent if m.key == str(item.pk)]
        assert ids == [f"{plan.pk}:{item.pk}:1"] * 2  # in doubt: the same id again
        assert item.attempts == 1 and item.publishes == 2 and item.republished
    actions = list(
        AuditEvent.objects.filter(target_type="dlq.replayplan").values_list("action", "outcome")
    )
    assert ("dlq.replay.broker_unreachable", "failed") in actions
    assert ("dlq.replay.broker_back", "success") in actions
    assert actions[-1] == ("dlq.replay.finished", "success")
    back = AuditEvent.objects.get(action="dlq.replay.broker_back")
    assert back.after["waited_s"] >= 0
    page = client_for(oncall).get(plan.get_absolute_url()).content.decode()
    assert "May have gone out twice" in page and "unreachable 1 time during this plan" in page
    _assert_one_request_and_one_outcome_each(entries)


def test_a_plan_whose_items_were_altered_after_the_freeze_sends_nothing(
    oncall: User, publisher: RecordingAdapter
) -> None:
    entries = _entries(3)
    [stranger] = store(entries[0].channel, letter(headers={"Idempotency-Key": "not-confirmed"}))
    plan = plan_for(entries, oncall)
    # Someone with database access swaps a frozen entry for one nobody confirmed.
    ReplayItem.objects.filter(plan=plan, entry=entries[1]).update(entry=stranger)
    result = relay.run_plan(plan.pk)
    plan.refresh_from_db()
    assert result.status == plan.status == PlanStatus.PAUSED and publisher.sent == []
    assert "differ from the entries its audit trail recorded" in plan.status_note
    [paused] = AuditEvent.objects.filter(action="dlq.replay.pause")
    assert paused.outcome == "failed" and paused.reason == plan.status_note
    # Resuming does not get it past the check; restoring the item does.
    do_resume_plan(plan.pk, actor=Actor.for_user(oncall))
    assert relay.run_plan(plan.pk).status == PlanStatus.PAUSED and publisher.sent == []
    ReplayItem.objects.filter(plan=plan, entry=stranger).update(entry=entries[1])
    do_resume_plan(plan.pk, actor=Actor.for_user(oncall))
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE and len(publisher.sent) == 3


def test_pause_stops_and_resume_continues(
    oncall: User, publisher: RecordingAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = _entries(3)
    plan = plan_for(entries, oncall, velocity=1000.0)
    ReplayPlan.objects.filter(pk=plan.pk).update(velocity=1.0)  # one item per batch
    take_batch = relay.take_batch

    def pause_while_the_first_batch_is_out(*args: Any, **kwargs: Any) -> list[ReplayItem]:
        items = take_batch(*args, **kwargs)
        if items and not ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.PAUSED).exists():
            do_pause_plan(plan.pk, actor=Actor.for_user(oncall), reason="look")
        return items

    monkeypatch.setattr(relay, "take_batch", pause_while_the_first_batch_is_out)
    result = relay.run_plan(plan.pk)
    assert result.status == PlanStatus.PAUSED and len(publisher.sent) == 1
    monkeypatch.setattr(relay, "take_batch", take_batch)
    do_resume_plan(plan.pk, actor=Actor.for_user(oncall))
    ReplayPlan.objects.filter(pk=plan.pk).update(velocity=None)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    assert len(publisher.sent) == 3
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"dlq.replay.pause", "dlq.replay.resume"} <= actions


def test_cancel_returns_unsent_entries_to_new(oncall: User, publisher: RecordingAdapter) -> None:
    entries = _entries(3)
    plan = plan_for(entries, oncall)
    client_for(oncall).post(f"/dead-letters/replays/{plan.pk}/cancel/", {"reason": "wrong fix"})
    plan.refresh_from_db()
    assert plan.status == PlanStatus.CANCELLED and plan.cancelled == 3
    assert set(plan.items.values_list("status", flat=True)) == {ItemStatus.CANCELLED}
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.NEW}
    assert relay.run_plan(plan.pk).claimed is False
    assert publisher.sent == []
    _assert_one_request_and_one_outcome_each(entries, cancelled=True)
    with pytest.raises(PlanRefused):
        do_cancel_plan(plan.pk, actor=Actor.for_user(oncall))


def test_the_canary_halts_when_the_failure_comes_back(
    oncall: User, publisher: RecordingAdapter
) -> None:
    channel = make_channel(dlq_address="")  # nothing to drain: the DB check alone
    entries = store(channel, *[letter(headers={"Idempotency-Key": f"k{i}"}) for i in range(5)])

    def dead_letter_again(messages: Any) -> None:
        for m in messages:
            store(channel, letter(headers=dict(m.headers)))

    publisher.after_publish.append(dead_letter_again)
    plan = plan_for(entries, oncall, canary_size=2, canary_wait_s=0.01)
    result = relay.run_plan(plan.pk)
    plan.refresh_from_db()
    assert result.status == PlanStatus.HALTED and len(publisher.sent) == 2
    assert "canary" in plan.status_note
    assert AuditEvent.objects.filter(action="dlq.replay.halted").count() == 1
    # Lineage: the copies that came back point at the entries they were replayed from.
    children = DeadLetter.objects.filter(parent__isnull=False).order_by("id")
    assert [c.parent_id for c in children] == [e.pk for e in entries[:2]]
    assert {c.generation for c in children} == {1}
    page = client_for(oncall).get(f"/dead-letters/{children[0].pk}/").content.decode()
    assert f"#{entries[0].pk}" in page and "Replay of" in page
    page = client_for(oncall).get(f"/dead-letters/{entries[0].pk}/").content.decode()
    assert f"#{children[0].pk}" in page


def test_the_canary_passes_then_ramps_up(oncall: User, publisher: RecordingAdapter) -> None:
    entries = _entries(5, dlq_address="")
    plan = plan_for(entries, oncall, canary_size=2, canary_wait_s=0.01)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    assert len(publisher.sent) == 5
    assert AuditEvent.objects.filter(action="dlq.replay.canary_passed").count() == 1


def test_a_forged_replay_id_links_nothing() -> None:
    channel = make_channel()
    [entry] = store(channel, letter(headers={"x-dlq-replay-id": "999:999:1"}))
    assert entry.parent_id is None and entry.generation == 0


def test_repeat_offenders_are_flagged(oncall: User) -> None:
    [entry] = _entries(1)
    DeadLetter.objects.filter(pk=entry.pk).update(generation=3)
    client = client_for(oncall)
    assert "repeat offender" in client.get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "repeat offender" in client.get("/dead-letters/list/").content.decode()
    response = client.get(f"/dead-letters/replay/?id={entry.pk}")
    assert "repeat_offender" in _codes(response)


# -- pages ---------------------------------------------------------------------------------


def test_plan_page_shows_progress_and_polls_while_live(
    oncall: User, viewer: User, publisher: RecordingAdapter
) -> None:
    entries = _entries(2)
    plan = plan_for(entries, oncall)
    html = client_for(viewer).get(plan.get_absolute_url()).content.decode()
    assert 'hx-trigger="every 2s"' in html and "fixed the consumer" in html
    assert "Pause" not in html  # viewers see, cannot act
    partial = client_for(oncall).get(plan.get_absolute_url(), headers={"HX-Request": "true"})
    assert partial.content.decode().lstrip().startswith('<section class="card replay-progress"')
    relay.run_plan(plan.pk)
    html = client_for(oncall).get(plan.get_absolute_url()).content.decode()
    assert "every 2s" not in html and "Done" in html
    listing = client_for(viewer).get("/dead-letters/replays/").content.decode()
    assert plan.get_absolute_url() in listing
    assert client_for(make_user("olga")).get("/dead-letters/replays/").status_code == 403


def test_plan_page_lists_the_first_items_in_plan_order_whatever_their_status(
    oncall: User,
) -> None:
    """``first_items`` merges one walk per status; the result is the plain ``ORDER BY
    position``, items in every status interleaved, and the problems are those with an error."""
    entries = _entries(9)
    plan = plan_for(entries, oncall)
    items = list(ReplayItem.objects.filter(plan=plan).order_by("position"))
    statuses = [ItemStatus.FAILED, ItemStatus.CONFIRMED, ItemStatus.PENDING, ItemStatus.SKIPPED]
    for n, item in enumerate(items):
        error = "<b>refused</b>" if n % 3 == 0 else ""
        ReplayItem.objects.filter(pk=item.pk).update(status=statuses[n % 4], last_error=error)
    assert [i.pk for i in first_items(plan, 5)] == [i.pk for i in items[:5]]
    assert [i.pk for i in first_items(plan, 50)] == [i.pk for i in items]
    html = client_for(oncall).get(plan.get_absolute_url()).content.decode()
    shown = [int(pk) for pk in re.findall(r'<td><a href="/dead-letters/(\d+)/"', html)]
    assert shown == [i.entry_id for i in items]
    assert html.count("&lt;b&gt;refused&lt;/b&gt;") == 2 * 3  # the table and the problems list
    assert "<b>refused" not in html


def _plan_of(sql: str, params: list[Any]) -> str:
    """PostgreSQL's plan for ``sql`` with sequential scans and sorts priced out, as a table of
    a million items would price them."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
        cursor.execute("RESET enable_sort")
    return plan


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's plans")
def test_plan_page_queries_walk_an_index_in_plan_order(oncall: User) -> None:
    plan = plan_for(_entries(3), oncall)
    walk, problems = items_in_status(plan, ItemStatus.PENDING), items_with_errors(plan)
    for query, index in ((walk, "dlq_item_plan_status_pos"), (problems, "dlq_item_plan_error_pos")):
        sql, params = query[:50].query.sql_with_params()
        explained = _plan_of(sql, list(params))
        assert index in explained and "Sort" not in explained, explained


def test_the_periodic_relay_picks_up_orphaned_plans(
    oncall: User, publisher: RecordingAdapter
) -> None:
    from dlq.tasks import resume_replay_plans_task

    plan = plan_for(_entries(2), oncall)
    assert orphaned_plans() == [plan.pk]
    assert resume_replay_plans_task() == 1
    assert ReplayPlan.objects.get().status == PlanStatus.DONE
    assert orphaned_plans() == []


# -- helpers -------------------------------------------------------------------------------


def _assert_one_request_and_one_outcome_each(
    entries: list[DeadLetter], cancelled: bool = False
) -> None:
    """Each entry's page shows its chunk's request and exactly one terminal outcome: its line
    in one relay batch record (``outcome_line``), or its own cancellation event."""
    for entry in entries:
        history = entry_history(entry)  # the entry's events, its chunk's request, its outcome
        assert [e.action for e in history].count("dlq.replay.request") == 1
        lines = [
            outcome_line(e.action, e.after, entry.pk) for e in history if e.action == OUTCOME_ACTION
        ]
        if cancelled:
            assert lines == [] and [e.action for e in history].count("dlq.replay.cancelled") == 1
        else:
            assert len(lines) == 1 and lines[0].startswith(("replayed", "failed")), lines
    listed = collections.Counter(o["entry"] for o in replay_helpers.recorded_outcomes())
    assert set(listed.values()) <= {1}  # no entry's outcome recorded twice
    _assert_chain_intact()


def _assert_chain_intact() -> None:
    from audit.actions import verify_chain

    result = verify_chain()
    assert result.ok, result.problem
    assert GENESIS


def test_non_ascii_digits_in_ids_and_versions_are_ignored_not_a_crash(oncall: User) -> None:
    """ "²".isdigit() is true but int("²") fails: hostile headers and query parameters with
    such digits must neither break ingest nor the preview."""
    channel = make_channel(schema_version="3")
    [entry] = store(channel, letter(headers={"x-dlq-replay-id": "1:²:1", "schema-version": "1.²"}))
    assert entry.parent_id is None
    response = client_for(oncall).get(f"/dead-letters/replay/?id=²,{entry.pk}")
    assert response.status_code == 200
    assert '<strong class="replay-count">1</strong>' in response.content.decode()
    assert Selection.from_params({"id": "²"}).ids == []


def test_a_broker_url_variable_unset_on_the_worker_pauses_the_plan_with_the_reason(
    oncall: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLO_BROKER_RABBITMQ_URL", raising=False)
    entries = _entries(2)
    plan = plan_for(entries, oncall)
    result = relay.run_plan(plan.pk)  # no exception: a task would only retry the same failure
    plan.refresh_from_db()
    assert result.status == plan.status == PlanStatus.PAUSED and not result.more
    assert "DLO_BROKER_RABBITMQ_URL" in plan.status_note
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYING}
    event = AuditEvent.objects.get(action="dlq.replay.pause")
    assert "DLO_BROKER_RABBITMQ_URL" in event.reason and event.outcome == "failed"
    assert (
        "DLO_BROKER_RABBITMQ_URL"
        in client_for(oncall).get(plan.get_absolute_url()).content.decode()
    )
    assert orphaned_plans() == []


def test_a_replay_id_header_in_other_case_still_links_the_parent(oncall: User) -> None:
    """Header names are matched case-insensitively (as when the header is found), so a hop
    that capitalises it does not break the lineage."""
    [entry] = _entries(1)
    plan = plan_for([entry], oncall)
    item = ReplayItem.objects.get(plan=plan)
    [back] = store(entry.channel, letter(headers={"X-DLQ-Replay-Id": f"{plan.pk}:{item.pk}:1"}))
    assert back.parent_id == entry.pk and back.generation == 1
