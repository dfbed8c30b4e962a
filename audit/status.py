"""The audit log's health at a glance, for the audit page and ``/metrics``: the sealing
window, the last signed checkpoint, and whether the database still matches it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

from django.conf import settings
from django.utils import timezone

from audit.chain import MerkleFrontier
from audit.checkpoints import Checkpoint, checkpoint_dir
from audit.checkpoints import latest as latest_in_dir
from audit.models import AuditHead
from audit.sealer import unsealed_status
from dashboard.egress import shown_url

CHECKPOINT_LATE_S = 180  # three missed minutes


@dataclasses.dataclass
class LogStatus:
    head_seq: int
    unsealed: int
    unsealed_age_s: float
    unsealed_late: bool
    refused: int  # rows the sealer refused (no valid MAC, misdated): an attack or a bug
    configured: bool
    checkpoint: Checkpoint | None
    checkpoint_age_s: float | None
    checkpoint_error: str
    checkpoint_ok: bool
    matches: bool | None  # the head's Merkle root vs the latest checkpoint, when comparable
    problems: list[str]


def _latest_file(head: AuditHead | None) -> Checkpoint | None:
    directory = checkpoint_dir()
    if directory is None or not directory.is_dir():
        return None
    return latest_in_dir(directory, head.checkpoint_number if head else 0)


def _shown_error(error: str) -> str:
    """The stored checkpoint error without the webhook URL's secrets (user info, query), also
    for an error stored before the sender stopped quoting them."""
    url = settings.DLO_AUDIT_CHECKPOINT_WEBHOOK
    if url and url in error:
        error = error.replace(url, shown_url(url))
    return _URL_SECRETS.sub(_strip_secrets, error)


_URL_SECRETS = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s]+")


def _strip_secrets(match: re.Match[str]) -> str:
    text = match.group(0)
    trailing = text[len(text.rstrip(".,;:)'\"")) :]
    return shown_url(text[: len(text) - len(trailing)]) + trailing


def log_status(now: dt.datetime | None = None) -> LogStatus:
    now = now or timezone.now()
    head = AuditHead.objects.filter(pk=1).first()
    unsealed = unsealed_status()
    configured = bool(settings.DLO_AUDIT_SIGNING_KEY and settings.DLO_AUDIT_CHECKPOINT_DIR)
    try:
        latest = _latest_file(head)
    except OSError:
        latest = None
    problems: list[str] = []
    age = (now - head.checkpoint_at).total_seconds() if head and head.checkpoint_at else None
    error = _shown_error(head.checkpoint_error) if head else ""
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
    if unsealed["refused"]:
        problems.append(
            f"The sealer refused {unsealed['refused']} audit events without a valid MAC or "
            "dated too far back: rows not written by the application (see the "
            "audit.event_refused events)."
        )
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
        refused=unsealed["refused"],
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
    return _latest_file(AuditHead.objects.filter(pk=1).first())
