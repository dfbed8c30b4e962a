"""The audit log's health at a glance, for the audit page and ``/metrics``: the sealing
window, the last signed checkpoint, and whether the database still matches it."""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.conf import settings
from django.utils import timezone

from audit.chain import MerkleFrontier
from audit.checkpoints import Checkpoint, checkpoint_dir, read_dir
from audit.models import AuditHead
from audit.sealer import unsealed_status

CHECKPOINT_LATE_S = 180  # three missed minutes


@dataclasses.dataclass
class LogStatus:
    head_seq: int
    unsealed: int
    unsealed_age_s: float
    unsealed_late: bool
    configured: bool
    checkpoint: Checkpoint | None
    checkpoint_age_s: float | None
    checkpoint_error: str
    checkpoint_ok: bool
    matches: bool | None  # the head's Merkle root vs the latest checkpoint, when comparable
    problems: list[str]


def _latest_file() -> Checkpoint | None:
    directory = checkpoint_dir()
    if directory is None or not directory.is_dir():
        return None
    found = read_dir(directory)
    return found[-1] if found else None


def log_status(now: dt.datetime | None = None) -> LogStatus:
    now = now or timezone.now()
    head = AuditHead.objects.filter(pk=1).first()
    unsealed = unsealed_status()
    configured = bool(settings.DLO_AUDIT_SIGNING_KEY and settings.DLO_AUDIT_CHECKPOINT_DIR)
    try:
        latest = _latest_file()
    except OSError:
        latest = None
    problems: list[str] = []
    age = (now - head.checkpoint_at).total_seconds() if head and head.checkpoint_at else None
    error = head.checkpoint_error if head else ""
    matches: bool | None = None
    if head is None and unsealed["count"] + (latest.tree_size if latest else 0):
        problems.append("The head row is missing: run `manage.py audit verify`.")
    if latest is not None and head is not None and latest.tree_size == head.seq:
        frontier = MerkleFrontier.loads(head.frontier)
        matches = frontier.root() == latest.body.get("root_hash")
    elif latest is not None and head is not None and latest.tree_size > head.seq:
        matches = False
    if matches is False:
        problems.append(
            f"The database no longer matches signed checkpoint #{latest.number if latest else 0}"
            ": run `manage.py audit verify`."
        )
    if not configured:
        problems.append(
            "No signed checkpoints: set DLO_AUDIT_SIGNING_KEY and DLO_AUDIT_CHECKPOINT_DIR "
            "(docs/audit.md). Events are still recorded and chained."
        )
    elif error:
        problems.append(f"Checkpoints are failing: {error}. Events are still recorded.")
    late = (
        head is not None
        and head.seq > head.checkpoint_tree_size
        and (age is None or age > CHECKPOINT_LATE_S)
    )
    if configured and not error and late:
        problems.append("No checkpoint for more than three minutes although the log grew.")
    unsealed_late = unsealed["oldest_age_s"] > settings.DLO_AUDIT_UNSEALED_WARN_S
    if unsealed_late:
        problems.append(
            f"{unsealed['count']} audit events have waited {unsealed['oldest_age_s']:.0f} s to "
            "be sealed: is the sealer (worker or scheduler) running?"
        )
    return LogStatus(
        head_seq=head.seq if head else 0,
        unsealed=unsealed["count"],
        unsealed_age_s=unsealed["oldest_age_s"],
        unsealed_late=unsealed_late,
        configured=configured,
        checkpoint=latest,
        checkpoint_age_s=age,
        checkpoint_error=error,
        checkpoint_ok=configured and not error and not late and matches is not False,
        matches=matches,
        problems=problems,
    )


def latest_checkpoint() -> Checkpoint | None:
    """The newest signed checkpoint in the sink (``None``: no sink or none written yet)."""
    return _latest_file()
