"""Dead-letter entries and the failure groups they fall into.

An entry keeps the message exactly as the broker handed it over: the body as raw bytes, the
headers and properties as JSON-safe data (see ``brokers.base.json_safe_headers``). Everything
else on the row is derived at ingest time, for filtering and display.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import models
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from channels_registry.health import Unresolved
from channels_registry.models import Channel


class Source(models.TextChoices):
    DLQ = "dlq", "DLQ"
    POISON = "poison", "Poison"


class Status(models.TextChoices):
    NEW = "new", "New"
    REPLAYING = "replaying", "Replaying"
    REPLAYED = "replayed", "Replayed"
    FAILED = "failed", "Replay failed"
    DISCARDED = "discarded", "Discarded"


# Entries in these states are resolved: their payload may be purged after the retention window.
RESOLVED = (Status.REPLAYED, Status.DISCARDED)
#: Entry states still waiting for triage, on ``EntryState`` (its partial indexes serve these
#: counts; ``~Q(state__status__in=RESOLVED)`` on ``DeadLetter``).
OPEN_Q = ~models.Q(status__in=RESOLVED)


class FailureGroup(models.Model):
    """Entries of one channel that failed the same way (see ``dlq.capture.fingerprint``)."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="failure_groups")
    fingerprint = models.CharField(max_length=64)
    reason = models.CharField(max_length=100, blank=True)
    error_class = models.CharField(max_length=300, blank=True)
    normalized_error = models.TextField(blank=True)
    count = models.BigIntegerField(default=0)
    # Entries not yet replayed or discarded (see ``refresh_open_counts``): the triage order.
    open_count = models.BigIntegerField(default=0)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    message_type = models.CharField(max_length=200, blank=True)
    sample = models.ForeignKey(
        "DeadLetter", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-last_seen"]
        indexes = [
            # The groups page: most open entries first, walked and cut (LIMIT) along this.
            models.Index(
                fields=["-open_count", "-last_seen", "-id"],
                condition=models.Q(count__gt=0),
                name="dlq_group_triage_order",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "fingerprint"], name="failuregroup_unique_fingerprint"
            )
        ]

    def __str__(self) -> str:
        return f"{self.reason or 'unknown'}: {self.error_class or self.normalized_error[:60]}"

    def get_absolute_url(self) -> str:
        return reverse("dlq:entry_list") + f"?group={self.pk}"


class DeadLetter(models.Model):
    """One dead-lettered message. ``body`` is NULL once retention purged it (``purged_at`` set):
    the row stays as a tombstone with its hash, size and metadata."""

    # No single-column index on channel or group: (channel, id) and (group, id) cover them.
    channel = models.ForeignKey(
        Channel, on_delete=models.PROTECT, related_name="dead_letters", db_index=False
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.DLQ)
    dedupe_key = models.CharField(max_length=200, unique=True)
    body = models.BinaryField(null=True, blank=True)
    body_sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    content_type = models.CharField(max_length=200, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    properties = models.JSONField(default=dict, blank=True)
    reason = models.CharField(max_length=100, blank=True)
    error_class = models.CharField(max_length=300, blank=True)
    error_message = models.TextField(blank=True)
    redelivery_count = models.PositiveIntegerField(null=True, blank=True)
    first_death_queue = models.CharField(max_length=255, blank=True)
    first_death_exchange = models.CharField(max_length=255, blank=True)
    first_death_at = models.DateTimeField(null=True, blank=True)
    # The broker's dead-letter time when it gives one, else the ingest time (never NULL, so
    # time-range filters need no special case).
    dead_lettered_at = models.DateTimeField()
    ingested_at = models.DateTimeField(default=timezone.now)
    idempotency_key = models.CharField(max_length=255, blank=True)
    missing_idempotency_key = models.BooleanField(default=False)
    schema_version = models.CharField(max_length=50, blank=True)
    # Why the body fails the channel's registered schema: {"path": "$.amount", "message": …}.
    schema_error = models.JSONField(default=dict, blank=True)
    # The job or message type (Celery task name, Sidekiq class, or the declared header/path),
    # and what a recognised job client says about it (id, retries, args as the client showed).
    message_type = models.CharField(max_length=200, blank=True)
    job = models.JSONField(default=dict, blank=True)
    # True: parses as JSON; False: should and does not; NULL: not JSON by its content type.
    is_parseable = models.BooleanField(null=True)
    death_history = models.JSONField(default=list, blank=True)
    group = models.ForeignKey(
        FailureGroup,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="entries",
        db_index=False,
    )
    parent = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="children"
    )
    # How many replays of this message dead-lettered again (parent's generation + 1).
    generation = models.PositiveSmallIntegerField(default=0)
    purged_at = models.DateTimeField(null=True, blank=True)
    # Lower-cased, redacted, truncated text of body and headers for the text filter. Redacted
    # so a search cannot probe hidden values; emptied when the body is purged. Not indexed
    # here: the filter searches ``SearchText``, its indexed copy filled off the ingest path.
    search_text = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["channel", "id"], name="dlq_entry_channel_id"),
            models.Index(fields=["group", "id"], name="dlq_entry_group_id"),
            models.Index(fields=["reason", "id"], name="dlq_entry_reason_id"),
            models.Index(fields=["idempotency_key"], name="dlq_entry_idem"),
            models.Index(fields=["channel", "message_type", "id"], name="dlq_entry_type_id"),
            models.Index(fields=["dead_lettered_at"], name="dlq_entry_dead_at"),
        ]
        permissions = [
            ("replay_deadletter", "Can replay dead letters"),
            ("discard_deadletter", "Can discard dead letters"),
            ("approve_bulk_action", "Can approve another person's bulk replay or discard"),
        ]

    def __str__(self) -> str:
        return f"dead letter #{self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("dlq:entry_detail", args=[self.pk])

    @property
    def is_purged(self) -> bool:
        return self.purged_at is not None

    @property
    def is_repeat_offender(self) -> bool:
        """Replayed ``REPEAT_OFFENDER_REPLAYS`` times and back in the DLQ every time."""
        return self.generation >= REPEAT_OFFENDER_REPLAYS

    @property
    def status(self) -> str:
        """The entry's status, read from its narrow state row (``EntryState``): select it with
        ``select_related("state")`` when reading many entries."""
        return self.state.status

    def get_status_display(self) -> str:
        return self.state.get_status_display()

    @property
    def is_resolved(self) -> bool:
        return self.status in RESOLVED

    def eviction_at(self) -> dt.datetime | None:
        """When retention will purge the payload, if the entry is resolved and has a window."""
        retention = self.channel.retention_s
        if not retention or self.is_purged or not self.is_resolved:
            return None
        return self.ingested_at + dt.timedelta(seconds=retention)

    def near_eviction(self, now: dt.datetime | None = None) -> bool:
        """Within the last 10% of the retention window (the pages warn about these)."""
        eviction = self.eviction_at()
        if eviction is None or not self.channel.retention_s:
            return False
        margin = dt.timedelta(seconds=self.channel.retention_s * 0.1)
        return (now or timezone.now()) >= eviction - margin


class EntryState(models.Model):
    """What changes about an entry, in a narrow row of its own: its status.

    The dead-letter row (body, headers, metadata, ~2.5 KB with its indexes) is written once by
    ingest and never rewritten by a freeze, a replay or a discard; those update this row. It
    also carries copies of the entry's columns that never change and that the open counts
    filter by (channel, source, group, times), so the board's "+N stored", the groups'
    open counts and the alerts read this table's partial indexes alone.

    A trigger makes the row with every insert into ``dlq_deadletter``, whoever inserts, and
    another copies the columns above when an update names one of them (migration 0015); the
    row leaves with its entry (the ORM's delete, or the partition drop:
    ``dlq.capture.partitions``). The entry's state is one primary-key lookup. On SQLite a
    migration that rebuilds ``dlq_deadletter`` (SQLite's way to alter a column) drops the
    triggers: such a migration must create them again (``tests/dlq/test_entry_state.py``
    fails otherwise).
    """

    # No database constraint: entries leave by whole partitions (retention), and this row
    # goes with them. CASCADE is the ORM's: deleting an entry deletes its state.
    entry = models.OneToOneField(
        DeadLetter,
        on_delete=models.CASCADE,
        primary_key=True,
        db_constraint=False,
        related_name="state",
    )
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.NEW)
    channel = models.ForeignKey(
        Channel, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.DLQ)
    group = models.ForeignKey(
        FailureGroup,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="+",
    )
    ingested_at = models.DateTimeField()
    dead_lettered_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["status", "entry"], name="dlq_state_status_entry"),
            models.Index(fields=["group"], condition=OPEN_Q, name="dlq_state_open_group"),
            models.Index(
                fields=["channel", "source"], condition=OPEN_Q, name="dlq_state_open_channel"
            ),
        ]

    def __str__(self) -> str:
        return f"state of {self.entry_id}: {self.status}"


def set_status(entry_ids: list[int], status: str, only: models.Q | None = None) -> int:
    """Set the status of these entries (``only``: a Q on ``EntryState`` they must match, e.g.
    ``Q(status=Status.REPLAYING)``); returns how many changed. The one write of an entry's
    status."""
    rows = EntryState.objects.filter(pk__any=entry_ids)
    if only is not None:
        rows = rows.filter(only)
    return rows.update(status=status)


class SearchText(models.Model):
    """The text filter's index: a narrow copy of ``DeadLetter.search_text`` with the trigram
    GIN index (PostgreSQL, migration 0009), kept off the dead-letter table so neither ingest
    nor a replay's status updates pay ~300 trigram keys per row. Filled after the ingest
    commit (``dlq.capture.search``); a search misses an entry only for that moment."""

    # No database constraint: entries leave by whole partitions (retention), and this row
    # goes with them (``dlq.capture.search.forget``).
    entry = models.OneToOneField(
        DeadLetter,
        on_delete=models.DO_NOTHING,
        primary_key=True,
        db_constraint=False,
        related_name="search",
    )
    text = models.TextField()

    def __str__(self) -> str:
        return f"search text of {self.entry_id}"


class DeadLetterKey(models.Model):
    """Deduplication on PostgreSQL, where ``dlq_deadletter`` is partitioned
    (``dlq.capture.partitions``) and so cannot carry ``UNIQUE (dedupe_key)``: one row per stored
    entry's key. Ingest inserts keys first (``ON CONFLICT DO NOTHING``) and stores only the entries
    whose key it inserted; a trigger does the same for every other insert (a duplicate raises
    ``IntegrityError``) and follows updates and deletes. Keys leave with their partition. Unused on
    SQLite, where the dead-letter table keeps its unique constraint."""

    dedupe_key = models.CharField(max_length=200, primary_key=True)

    class Meta:
        db_table = "dlq_deadletter_key"

    def __str__(self) -> str:
        return self.dedupe_key


REPEAT_OFFENDER_REPLAYS = 3


def refresh_open_counts(entry_ids: list[int]) -> None:
    """Recount ``open_count`` of the groups of these entries, after their status changed.

    A recount rather than a +/- delta: entries move between many statuses (replaying, failed,
    back to new on a cancel), and a recount cannot drift. Each count reads the partial index.
    """
    groups = (
        EntryState.objects.filter(pk__any=entry_ids, group__isnull=False)
        .values_list("group_id", flat=True)
        .distinct()
    )
    refresh_group_counts(list(groups))


def refresh_group_counts(group_ids: list[int]) -> None:
    """``refresh_open_counts`` for groups already known (the relay reads each entry's group
    with its message, so it need not look them up again)."""
    if not group_ids:
        return
    open_entries = (
        EntryState.objects.filter(OPEN_Q, group=models.OuterRef("pk"))
        .order_by()
        .values("group")
        .annotate(n=models.Count("entry_id"))
        .values("n")
    )
    FailureGroup.objects.filter(pk__in=group_ids).update(
        open_count=Coalesce(models.Subquery(open_entries), 0)
    )


def count_unresolved(channel_ids: list[int], before: dt.datetime) -> dict[int, Unresolved]:
    """Stored dead letters not yet resolved, per channel, ingested up to ``before``: what the
    board and the channel page show beside the broker's own DLQ depth (registered with
    ``channels_registry.polling`` by ``DlqConfig.ready``). One query on the state rows'
    partial index."""
    rows = (
        EntryState.objects.filter(OPEN_Q, channel_id__in=channel_ids, ingested_at__lte=before)
        .values("channel_id", "source")
        .annotate(n=models.Count("entry_id"), oldest=models.Min("dead_lettered_at"))
        .order_by()
    )
    counts: dict[int, dict[str, Any]] = {}
    for row in rows:
        mine = counts.setdefault(row["channel_id"], {"dlq": 0, "poison": 0, "oldest": []})
        mine["poison" if row["source"] == Source.POISON else "dlq"] += row["n"]
        mine["oldest"].append(row["oldest"].timestamp())
    return {
        pk: Unresolved(c["dlq"], c["poison"], min(c["oldest"]) if c["oldest"] else None)
        for pk, c in counts.items()
    }
