"""Writing to the audit trail. ``record`` (and ``record_many``) are the only writers of
``AuditEvent`` rows.

The bottom of the audit app: it imports no other audit logic. Events are inserted unsealed;
whoever seals them (``audit.sealer``) registers a hook with ``on_record`` (``AuditConfig.ready``),
so the sealer, the checkpoints and the history, which all record events, sit above this module.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.http import HttpRequest
from django.utils import timezone
from django.utils.ipv6 import clean_ipv6_address

from audit.chain import (
    DETAIL_FIELDS,
    INDEX_COLUMNS,
    INDEX_FIELDS,
    UnrecordableValue,
    canonical_json,
    canonical_time,
)
from audit.mac import event_mac, load_key
from audit.models import AuditEvent, Outcome
from dashboard.proxy import client_address

#: Called after each ``record`` (with the event) and ``record_many`` (with ``None``), inside
#: the recording transaction: the sealer's ``after_record``, registered by ``AuditConfig.ready``.
_after_record: list[Callable[[AuditEvent | None], None]] = []


def on_record(hook: Callable[[AuditEvent | None], None]) -> None:
    """Register ``hook`` to run after each recorded event (once, however often called)."""
    if hook not in _after_record:
        _after_record.append(hook)


def _notify(event: AuditEvent | None) -> None:
    for hook in _after_record:
        hook(event)


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who did it: a user (id and username snapshot) or a named system actor, and from where."""

    user_id: int | None
    username: str
    ip: str | None = None

    @classmethod
    def from_request(cls, request: HttpRequest) -> Actor:
        user = getattr(request, "user", None)
        ip = client_address(request)
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
    """JSON-normal form of ``value`` (Django's encoder for dates, decimals, UUIDs), with the
    characters PostgreSQL text and jsonb refuse (NUL, lone surrogates) replaced by U+FFFD.
    NaN and Infinity are refused (``UnrecordableValue``): they have no JSON form."""
    if value is None:
        return None
    try:
        text = json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False)
        if "\\u0000" not in text and "\\ud" not in text:
            # ASCII-escaped, so a NUL or any surrogate would show as one of these escapes:
            # none, nothing to scrub (a relay batch's record lists thousands of values).
            return json.loads(text)
        return _scrub(json.loads(text))
    except RecursionError:
        raise UnrecordableValue("not recordable: the value is nested too deeply") from None
    except ValueError as exc:
        raise UnrecordableValue(f"not recordable: {exc} (NaN and Infinity are refused)") from None


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, list):
        return [_scrub(item) for item in value]
    if isinstance(value, dict):
        return {_text(key): _scrub(item) for key, item in value.items()}
    return value


def _text(value: str, limit: int | None = None) -> str:
    value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form to store or hash
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return value[:limit] if limit else value


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any]:
    """Field-by-field changes: ``{field: [old, new]}`` for every field whose value differs."""
    before, after = before or {}, after or {}
    return {
        key: [before.get(key), after.get(key)]
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }


def _ip(value: str | None) -> str | None:
    """An IPv6 address in the form Django stores it (``2001:DB8::1`` → ``2001:db8::1``), so
    the hashed text and the column agree on every database."""
    if value and ":" in value:
        try:
            return clean_ipv6_address(value)
        except ValidationError:
            return value
    return value or None


def _plan_of(target_type: str, target_id: str, after: Any) -> str:
    """The replay/discard plan an event belongs to, for the ``plan`` filter: the plan itself,
    or the ``plan`` its per-entry events name in ``after``."""
    if target_type == "dlq.replayplan":
        return target_id
    if isinstance(after, dict) and isinstance(after.get("plan"), int | str):
        return _text(str(after["plan"]), 64)
    return ""


def _event_fields(
    *,
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
    """The one builder of an unsealed event's stored fields, for ``record`` and
    ``record_many``: values truncated and cleaned, then the two canonical texts that are hashed
    (``index_json``, ``detail_json``) and, from the same cleaned values, the columns that are
    searched and displayed (copies that ``audit verify`` checks against the texts)."""
    columns: dict[str, Any] = {
        "created_at": now,
        "actor_id": actor.user_id,
        "actor_username": _text(actor.username, 150),
        "source_ip": _ip(actor.ip),
        "action": _text(action, 64),
        "target_type": _text(target_type, 64),
        "target_id": _text(str(target_id), 64),
        "target_repr": _text(target_repr, 300),
        "channel_slug": _text(channel_slug, 100),
        "reason": _text(reason),
        "before": _clean(before),
        "after": _clean(after),
        "changes": _clean(changes),
        "outcome": _text(outcome, 16),
    }
    columns["plan_id"] = _plan_of(columns["target_type"], columns["target_id"], columns["after"])
    index = {field: columns[INDEX_COLUMNS.get(field, field)] for field in INDEX_FIELDS}
    index["created_at"] = canonical_time(now)
    detail = {field: columns[field] for field in DETAIL_FIELDS}
    columns.update(
        hash_version=2,
        index_json=canonical_json(index),
        detail_json=canonical_json(detail),
        seq=None,
        prev_hash="",
        hash=None,
        mac="",  # set by the writer (``_sign``) once the texts are final
    )
    return columns


def _sign(fields: dict[str, Any], key: bytes) -> dict[str, Any]:
    """The application's MAC over the event's texts (``audit.mac``), in place."""
    fields["mac"] = event_mac(fields["index_json"], fields["detail_json"], key)
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
    """Append one event to the log, inside the caller's transaction, without waiting on any
    other writer: the event is inserted *unsealed* (no ``seq`` or ``hash`` yet) and the sealer
    gives it its place in the chain within seconds of the commit (``audit.sealer``). If the
    caller's transaction rolls back, the event vanishes with it. Raises ``UnrecordableValue``
    for NaN or Infinity in ``before``/``after``."""
    if target is not None:
        target_type = target_type or target._meta.label_lower
        target_id = target_id or str(target.pk)
        target_repr = target_repr or str(target)
    changes = diff(before, after) if before is not None and after is not None else None
    fields = _event_fields(
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
    _sign(fields, load_key())
    # In the caller's transaction, no savepoint of its own: nothing catches a failed insert to
    # go on without it, and a savepoint is two more round trips (a relay batch's record is
    # written beside the publisher thread, where every round trip waits for the interpreter).
    with transaction.atomic(savepoint=False):
        event = AuditEvent(**fields)
        event.save(force_insert=True)
        _notify(event)
    return event


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
    """Append many events in one go, inside the caller's transaction: the same unsealed events
    as ``record`` (sealed in the order given), but one bulk INSERT (``COPY`` on PostgreSQL)
    instead of one statement per event, and no lock shared with other writers. For per-entry
    events of bulk actions (a replay batch writes one outcome per entry). Returns the number
    written."""
    if not specs:
        return 0
    now = timezone.now()
    key = load_key()
    rows = [
        _sign(
            _event_fields(
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
            ),
            key,
        )
        for spec in specs
    ]
    with transaction.atomic():
        if connection.vendor == "postgresql":
            _copy_events(rows)
        else:
            AuditEvent.objects.bulk_create((AuditEvent(**r) for r in rows), batch_size=500)
        _notify(None)
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
