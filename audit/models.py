"""The append-only, hash-chained audit trail."""

from __future__ import annotations

from typing import Any

from django.db import models


class Outcome(models.TextChoices):
    SUCCESS = "success", "Success"
    DENIED = "denied", "Denied"
    FAILED = "failed", "Failed"


#: An event a person caused (signed in, or at least seen at an address); the others are the
#: system's own (ingest, sealing, scheduled jobs), which the audit page can fold or hide.
PERSON_Q = models.Q(actor_id__isnull=False) | models.Q(source_ip__isnull=False)


class AuditEvent(models.Model):
    """One recorded action. An action inserts it *unsealed* (``seq`` and ``hash`` null); the
    sealer then gives it its place in the log (``seq``, ``prev_hash``, ``hash``) once. Database
    triggers refuse every other update, and every delete.

    Format 2 (``hash_version=2``): ``index_json`` and ``detail_json`` are the canonical texts
    that were hashed, stored verbatim; the other content columns are copies for searching and
    display, which ``audit verify`` checks against them. Format 1 rows (before the re-anchor)
    hash their columns directly (see ``audit.chain``)."""

    seq = models.BigIntegerField(unique=True, null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)
    actor_id = models.BigIntegerField(null=True, blank=True)
    actor_username = models.CharField(max_length=150, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=300, blank=True)
    channel_slug = models.CharField(max_length=100, blank=True, db_index=True)
    reason = models.TextField(blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    changes = models.JSONField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.SUCCESS)
    plan_id = models.CharField(max_length=64, blank=True)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    hash_version = models.PositiveSmallIntegerField(default=2)
    index_json = models.TextField(blank=True)
    detail_json = models.TextField(blank=True)
    # The application's MAC over the two texts (``audit.mac``): not hashed into the chain, but
    # required by the sealer and by ``audit verify`` for every event after the MAC anchor.
    mac = models.CharField(max_length=96, blank=True)

    class Meta:
        ordering = ["seq"]
        constraints = [
            # A copy of a genuine row carries the same MAC (its nonce included): refused.
            models.UniqueConstraint(
                fields=["mac"], condition=~models.Q(mac=""), name="audit_mac_unique"
            ),
        ]
        indexes = [
            models.Index(fields=["target_type", "target_id", "seq"]),
            models.Index(fields=["actor_username", "seq"]),
            # "outcome=denied" is rare and what a review looks for: without this, a page of
            # it walks the whole trail backwards (~120 ms at 1,000,000 events on PostgreSQL).
            models.Index(fields=["outcome", "seq"], name="audit_outcome_seq"),
            models.Index(fields=["plan_id", "seq"], name="audit_plan_seq"),
            # The audit page with system events hidden: people's actions, newest first, without
            # walking past a million ingest events (see ``PERSON_Q``).
            models.Index(
                fields=["seq"],
                condition=models.Q(actor_id__isnull=False) | models.Q(source_ip__isnull=False),
                name="audit_person_seq",
            ),
            # What the sealer reads: the few rows not sealed yet, in arrival order.
            models.Index(
                fields=["id"], condition=models.Q(seq__isnull=True), name="audit_unsealed"
            ),
        ]
        permissions = [
            ("export_auditevent", "Can export the audit trail"),
            ("verify_auditevent", "Can verify the audit chain"),
            ("witness_auditevent", "Can read signed checkpoints and proofs, and cosign"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.action} {self.target_repr}"

    @property
    def is_system(self) -> bool:
        return self.actor_id is None and self.source_ip is None

    def canonical_fields(self) -> dict[str, Any]:
        from audit.chain import canonical_time

        return {
            "seq": self.seq,
            "created_at": canonical_time(self.created_at),
            "actor_id": self.actor_id,
            "actor_username": self.actor_username,
            "source_ip": self.source_ip,
            "action": self.action,
            "target_type": self.target_type,
            "target_id": self.target_id,
            "target_repr": self.target_repr,
            "channel_slug": self.channel_slug,
            "reason": self.reason,
            "before": self.before,
            "after": self.after,
            "changes": self.changes,
            "outcome": self.outcome,
            "prev_hash": self.prev_hash,
        }


class AuditHead(models.Model):
    """The sealer's state: the last (seq, hash) sealed and the Merkle tree's right edge, moved
    in the same transaction as each sealed batch (its row lock makes the sealer single). Also
    the last checkpoint written and the last checkpoint failure, for the page and /metrics."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, blank=True)
    frontier = models.TextField(blank=True)
    sealed_at = models.DateTimeField(null=True, blank=True)
    checkpoint_number = models.BigIntegerField(default=0)
    checkpoint_tree_size = models.BigIntegerField(default=0)
    checkpoint_root = models.CharField(max_length=64, blank=True)
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    checkpoint_error = models.TextField(blank=True)
    checkpoint_error_at = models.DateTimeField(null=True, blank=True)
    # The latest created_at sealed so far: the sealer refuses a row dated further back than
    # DLO_AUDIT_CLOCK_TOLERANCE_S (``audit verify`` checks the same over the whole log).
    created_max = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"head #{self.seq}"


class RefusedEvent(models.Model):
    """An unsealed row the sealer refused (no valid MAC, or dated too far before the log's
    head): it stays out of the chain, and is shown on the audit page and in ``/metrics``. The
    sealer also records an ``audit.event_refused`` event for it (the alarm)."""

    event_id = models.BigIntegerField(unique=True)
    refused_at = models.DateTimeField(auto_now_add=True)
    problem = models.TextField()

    def __str__(self) -> str:
        return f"refused row id={self.event_id}: {self.problem}"


class ChainVerification(models.Model):
    """The result of one walk of the chain (shown on the audit page)."""

    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True)
    events = models.BigIntegerField(default=0)
    head_seq = models.BigIntegerField(null=True, blank=True)
    head_hash = models.CharField(max_length=64, blank=True)
    first_bad_seq = models.BigIntegerField(null=True, blank=True)
    problem = models.TextField(blank=True)
    checkpoints_matched = models.BigIntegerField(default=0)
    notes = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]
        get_latest_by = "started_at"

    def __str__(self) -> str:
        return f"verification {self.started_at:%Y-%m-%d %H:%M} ok={self.ok}"


class AuditTreeNode(models.Model):
    """One complete subtree of the RFC 9162 Merkle tree over the sealed events: ``level`` 0 is
    the leaf of event ``seq = index + 1``; level ``h`` covers leaves ``[index·2^h,
    (index+1)·2^h)``. Written once, as checkpoints are written (``audit.tree``), so that a
    consistency proof between any two tree sizes is O(log n) lookups, not a re-read."""

    pk = models.CompositePrimaryKey("level", "index")
    level = models.PositiveSmallIntegerField()
    index = models.BigIntegerField()
    hash = models.BinaryField(max_length=32)

    def __str__(self) -> str:
        return f"node {self.level}/{self.index}"


class AuditCosignature(models.Model):
    """A witness's cosignature of a checkpoint it checked (``audit/witness.py --cosign``): the
    tree head it saw consistent with every head it saw before, for the audit page."""

    witness = models.CharField(max_length=100)
    key_id = models.CharField(max_length=16)
    checkpoint_number = models.BigIntegerField()
    tree_size = models.BigIntegerField()
    root_hash = models.CharField(max_length=64)
    witnessed_at = models.DateTimeField(db_index=True)  # the time the witness signed
    signature = models.CharField(max_length=128)
    received_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-witnessed_at"]
        get_latest_by = "witnessed_at"

    def __str__(self) -> str:
        return f"{self.witness} cosigned #{self.checkpoint_number} ({self.tree_size} events)"
