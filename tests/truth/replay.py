"""The "replay in progress" scenario's steps (``tests/truth/harness.py``): dead letters captured
by the product's own ingest, a replay plan relayed back to the origin by the real relay while
the application's consumer drains the origin, and the board's dead-letter numbers compared
with the broker and with the relay's confirms at every poll.

Everything here runs on the harness's thread: the relay works in short time slices between
the polls (``relay_slice``), as a relay worker's slices interleave with the poller's rounds,
and the database sees one connection (the suite's transaction included)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any
from unittest import mock

from django.contrib.auth.models import User

from dlq.capture import ingest
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem
from dlq.plans import relay
from tests.dlq.replay_helpers import plan_for

if TYPE_CHECKING:
    from channels_registry.models import ChannelHealth
    from tests.truth.harness import Run

#: Dead letters replayed, and the plan's velocity (messages per second): a replay that spans
#: many polls at the suite's 1 s interval.
DEAD = 120
VELOCITY = 15.0
#: How long the relay works per poll tick, shared by the brokers side by side.
SLICE_S = 0.6
#: The end: the relay finishes the plan, the consumer receives every confirmed replay (bounded).
FINISH_S = 60.0
#: A plan the relay has not closed yet.
_OPEN = {PlanStatus.QUEUED, PlanStatus.RUNNING, PlanStatus.WAITING}


@dataclasses.dataclass
class ReplayRun:
    plan_id: int
    stored: int
    #: Polls at which the numbers were compared while the plan was running.
    compared_running: int = 0


def start(run: Run) -> None:
    """Steady traffic (20/s, acked), ``DEAD`` dead letters in the DLQ, captured by
    ``ingest.ingest_channel`` (the ingest worker's path), then a replay plan over all of them
    at ``VELOCITY`` (the relay task is not enqueued: the harness runs the relay itself)."""
    run.app.produce(20.0)
    run.consumers.append(run.app.consume("ack"))
    run.app.dead_letters(DEAD)
    stored = 0
    for _ in range(20):  # bounded: the copies may take a moment to reach the DLQ stream
        stored += ingest.ingest_channel(run.channel).inserted
        if stored >= DEAD:
            break
        time.sleep(0.2)
    entries = list(DeadLetter.objects.filter(channel=run.channel))
    user, _ = User.objects.get_or_create(username="truth-oncall")
    with mock.patch("dlq.plans.plan_jobs.enqueue_relay"):
        plan = plan_for(entries, user, velocity=VELOCITY, reason="truth: replay in progress")
    run.extra["replay"] = ReplayRun(plan.pk, len(entries))


def relay_slice(run: Run, seconds: float) -> None:
    """One slice of the relay, as the relay task runs it."""
    state: ReplayRun = run.extra["replay"]
    relay.run_plan(state.plan_id, max_seconds=seconds)


def _confirmed(state: ReplayRun) -> int:
    return ReplayItem.objects.filter(plan_id=state.plan_id, status=ItemStatus.CONFIRMED).count()


def check(
    run: Run, health: ChannelHealth, before: dict[str, Any], after: dict[str, Any]
) -> list[str]:
    """After each poll: stored-awaiting-triage equals what was stored minus what the broker
    confirmed (the relay runs only between polls, so the confirms are final); the DLQ not yet
    ingested lies between the broker's reads around the poll (0: everything was captured)."""
    state: ReplayRun = run.extra["replay"]
    problems = []
    if relay_running(state):
        state.compared_running += 1
    awaiting = state.stored - _confirmed(state)
    if health.dlq_unresolved != awaiting:
        problems.append(f"stored awaiting triage: board {health.dlq_unresolved}, {awaiting} left")
    if health.poison_unresolved:
        problems.append(f"{health.poison_unresolved} dead letters stored as poison")
    low, high = sorted((before["dlq_pending"], after["dlq_pending"]))
    if health.dlq_depth is None or not low <= health.dlq_depth <= high:
        problems.append(f"dlq_pending: board {health.dlq_depth}, broker {low}..{high}")
    return problems


def relay_running(state: ReplayRun) -> bool:
    return (
        ReplayItem.objects.filter(plan_id=state.plan_id)
        .exclude(status__in=(ItemStatus.CONFIRMED, ItemStatus.FAILED))
        .exists()
    )


def finish(run: Run) -> list[str]:
    """The plan runs to its end and the origin's consumer receives every replay the broker
    confirmed, each once (bounded); the numbers were compared mid-replay at least twice."""
    state: ReplayRun = run.extra["replay"]
    deadline = time.monotonic() + FINISH_S
    # Until the relay has closed the plan, not merely confirmed its last item: the slice that
    # confirms the last batch may end before the relay's next round marks the plan done.
    while relay_status(state) in _OPEN and time.monotonic() < deadline:
        relay.run_plan(state.plan_id, max_seconds=2.0)
    problems = []
    plan_status = relay_status(state)
    if plan_status != PlanStatus.DONE:
        problems.append(f"plan ended {plan_status}, not done")
    ids = set(
        ReplayItem.objects.filter(plan_id=state.plan_id, status=ItemStatus.CONFIRMED).values_list(
            "replay_id", flat=True
        )
    )
    if len(ids) != state.stored:
        problems.append(f"{len(ids)} of {state.stored} replays confirmed")
    while not ids <= run.app.replayed and time.monotonic() < deadline:
        time.sleep(0.2)
    lost = ids - run.app.replayed
    if lost:
        problems.append(f"{len(lost)} confirmed replays never reached the consumer")
    if state.compared_running < 2:
        problems.append(f"compared mid-replay at {state.compared_running} poll(s) only")
    return problems


def relay_status(state: ReplayRun) -> str:
    from dlq.models import ReplayPlan

    return str(ReplayPlan.objects.values_list("status", flat=True).get(pk=state.plan_id))


def forget(channel_id: int) -> None:
    """Delete what the scenario stored for the channel (plans, their items, the entries), so
    the harness can delete the channel afterwards (those keys protect it)."""
    from dlq.models import ReplayPlan

    ReplayItem.objects.filter(plan__channel_id=channel_id).delete()
    ReplayPlan.objects.filter(channel_id=channel_id).delete()
    DeadLetter.objects.filter(channel_id=channel_id).delete()
