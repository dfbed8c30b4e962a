"""Audited actions of the audit trail itself (verification requests, exports, denials,
cosignatures). The writer, ``record``, lives in ``audit.recording`` and the verification in
``audit.verify``; both are re-exported here, where most callers import them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent, AuditHead, ChainVerification, Outcome
from audit.recording import (  # noqa: F401 - re-exported: callers record through audit.actions
    Actor,
    EventSpec,
    _copy_events,
    _event_fields,
    diff,
    record,
    record_many,
)
from audit.tasks import verify_audit_chain_task
from audit.verify import do_verify_chain, verify_chain  # noqa: F401 - re-exported


def _verification_running() -> bool:
    """A walk started recently and not finished (an abandoned one stops counting after the
    task time limit, so a crashed worker cannot block verification for good)."""
    cutoff = timezone.now() - dt.timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT)
    return ChainVerification.objects.filter(
        finished_at__isnull=True, started_at__gte=cutoff
    ).exists()


@transaction.atomic
def do_request_chain_verification(actor: Actor) -> bool:
    """Queue a walk of the chain after commit (never inside the request). Returns False, and
    queues nothing, while another walk is still running."""
    if _verification_running():
        return False
    record(
        "audit.verify_requested",
        actor=actor,
        target_type="audit.chain",
        target_repr="hash chain",
    )
    transaction.on_commit(verify_audit_chain_task.delay)
    return True


@transaction.atomic
def do_record_export(actor: Actor, *, fmt: str, filters: Mapping[str, str]) -> int:
    """Audit an export before it streams, and return the last seq it covers: the head sealed
    before this event was recorded, a fixed range however long the download takes."""
    head = AuditHead.objects.filter(pk=1).values_list("seq", flat=True).first() or 0
    record(
        "audit.export",
        actor=actor,
        target_type="audit.trail",
        target_repr=f"{fmt} export",
        after={"format": fmt, "filters": dict(filters), "up_to_seq": head},
    )
    return head


@transaction.atomic
def do_record_denial(
    action: str,
    *,
    actor: Actor,
    target_type: str,
    target_repr: str,
    reason: str = "permission denied",
    details: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Record a refused attempt (a 403, a throttled sign-in): who tried what, from where."""
    return record(
        action,
        actor=actor,
        target_type=target_type,
        target_repr=target_repr[:300],
        reason=reason,
        after=details,
        outcome=Outcome.DENIED,
    )


@transaction.atomic
def do_record_cosignature(fields: Mapping[str, Any]) -> Any:
    """Keep a witness's cosignature of a checkpoint (already checked by the caller against the
    stored tree and the witness's key): one row per witness key and checkpoint, its time moved
    on at each poll. Not an audit event: a receipt, not an action, and recording one would grow
    the log, call for another checkpoint and so another cosignature, once a minute forever."""
    from audit.models import AuditCosignature

    cosignature, _ = AuditCosignature.objects.update_or_create(
        key_id=fields["key_id"],
        checkpoint_number=fields["checkpoint_number"],
        defaults=dict(fields),
    )
    return cosignature
