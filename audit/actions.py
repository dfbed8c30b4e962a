"""Writing to the audit trail. ``record`` is the only writer of ``AuditEvent`` rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator, Mapping
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.http import HttpRequest
from django.utils import timezone

from audit.chain import GENESIS, VerifyResult, canonical_time, compute_hash, verify_events
from audit.models import AuditEvent, AuditHead, ChainVerification, Outcome


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who did it: a user (id and username snapshot) or a named system actor, and from where."""

    user_id: int | None
    username: str
    ip: str | None = None

    @classmethod
    def from_request(cls, request: HttpRequest) -> Actor:
        user = getattr(request, "user", None)
        ip = request.META.get("REMOTE_ADDR") or None
        if user is not None and user.is_authenticated:
            return cls(user.pk, user.get_username(), ip)
        return cls(None, "", ip)

    @classmethod
    def for_user(cls, user: Any, ip: str | None = None) -> Actor:
        return cls(user.pk, user.get_username(), ip)

    @classmethod
    def system(cls, name: str | None = None) -> Actor:
        return cls(None, name or settings.DLO_SYSTEM_ACTOR, None)


def _clean(value: Any) -> Any:
    """JSON-normal form of ``value`` exactly as the database will give it back, with NUL
    characters (which PostgreSQL text and jsonb refuse) replaced."""
    if value is None:
        return None
    text = json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True)
    return json.loads(text.replace("\\u0000", "\\ufffd"))


def _text(value: str, limit: int | None = None) -> str:
    value = value.replace("\x00", "\ufffd")
    return value[:limit] if limit else value


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any]:
    """Field-by-field changes: ``{field: [old, new]}`` for every field whose value differs."""
    before, after = before or {}, after or {}
    return {
        key: [before.get(key), after.get(key)]
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }


def _lock_head() -> AuditHead:
    """Lock the chain's head row, creating it first if it is missing (the migration creates
    it; a wiped table does not have it). ``ignore_conflicts`` makes concurrent first writers
    agree on one row instead of failing on its primary key."""
    head = AuditHead.objects.select_for_update().filter(pk=1).first()
    if head is None:
        AuditHead.objects.bulk_create([AuditHead(pk=1, seq=0, hash="")], ignore_conflicts=True)
        head = AuditHead.objects.select_for_update().get(pk=1)
    return head


def _event_fields(
    *,
    seq: int,
    prev_hash: str,
    now: dt.datetime,
    actor: Actor,
    action: str,
    target_type: str,
    target_id: str | int,
    target_repr: str,
    channel_slug: str,
    reason: str,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    changes: Mapping[str, Any] | None,
    outcome: str,
) -> dict[str, Any]:
    """The one builder of an event's stored fields, ``hash`` included, for ``record`` and
    ``record_many``: values truncated and cleaned as the database will give them back, hashed
    over exactly what ``AuditEvent.canonical_fields()`` returns for the saved row."""
    fields: dict[str, Any] = {
        "seq": seq,
        "created_at": canonical_time(now),
        "actor_id": actor.user_id,
        "actor_username": _text(actor.username, 150),
        "source_ip": actor.ip,
        "action": action,
        "target_type": _text(target_type, 64),
        "target_id": _text(str(target_id), 64),
        "target_repr": _text(target_repr, 300),
        "channel_slug": channel_slug,
        "reason": _text(reason),
        "before": _clean(before),
        "after": _clean(after),
        "changes": _clean(changes),
        "outcome": outcome,
        "prev_hash": prev_hash,
    }
    fields["hash"] = compute_hash(fields)
    fields["created_at"] = now
    return fields


def record(
    action: str,
    *,
    actor: Actor,
    target: models.Model | None = None,
    target_type: str = "",
    target_id: str | int = "",
    target_repr: str = "",
    channel_slug: str = "",
    reason: str = "",
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    outcome: str = Outcome.SUCCESS,
) -> AuditEvent:
    """Append one event to the chain, inside the caller's transaction.

    1. Lock the head row (``SELECT … FOR UPDATE``; SQLite transactions are IMMEDIATE), so
       concurrent writers queue and the chain cannot fork.
    2. Build the event on top of the head's (seq, hash), hash it, insert it.
    3. Move the head. If the caller's transaction rolls back, all three vanish together.
    """
    if target is not None:
        target_type = target_type or target._meta.label_lower
        target_id = target_id or str(target.pk)
        target_repr = target_repr or str(target)
    with transaction.atomic():
        head = _lock_head()
        changes = diff(before, after) if before is not None and after is not None else None
        fields = _event_fields(
            seq=head.seq + 1,
            prev_hash=head.hash or GENESIS,
            now=timezone.now(),
            actor=actor,
            action=action,
            target_type=target_type,
            target_id=target_id,
            target_repr=target_repr,
            channel_slug=channel_slug,
            reason=reason,
            before=before,
            after=after,
            changes=changes,
            outcome=outcome,
        )
        event = AuditEvent(**fields)
        event.save(force_insert=True)
        AuditHead.objects.filter(pk=1).update(seq=event.seq, hash=event.hash)
    return event


def _stored_events() -> Iterator[dict[str, Any]]:
    fields = [f.name for f in AuditEvent._meta.concrete_fields if f.name != "id"]
    for row in AuditEvent.objects.order_by("seq").values(*fields).iterator(chunk_size=5000):
        row["created_at"] = canonical_time(row["created_at"])
        yield row


def verify_chain() -> VerifyResult:
    """Walk the stored chain from #1 to the recorded head (constant memory)."""
    head = AuditHead.objects.filter(pk=1).first()
    expected = (head.seq, head.hash) if head and head.seq else None
    return verify_events(_stored_events(), expected_head=expected)


def do_verify_chain(actor: Actor) -> ChainVerification:
    """Verify the chain, keep the result for the audit page, and audit the verification."""
    started = ChainVerification.objects.create()
    result = verify_chain()
    with transaction.atomic():
        ChainVerification.objects.filter(pk=started.pk).update(
            finished_at=timezone.now(),
            ok=result.ok,
            events=result.events,
            head_seq=result.head_seq,
            head_hash=result.head_hash,
            first_bad_seq=result.first_bad_seq,
            problem=result.problem,
        )
        record(
            "audit.verify",
            actor=actor,
            target_type="audit.chain",
            target_repr=result.summary()[:300],
            outcome=Outcome.SUCCESS if result.ok else Outcome.FAILED,
        )
    started.refresh_from_db()
    return started


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
    from audit.tasks import verify_audit_chain_task  # the task module imports this one

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
def do_record_export(actor: Actor, *, fmt: str, filters: Mapping[str, str]) -> AuditEvent:
    """Audit an export before it streams. The export then covers the matching events *before*
    this one (``seq < event.seq``), a fixed range however long the download takes."""
    return record(
        "audit.export",
        actor=actor,
        target_type="audit.trail",
        target_repr=f"{fmt} export",
        after={"format": fmt, "filters": dict(filters)},
    )


@dataclasses.dataclass(frozen=True)
class EventSpec:
    """One event for ``record_many`` (the same fields ``record`` takes, targets as ids)."""

    action: str
    target_type: str
    target_id: str | int
    target_repr: str = ""
    channel_slug: str = ""
    reason: str = ""
    after: Mapping[str, Any] | None = None
    outcome: str = Outcome.SUCCESS


def record_many(specs: list[EventSpec], *, actor: Actor) -> int:
    """Append many events to the chain in one go, inside the caller's transaction: the same
    chain as ``record`` (one locked head, contiguous seqs, each hash over the previous), but
    one bulk INSERT instead of three statements per event. For per-entry events of bulk actions
    (a replay batch writes one outcome per entry). Returns the number written."""
    if not specs:
        return 0
    with transaction.atomic():
        head = _lock_head()
        seq, prev = head.seq, head.hash or GENESIS
        now = timezone.now()
        rows = []
        for spec in specs:
            seq += 1
            fields = _event_fields(
                seq=seq,
                prev_hash=prev,
                now=now,
                actor=actor,
                action=spec.action,
                target_type=spec.target_type,
                target_id=spec.target_id,
                target_repr=spec.target_repr,
                channel_slug=spec.channel_slug,
                reason=spec.reason,
                before=None,
                after=spec.after,
                changes=None,
                outcome=spec.outcome,
            )
            prev = fields["hash"]
            rows.append(fields)
        if connection.vendor == "postgresql":
            _copy_events(rows)
        else:
            AuditEvent.objects.bulk_create((AuditEvent(**r) for r in rows), batch_size=500)
        AuditHead.objects.filter(pk=1).update(seq=seq, hash=prev)
    return len(rows)


_COPY_FIELDS = [f for f in AuditEvent._meta.concrete_fields if f.name != "id"]


def _copy_events(rows: list[dict[str, Any]]) -> None:
    """PostgreSQL ``COPY … FROM STDIN``: the same rows as ``bulk_create``, several times
    faster for the thousands of per-entry events a bulk action writes."""
    from psycopg.types.json import Jsonb

    columns = ", ".join(connection.ops.quote_name(f.column or f.attname) for f in _COPY_FIELDS)
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    names = [f.attname for f in _COPY_FIELDS]
    json_fields = {f.attname for f in _COPY_FIELDS if isinstance(f, models.JSONField)}
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg cursor under Django's wrapper
        with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(
                    [Jsonb(row[n]) if n in json_fields and row[n] is not None else row[n]
                     for n in names]
                )  # fmt: skip


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
