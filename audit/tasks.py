"""Celery tasks of the audit trail: thin wrappers over actions."""

from __future__ import annotations

from celery import shared_task

from audit.actions import Actor, do_verify_chain


@shared_task(acks_late=True)
def verify_audit_chain_task() -> dict[str, object]:
    """Walk the chain (a million events take a while: never inside a web request)."""
    result = do_verify_chain(Actor.system("audit-verifier"))
    return {"ok": result.ok, "events": result.events, "first_bad_seq": result.first_bad_seq}
