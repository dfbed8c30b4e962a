"""Celery tasks of the audit trail: thin wrappers over actions."""

from __future__ import annotations

import logging

from celery import shared_task

from audit.recording import Actor
from audit.verify import do_verify_chain

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def verify_audit_chain_task() -> dict[str, object]:
    """Walk the chain (a million events take a while: never inside a web request)."""
    result = do_verify_chain(Actor.system("audit-verifier"))
    return {"ok": result.ok, "events": result.events, "first_bad_seq": result.first_bad_seq}


@shared_task(ignore_result=True)
def seal_audit_events_task() -> int:
    """Seal what no process's sealer thread did (a process that died right after commit)."""
    from audit.sealer import seal

    return seal()


@shared_task(ignore_result=True)
def write_audit_checkpoint_task() -> int:
    """The interval's signed checkpoint (nothing when the log did not grow), recorded in the
    log itself (``audit.history``). A failure is kept for the audit page, /metrics and the
    alert; recording is never affected."""
    from audit.checkpoints import CheckpointError, write_recorded_checkpoint

    try:
        checkpoint = write_recorded_checkpoint()
    except CheckpointError as exc:
        log.error("audit checkpoint not written: %s", exc)
        return 0
    return checkpoint.number if checkpoint else 0
