"""The dead-letter table's partitions (PostgreSQL only; SQLite keeps one plain table).

Migration 0011 makes ``dlq_deadletter`` ``PARTITION BY RANGE (id)``. Ids come from one
sequence in ingest order, so each partition holds one contiguous stretch of ingest time, and
the primary key ``(id)`` — which includes the partition key — keeps every foreign key to an
entry valid. What a partitioned table cannot have is ``UNIQUE (dedupe_key)``: deduplication
lives in ``dlq_deadletter_key`` (``DeadLetterKey``), one narrow row per stored key, written by
ingest in the same statement as the entries and by a trigger for every other insert.

This module:

* ``ensure_partitions`` creates partitions ahead of the id sequence (a periodic job, the
  retention run and ``manage.py dlq partitions --ensure``); the DEFAULT partition catches any
  id above them, so an insert never fails for lack of a partition.
* ``drop_expired_partitions`` removes a whole closed partition when every row in it is past
  its own channel's retention (resolved, on a channel that declares a window, ingested before
  ``now - retention_s``); its dependants (search text, states, dedupe keys, replay items,
  parent links, group samples) go first, and one audit event per partition says what went and
  why. The partition is detached (retrying for the parent's brief exclusive lock) and
  truncated in that transaction, and the empty table dropped after it, or by a later run when
  its foreign keys' tables are too busy to lock. A partition with even one row its channel's
  policy still keeps stays, and the row-by-row purge
  (``dlq.capture.retention.do_purge_expired``) tombstones what it may.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction

log = logging.getLogger(__name__)

TABLE = "dlq_deadletter"
DEFAULT = "dlq_deadletter_default"
SEQUENCE = "dlq_deadletter_id_seq"
KEYS = "dlq_deadletter_key"
STATE = "dlq_entrystate"
#: Partitions kept ready above the sequence's current value.
AHEAD = 2
#: How long a drop waits for its brief exclusive lock before giving up until the next run
#: (a waiting exclusive lock queues the pages' reads behind it).
DROP_LOCK_TIMEOUT = "500ms"
#: Attempts at the parent's lock for DETACH, each ``DROP_LOCK_TIMEOUT`` at most, backing off
#: ``DETACH_BACKOFF_S`` × the attempt's number in between (~1 minute in all).
DETACH_ATTEMPTS = 10
DETACH_BACKOFF_S = 1.0

_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


@dataclasses.dataclass(frozen=True)
class Partition:
    name: str
    lower: int  # inclusive
    upper: int  # exclusive


def partition_size() -> int:
    return max(1, int(getattr(settings, "DLO_DLQ_PARTITION_SIZE", 1_000_000)))


def is_partitioned() -> bool:
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", [TABLE])
        row = cursor.fetchone()
    return bool(row) and row[0] == "p"


def partitions() -> list[Partition]:
    """The range partitions, lowest first (the DEFAULT partition is not listed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [TABLE],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUND.search(bound or "")
        if match:
            found.append(Partition(name, int(match[1]), int(match[2])))
    return sorted(found, key=lambda p: p.lower)


def sequence_high() -> int:
    """The highest id handed out so far (0 before the first)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT last_value, is_called FROM {SEQUENCE}")
        last, called = cursor.fetchone()
    return int(last) if called else int(last) - 1


def create_sql(name: str, lower: int, upper: int) -> str:
    return (
        f"CREATE TABLE {name} PARTITION OF {TABLE} FOR VALUES FROM ({int(lower)}) TO ({int(upper)})"
    )


def ranges_to_cover(start: int, high: int, size: int, ahead: int = AHEAD) -> list[tuple[int, int]]:
    """Ranges aligned to ``size`` from ``start`` until ``ahead`` whole partitions lie above
    ``high``."""
    ranges = []
    while start <= high + ahead * size:
        upper = (start // size + 1) * size
        ranges.append((start, upper))
        start = upper
    return ranges


def ensure_partitions(ahead: int = AHEAD) -> list[Partition]:
    """Create the partitions the next ``ahead`` × size ids will need; returns the new ones.
    Starts above the newest partition and above any row the DEFAULT partition caught (a new
    range must not overlap rows already there). Serialised by an advisory lock."""
    if not is_partitioned():
        return []
    created = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [TABLE])
        existing = partitions()
        cursor.execute(f"SELECT max(id) FROM {DEFAULT}")
        caught = cursor.fetchone()[0] or 0
        start = max([p.upper for p in existing] + [caught + 1, 0])
        for lower, upper in ranges_to_cover(start, sequence_high(), partition_size(), ahead):
            name = f"{TABLE}_{lower}"
            cursor.execute(create_sql(name, lower, upper))
            created.append(Partition(name, lower, upper))
    for part in created:
        log.info("dead-letter partition %s created for ids [%d, %d)", *dataclasses.astuple(part))
    return created


# -- retention by whole partitions ----------------------------------------------------------

#: A row this partition's policy still keeps: unresolved, on a channel without a retention
#: window, or ingested within its channel's window.
_KEPT = (
    "(s.status IS DISTINCT FROM 'replayed' AND s.status IS DISTINCT FROM 'discarded' "
    "OR c.retention_s IS NULL "
    "OR c.retention_s <= 0 OR d.ingested_at >= %(now)s - c.retention_s * interval '1 second')"
)
#: The newest kept row, newest id first: a partition that is not done yet is rejected on the
#: first rows read.
_KEPT_ROW = (
    "SELECT d.id FROM {part} d JOIN channels_registry_channel c ON c.id = d.channel_id "
    f"LEFT JOIN {STATE} s ON s.entry_id = d.id WHERE {_KEPT} ORDER BY d.id DESC LIMIT 1"
)


def _newest_is_expired(cursor: Any, part: Partition, now: dt.datetime) -> bool:
    """Cheap pre-check on the partition's newest row (ids follow ingest time): worth the
    full check only when it is past its channel's retention. False for an empty partition."""
    cursor.execute(
        f"SELECT {_KEPT} FROM (SELECT * FROM {part.name} ORDER BY id DESC LIMIT 1) d "
        "JOIN channels_registry_channel c ON c.id = d.channel_id "
        f"LEFT JOIN {STATE} s ON s.entry_id = d.id",
        {"now": now},
    )
    row = cursor.fetchone()
    return row is not None and not row[0]


def _summary(cursor: Any, part: Partition) -> dict[str, Any]:
    cursor.execute(
        f"SELECT count(*), min(id), max(id), min(ingested_at), max(ingested_at), "
        f"count(purged_at), array_agg(DISTINCT channel_id) FROM {part.name}"
    )
    rows, first, last, oldest, newest, purged, channels = cursor.fetchone()
    return {
        "partition": part.name,
        "ids": [part.lower, part.upper],
        "rows": rows,
        "first_id": first,
        "last_id": last,
        "oldest_ingested_at": oldest.isoformat() if oldest else None,
        "newest_ingested_at": newest.isoformat() if newest else None,
        "already_tombstoned": purged,
        "channel_ids": sorted(c for c in channels or [] if c is not None),
    }


def _drop_dependants(cursor: Any, part: Partition) -> None:
    """What the foreign keys (and the side tables without one) would block or leave behind."""
    bounds = {"lower": part.lower, "upper": part.upper}
    in_part = "BETWEEN %(lower)s AND %(upper)s - 1"
    cursor.execute(f"DELETE FROM dlq_searchtext WHERE entry_id {in_part}", bounds)
    cursor.execute(f"DELETE FROM {STATE} WHERE entry_id {in_part}", bounds)
    cursor.execute(f"DELETE FROM dlq_replayitem WHERE entry_id {in_part}", bounds)
    cursor.execute(
        f"UPDATE dlq_failuregroup SET sample_id = NULL WHERE sample_id {in_part}", bounds
    )
    cursor.execute(f"UPDATE {TABLE} SET parent_id = NULL WHERE parent_id {in_part}", bounds)
    cursor.execute(f"DELETE FROM {KEYS} k USING {part.name} d WHERE k.dedupe_key = d.dedupe_key")


def _detach(cursor: Any, part: Partition) -> None:
    """``DETACH PARTITION`` needs the parent's exclusive lock for a moment, and every ingest
    batch and page read holds a weaker one: a busy store rarely gives it within one
    ``DROP_LOCK_TIMEOUT``. Each attempt waits that long at most (so the pages queue behind it
    no longer), then backs off; the work before it (the dependants) is kept across attempts by
    the savepoint. Raises the last lock timeout after ``DETACH_ATTEMPTS``."""
    for attempt in range(DETACH_ATTEMPTS):
        try:
            with transaction.atomic():
                cursor.execute(f"ALTER TABLE {TABLE} DETACH PARTITION {part.name}")
            return
        except OperationalError:  # lock_timeout: readers or writers of the parent
            if attempt == DETACH_ATTEMPTS - 1:
                raise
            time.sleep(DETACH_BACKOFF_S * (attempt + 1))


def _drop_one(part: Partition, now: dt.datetime) -> dict[str, Any] | None:
    """Detach and empty ``part`` if, under a lock that keeps writers out of it, no row is
    kept. The emptied table is dropped after the commit (``_drop_detached``)."""
    from audit.actions import Actor, record

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
        # Readers go on; a writer to these (old) rows waits until the drop commits.
        cursor.execute(f"LOCK TABLE {part.name} IN SHARE MODE")
        cursor.execute(_KEPT_ROW.format(part=part.name), {"now": now})
        if cursor.fetchone() is not None:
            return None
        summary = _summary(cursor, part)
        _drop_dependants(cursor, part)
        record(
            "dlq.partition_drop",
            actor=Actor.system(),
            target_type="dlq.partition",
            target_repr=f"{part.name}: {summary['rows']} entries past retention",
            reason=(
                "every entry in the partition is resolved and older than its channel's "
                "retention window"
            ),
            after=summary,
        )
        # The deferred foreign-key checks of the clean-up run now: a table with pending
        # trigger events cannot be detached or truncated.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        _detach(cursor, part)
        # TRUNCATE frees the space and locks only the detached table; DROP TABLE would also
        # need exclusive locks on every table its foreign keys point to (channels, groups,
        # the dead letters), which ingest and the pages hold all the time.
        cursor.execute(f"TRUNCATE {part.name}")
    log.info("dead-letter partition %s detached and emptied (%d rows)", part.name, summary["rows"])
    _drop_detached()
    return summary


def detached() -> list[str]:
    """Tables of emptied partitions not dropped yet (``dlq_deadletter_<lower>`` that are no
    longer partitions of the dead-letter table)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname ~ %s "
            "AND NOT c.relispartition ORDER BY c.relname",
            [rf"^{TABLE}_[0-9]+$"],
        )
        return [name for (name,) in cursor.fetchall()]


def _drop_detached() -> int:
    """Drop the emptied tables whose locks can be had within ``DROP_LOCK_TIMEOUT``; the others
    wait for the next run (they hold no rows). Returns how many went."""
    dropped = 0
    for name in detached():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {name})")
                if cursor.fetchone()[0]:  # never drop rows: only what _drop_one emptied
                    log.error("table %s is detached but not empty: left alone", name)
                    continue
                cursor.execute(f"DROP TABLE {name}")
            dropped += 1
        except OperationalError as exc:
            log.info("emptied partition table %s not dropped yet: %s", name, exc)
    return dropped


def drop_expired_partitions(now: dt.datetime, limit: int = 10) -> list[dict[str, Any]]:
    """Drop up to ``limit`` closed partitions whose every row is past retention; returns
    their audit summaries. A lock timeout or deadlock leaves the partition to the next run."""
    if not is_partitioned():
        return []
    _drop_detached()  # emptied by an earlier run whose DROP could not get its locks
    high = sequence_high()
    dropped: list[dict[str, Any]] = []
    for part in partitions():
        if len(dropped) >= limit:
            break
        if part.upper - 1 > high:  # still receiving ids (or not yet)
            continue
        with connection.cursor() as cursor:
            if not _newest_is_expired(cursor, part, now):
                continue
        try:
            summary = _drop_one(part, now)
        except DatabaseError as exc:  # lock timeout, deadlock: the next run tries again
            log.warning("dead-letter partition %s not dropped this run: %s", part.name, exc)
            continue
        if summary is not None:
            dropped.append(summary)
    return dropped


def describe() -> list[dict[str, Any]]:
    """One line per partition for ``manage.py dlq partitions``: range, estimated rows and the
    ingest time it spans (the time → id map retention and operators read)."""
    lines = []
    with connection.cursor() as cursor:
        for part in [*partitions(), Partition(DEFAULT, 0, 0)]:
            cursor.execute(
                "SELECT reltuples::bigint, pg_total_relation_size(oid) FROM pg_class "
                "WHERE oid = %s::regclass",
                [part.name],
            )
            estimate, size = cursor.fetchone()
            cursor.execute(
                f"SELECT (SELECT ingested_at FROM {part.name} ORDER BY id LIMIT 1), "
                f"(SELECT ingested_at FROM {part.name} ORDER BY id DESC LIMIT 1)"
            )
            first, last = cursor.fetchone()
            lines.append(
                {
                    "name": part.name,
                    "ids": "DEFAULT" if part.name == DEFAULT else f"[{part.lower}, {part.upper})",
                    "rows_estimate": max(int(estimate), 0),
                    "bytes": int(size),
                    "first_ingested_at": first,
                    "last_ingested_at": last,
                }
            )
    return lines
