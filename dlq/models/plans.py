"""Bulk actions on dead letters: a frozen plan (replay or discard) and one item per entry.

A plan is the transactional outbox of a bulk action: the request freezes the exact entry ids
(one ``ReplayItem`` each, in replay order), the target taken from the channel declaration, the
velocity, the warnings the user saw, actor and reason. The relay (``dlq.plans.relay``) then works
through the items; every attempt is a row update, every terminal outcome an audit event.
"""

from __future__ import annotations

import heapq

from django.conf import settings
from django.db import models
from django.db.models.functions import Cast, Concat
from django.urls import reverse


class PlanKind(models.TextChoices):
    REPLAY = "replay", "Replay"
    DISCARD = "discard", "Discard"


class PlanStatus(models.TextChoices):
    # The request saved the plan; a background job is freezing its entries into items, in
    # short chunks (``dlq.plans.freeze``). The relay does not touch it until it is frozen.
    FREEZING = "freezing", "Freezing"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    # The relay paused itself because the broker does not answer; it probes and resumes on its
    # own when the broker is back, spending no attempt of any entry (``status_note``: why).
    WAITING = "waiting_broker", "Paused: broker unreachable"
    PAUSED = "paused", "Paused"
    HALTED = "halted", "Halted by the canary"
    DONE = "done", "Done"
    DONE_WITH_FAILURES = "done_failures", "Done with failures"
    CANCELLED = "cancelled", "Cancelled"


# The relay works on plans in these states; the others are waiting for a person or finished.
RUNNABLE = (PlanStatus.QUEUED, PlanStatus.RUNNING, PlanStatus.WAITING)
FINISHED = (PlanStatus.DONE, PlanStatus.DONE_WITH_FAILURES, PlanStatus.CANCELLED)


class ItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    # Claimed for a retry and (maybe) published, outcome not yet recorded; or a first attempt
    # a crashed run left in doubt (taken over from the plan's cursor, ``claimed_through``). The
    # relay republishes these with the SAME replay id (persisted before the publish).
    SENDING = "sending", "Sending"
    CONFIRMED = "confirmed", "Confirmed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    DISCARDED = "discarded", "Discarded"
    SKIPPED = "skipped", "Skipped (entry changed state)"


# An item in one of these states, of a plan not finished, holds its entry: no other plan may
# take the entry (a discard awaiting approval reserves its entries as a replay does).
HOLDING_ITEMS = (ItemStatus.PENDING, ItemStatus.SENDING)


#: The entry-list filters as a plan's selection names them (``dlq.triage.filters.EntryFilter``).
SELECTION_LABELS = {
    "channel": "channel",
    "source": "source",
    "status": "status",
    "group": "failure group",
    "reason": "reason",
    "since": "dead-lettered from",
    "until": "dead-lettered until",
    "key": "idempotency key",
    "type": "message type",
    "q": "search",
}


class ReplayPlan(models.Model):
    """One frozen bulk action (replay or discard) over an exact set of entries of one channel."""

    kind = models.CharField(max_length=8, choices=PlanKind.choices, default=PlanKind.REPLAY)
    status = models.CharField(max_length=20, choices=PlanStatus.choices)
    channel = models.ForeignKey(
        "channels_registry.Channel", on_delete=models.PROTECT, related_name="replay_plans"
    )
    # The target, frozen from the channel declaration at confirmation (never from headers).
    target_name = models.CharField(max_length=255, blank=True)
    target_group = models.CharField(max_length=255, blank=True)
    selection = models.JSONField(default=dict, blank=True)  # how the user chose the entries
    total = models.PositiveIntegerField(default=0)
    velocity = models.FloatField(null=True, blank=True, help_text="messages per second")
    canary_size = models.PositiveIntegerField(default=0)
    canary_wait_s = models.FloatField(default=30.0)
    canary_passed_at = models.DateTimeField(null=True, blank=True)
    max_attempts = models.PositiveSmallIntegerField(default=5)
    warnings = models.JSONField(default=list, blank=True)
    override = models.BooleanField(default=False)
    override_reason = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+",
    )  # fmt: skip
    requested_by_username = models.CharField(max_length=150, blank=True)
    reason = models.TextField()
    request_key = models.CharField(max_length=64, unique=True, null=True, blank=True)
    needs_approval = models.BooleanField(default=False)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+",
    )  # fmt: skip
    approved_by_username = models.CharField(max_length=150, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status_note = models.TextField(blank=True)  # why it halted / waits / was cancelled
    waiting_since = models.DateTimeField(null=True, blank=True)  # broker unreachable since
    outages = models.PositiveIntegerField(default=0)  # times the relay waited for the broker
    # Progress counters, moved in the same transaction as the items they count.
    sent = models.PositiveIntegerField(default=0)  # publishes, republishes of in-doubt items too
    sent_entries = models.PositiveIntegerField(default=0)  # distinct entries published
    # Distinct entries published again with the same replay id after an outcome in doubt
    # (connection lost, no confirm, relay crash): the target may hold two copies of each.
    maybe_twice = models.PositiveIntegerField(default=0)
    confirmed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    discarded = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    # Freezing (``dlq.plans.freeze``): the selection to freeze (every id of an explicit selection,
    # the filter, the id bound taken at confirmation, the requester's address), the items
    # frozen so far and the (dead_lettered_at, id) of the last entry a committed chunk read.
    freeze_spec = models.JSONField(default=dict, blank=True)
    frozen = models.PositiveIntegerField(default=0)
    freeze_cursor_at = models.DateTimeField(null=True, blank=True)
    freeze_cursor_id = models.BigIntegerField(null=True, blank=True)
    frozen_at = models.DateTimeField(null=True, blank=True)
    # The relay's cursor (``dlq.plans.relay_items``): every item at a position below it has
    # been handed to a publisher for its first attempt. Such an item still PENDING with no
    # publish recorded (``publishes`` 0) is in flight, or in doubt once its run is gone.
    claimed_through = models.PositiveIntegerField(default=0)
    # A lease, so exactly one relay (or freezer) works on a plan; an expired one can be taken.
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "id"], name="dlq_plan_status_id")]

    def __str__(self) -> str:
        return f"{self.get_kind_display().lower()} plan #{self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("dlq:plan_detail", args=[self.pk])

    @property
    def target_display(self) -> str:
        return f"{self.target_name}/{self.target_group}" if self.target_group else self.target_name

    @property
    def resolved(self) -> int:
        return self.confirmed + self.failed + self.cancelled + self.discarded + self.skipped

    @property
    def pending(self) -> int:
        return max(self.total - self.resolved, 0)

    @property
    def selection_summary(self) -> str:
        """How the entries were chosen, in words ("failure group #7", not "group group=7")."""
        selection = self.selection if isinstance(self.selection, dict) else {}
        mode = selection.get("mode")
        ids = selection.get("ids") or []
        if mode == "one" and ids:
            return f"one entry (#{ids[0]})"
        if mode == "selection":
            return f"{self.total:,} entries picked one by one"
        parts = []
        for name, value in (selection.get("filter") or {}).items():
            label = SELECTION_LABELS.get(name, name)
            parts.append(f"{label} #{value}" if name == "group" else f"{label} {value}")
        if mode == "group" and parts:
            return f"the entries of {parts[0]}"
        return "entries where " + ", ".join(parts) if parts else "every entry"

    @property
    def is_freezing(self) -> bool:
        return self.status == PlanStatus.FREEZING

    @property
    def freeze_percent(self) -> int:
        return min(int(100 * self.frozen / self.total), 100) if self.total else 100

    @property
    def percent(self) -> int:
        return int(100 * self.resolved / self.total) if self.total else 100

    @property
    def republishes(self) -> int:
        """Publishes beyond one per entry: retries after refusals and republishes in doubt."""
        return max(self.sent - self.sent_entries, 0)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED


class ReplayItem(models.Model):
    """One entry of a plan: its attempts and outcome. ``replay_id`` is
    ``"<plan>:<item>:<attempt>"``, persisted before the attempt is published. ``attempts``
    counts only attempts the broker answered or that stayed in doubt with the broker up; a
    lost connection gives the attempt back."""

    # No index of its own: ``(plan, entry)`` and ``(plan, status, position)`` lead with it, and
    # every relay outcome rewrites each index of its items (the status is indexed).
    plan = models.ForeignKey(
        ReplayPlan, on_delete=models.CASCADE, related_name="items", db_index=False
    )
    # No database constraint (migration 0018), as on the state and search rows: its check at
    # the freeze's commit locked every frozen entry's wide row (``FOR KEY SHARE``), dirtying
    # the whole dead-letter table, half of a 1M-entry freeze's time. The freeze inserts an
    # item only for an entry whose state row it holds locked; entries leave by whole
    # partitions, which delete their items first (``dlq.capture.partitions``), and an ORM
    # delete still cascades.
    entry = models.ForeignKey(
        "dlq.DeadLetter", on_delete=models.CASCADE, related_name="items", db_constraint=False
    )
    position = models.PositiveIntegerField()  # replay order within the plan
    status = models.CharField(max_length=10, choices=ItemStatus.choices, default="pending")
    attempts = models.PositiveSmallIntegerField(default=0)
    replay_id = models.CharField(max_length=64, blank=True)
    publishes = models.PositiveIntegerField(default=0)  # every publish, in doubt or not
    republished = models.BooleanField(default=False)  # published again while in doubt
    last_error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The relay batch's audit record that lists this item's terminal outcome
    # (``OUTCOME_ACTION``, ``dlq.plans.relay_outcomes``); written with the outcome.
    outcome_event = models.ForeignKey(
        "audit.AuditEvent",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )

    class Meta:
        ordering = ["plan", "position"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "entry"], name="dlq_item_unique_entry")
        ]
        indexes = [
            models.Index(fields=["plan", "status", "position"], name="dlq_item_plan_status_pos"),
            # The plan page's problems, in plan order (migration 0019). Only items with an error
            # have an entry: a confirmed outcome clears it, so the relay's usual write adds none.
            models.Index(
                fields=["plan", "position"],
                condition=~models.Q(last_error=""),
                name="dlq_item_plan_error_pos",
            ),
        ]

    def __str__(self) -> str:
        return f"item {self.pk} of plan {self.plan_id}"

    @property
    def in_flight(self) -> bool:
        """A first attempt the relay took from its plan's cursor (``claimed_through``) whose
        outcome is not recorded yet: PENDING in the row, but published or being published.
        Pages say "Sending" for it (they select the plan with the item)."""
        return (
            self.status == ItemStatus.PENDING
            and self.publishes == 0
            and self.position < self.plan.claimed_through
        )

    @property
    def shown_status(self) -> str:
        """The status a person reads: "Sending" for an item ``in_flight``."""
        return ItemStatus.SENDING.label if self.in_flight else self.get_status_display()


def items_in_status(plan: ReplayPlan, status: str) -> models.QuerySet[ReplayItem]:
    """The plan's items in ``status``, in plan order, each with its plan: a walk of the
    ``(plan, status, position)`` index."""
    items = ReplayItem.objects.filter(plan=plan, status=status).select_related("plan")
    return items.order_by("position")


def first_items(plan: ReplayPlan, size: int) -> list[ReplayItem]:
    """The plan's first ``size`` items in plan order, each with its plan (``shown_status``
    reads the plan's cursor). One walk per status (``items_in_status``), merged here: no index
    orders a plan's items by position alone, so ``ORDER BY position`` sorted every item of the
    plan (170 ms for a plan of 1M), and a further index would cost every relay outcome a
    write."""
    found = [item for status in ItemStatus.values for item in items_in_status(plan, status)[:size]]
    return heapq.nsmallest(size, found, key=lambda item: item.position)


def items_with_errors(plan: ReplayPlan) -> models.QuerySet[ReplayItem]:
    """The plan's items with an error, in plan order: a walk of the partial index
    ``dlq_item_plan_error_pos`` (migration 0019). The page shows only the entry's id, so the
    wide dead-letter rows are not joined."""
    return ReplayItem.objects.filter(plan=plan).exclude(last_error="").order_by("position")


def first_replay_id(plan: ReplayPlan | int) -> models.Expression:
    """The replay id of an item's first attempt, ``"<plan>:<item>:1"``, as the database computes
    it in an UPDATE of the plan's items (the freeze writes it with each item)."""
    plan_id = plan if isinstance(plan, int) else plan.pk
    return Concat(
        models.Value(f"{plan_id}:"),
        Cast("id", models.CharField()),
        models.Value(":1"),
        output_field=models.CharField(),
    )


def stored_or_first_replay_id(plan: ReplayPlan | int) -> models.Expression:
    """An item's stored replay id, else its first attempt's (``first_replay_id``): for an item
    frozen before the freeze wrote them, in the UPDATE that records its first attempt."""
    return models.Case(
        models.When(replay_id="", then=first_replay_id(plan)), default=models.F("replay_id")
    )


#: A relay batch's one audit record (target: the plan): every message of the batch that reached
#: a terminal outcome, as rows of ``OUTCOME_FIELDS`` under ``after["messages"]``.
OUTCOME_ACTION = "dlq.replay.outcomes"


OUTCOME_FIELDS = ("entry", "item", "replay_id", "attempts", "outcome", "error")


#: A discard batch's one audit record (target: the plan): every entry of the batch,
#: ``discarded`` or ``skipped`` (it changed state since the freeze), with the state it had.
DISCARD_OUTCOME_ACTION = "dlq.discard.outcomes"


DISCARD_FIELDS = ("entry", "item", "outcome", "was")


#: The batch records, whose ``after`` lists ``messages`` under ``fields`` (``outcome_in``).
BATCH_RECORD_ACTIONS = (OUTCOME_ACTION, DISCARD_OUTCOME_ACTION)


def outcome_in(after: object, entry_id: int) -> dict[str, object] | None:
    """What a batch record's ``after`` says about one entry (a dict of ``OUTCOME_FIELDS``), or
    None when the record does not list it (or is not such a record)."""
    if not isinstance(after, dict) or not isinstance(after.get("messages"), list):
        return None
    fields = after.get("fields")
    if not isinstance(fields, list) or not fields or fields[0] != "entry":
        return None
    for row in after["messages"]:
        if isinstance(row, list) and row and row[0] == entry_id:
            return dict(zip(fields, row, strict=False))
    return None


def outcome_line(action: str, after: object, entry_id: int) -> str:
    """One entry's line of a batch record, for people: "replayed, attempt 1, replay id 5:9:1"
    (a relay batch), "discarded (was new)" (a discard batch); "" for any other event."""
    if action not in BATCH_RECORD_ACTIONS:
        return ""
    mine = outcome_in(after, entry_id)
    if mine is None:
        return "does not list this entry"
    outcome = mine.get("outcome")
    if "was" in mine:
        return f"{outcome} (was {mine['was'] or 'gone'})"
    attempts, replay_id = mine.get("attempts"), mine.get("replay_id")
    text = f"{outcome}, attempt {attempts}, replay id {replay_id}"
    return f"{text}: {mine['error']}" if mine.get("error") else text


def outcome_records(target_type: str, target_id: str) -> list[int]:
    """The batch records that list a dead letter's outcomes (``audit.filters``'s related
    events for an entry): one per plan that replayed or discarded it, newest ``RELATED_MAX``."""
    if target_type not in ("", "dlq.deadletter") or not (
        target_id.isascii() and target_id.isdigit() and len(target_id) < 19
    ):
        return []
    return list(
        ReplayItem.objects.filter(entry_id=int(target_id), outcome_event__isnull=False)
        .order_by("-id")
        .values_list("outcome_event_id", flat=True)[:RELATED_MAX]
    )


RELATED_MAX = 100


#: The header a replay carries: ``<plan>-<item>-<attempt>`` (``parse_replay_id``).
REPLAY_ID_HEADER = "x-dlq-replay-id"


def parse_replay_id(value: object) -> tuple[int, int, int] | None:
    """``(plan_id, item_id, attempt)`` from an ``x-dlq-replay-id`` header value, else None."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    parts = value.split(":")
    # isascii: a hostile header of "1:²:1" passes isdigit() yet int() refuses it.
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and 0 < len(p) < 19 for p in parts):
        return None
    plan_id, item_id, attempt = (int(p) for p in parts)
    return plan_id, item_id, attempt
