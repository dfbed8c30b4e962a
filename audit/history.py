"""The checkpoint history as the log itself remembers it.

A counter on the head row (``checkpoint_number``) is the database's word, and whoever rewrites
the database can set it back. So each checkpoint written is also recorded *in the chain*, as an
``audit.checkpoint`` event (number, tree size, root) that is hashed, MACed and covered by the
next checkpoint: deleting checkpoint files below the latest recorded one, or all of them, is
BROKEN, and so is a log that has outlived its first checkpoint interval with no checkpoint at
all although checkpoints are configured. (Cutting the log's tail *and* the newest files *and*
the counter together is what only a witness outside the host can see.)
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.conf import settings
from django.utils import timezone

from audit.models import AuditEvent, AuditHead
from audit.recording import Actor, record

ACTION = "audit.checkpoint"
TARGET_TYPE = "audit.checkpoint"


def grace_s() -> float:
    """How long a new log may go without its first checkpoint."""
    return max(60.0, 3.0 * settings.DLO_AUDIT_CHECKPOINT_INTERVAL_S)


def record_checkpoint(cp: Any) -> None:
    """Record checkpoint ``cp`` in the log (called after its file is written)."""
    record(
        ACTION,
        actor=Actor.system("audit-checkpoint"),
        target_type=TARGET_TYPE,
        target_repr=f"signed checkpoint #{cp.number}",
        after={
            "number": cp.number,
            "tree_size": cp.tree_size,
            "root_hash": cp.body.get("root_hash"),
            "key_id": cp.body.get("key_id"),
        },
    )


def only_own_record_since(head: AuditHead | None) -> bool:
    """The log grew since the last checkpoint by nothing but that checkpoint's own record:
    no new checkpoint is due (else each record would call for the next checkpoint)."""
    if head is None or head.seq != head.checkpoint_tree_size + 1:
        return False
    return AuditEvent.objects.filter(seq=head.seq, action=ACTION).exists()


def latest_recorded() -> tuple[int, dict[str, Any]] | None:
    """(seq, facts) of the newest ``audit.checkpoint`` event (the hashed text's ``after``):
    one index probe on (target_type, target_id, seq)."""
    row = (
        AuditEvent.objects.filter(seq__isnull=False, target_type=TARGET_TYPE, target_id="")
        .order_by("-seq")
        .values_list("seq", "detail_json")
        .first()
    )
    if row is None:
        return None
    try:
        after = json.loads(row[1]).get("after")
    except (ValueError, AttributeError):
        after = None
    return int(row[0] or 0), after if isinstance(after, dict) else {}


def checkpoint_history_problem(
    checkpoints: list[Any], head: AuditHead | None, now: dt.datetime | None = None
) -> str:
    """What is wrong with the checkpoint history as a whole ("" when nothing): files deleted
    below what the chain records, a recorded checkpoint whose file was replaced, or no
    checkpoint at all for a log older than the grace period."""
    recorded = latest_recorded()
    last = checkpoints[-1].number if checkpoints else 0
    if recorded is not None:
        seq, facts = recorded
        number = facts.get("number")
        if isinstance(number, int) and number > last:
            gone = f" #{number} was" if number == last + 1 else f"s #{last + 1}–#{number} were"
            return (
                f"the audit log records signed checkpoint #{number} (event #{seq}) but the "
                f"checkpoint directory ends at #{last}: checkpoint{gone} deleted from the sink"
            )
        by_number = {cp.number: cp for cp in checkpoints}
        cp = by_number.get(number) if isinstance(number, int) else None
        if cp is not None and (
            cp.tree_size != facts.get("tree_size")
            or cp.body.get("root_hash") != facts.get("root_hash")
        ):
            return (
                f"checkpoint #{number} is not the one the audit log recorded at event #{seq} "
                "(tree size or root differ): the checkpoint file was replaced"
            )
    if checkpoints:
        return ""
    first = (
        AuditEvent.objects.filter(seq__isnull=False)
        .order_by("seq")
        .values_list("created_at", flat=True)
        .first()
    )
    if first is None:
        return ""
    now = now or timezone.now()
    age = (now - first).total_seconds()
    if age <= grace_s():
        return ""
    size = head.seq if head is not None else "?"
    return (
        f"no signed checkpoint, although checkpoints are configured and the log ({size} "
        f"events) began {age:.0f} s ago: the checkpoint history was deleted, or checkpoints "
        "never ran (the audit page shows why)"
    )
