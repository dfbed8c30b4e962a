"""Retention at scale (hand-run, after ``bench.triage`` filled the database):
``DATABASE_URL=postgres://…/db python -m bench.retention``. Destructive: it drops the oldest
partition of bench rows.

1. Prepares the oldest closed partition for a drop (not timed as retention): every entry in it
   resolved (``discarded``), and a retention window on the bench channels that every one of
   its entries is past.
2. Times ``dlq.capture.partitions.drop_expired_partitions`` (one partition: the pre-check, the full
   check under the lock, the summary, the dependants — search index rows, dedupe keys, replay
   items, parent links, group samples — the audit event, DETACH and DROP), with the time of each
   step from the statements' own clock.
3. Times the row-by-row path (``dlq.capture.retention.do_purge_expired``) on the next partition's
   resolved entries (its unresolved ones keep it) for comparison: ``BENCH_PURGE_BATCHES``
   batches (default 20) of ``PURGE_BATCH`` tombstones each.
Prints ``uptime`` with each figure. ``--prepare-only`` stops after step 1, ``--skip-prepare``
starts at step 2 (the oldest partition prepared earlier).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from typing import Any

import django

PURGE_BATCHES = int(os.environ.get("BENCH_PURGE_BATCHES", "20"))


def load() -> str:
    return subprocess.getoutput("uptime").split("load average:")[-1].strip()


class StatementClock:
    """``connection.execute_wrapper``: seconds per statement kind (first words of the SQL)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            words = " ".join(sql.split()[:4])[:60]
            self.seconds[words] = self.seconds.get(words, 0.0) + time.perf_counter() - started


def prepare(part: Any, now: dt.datetime) -> None:
    """Resolve every entry of ``part`` and give its channels a window it is past."""
    from django.db import connection, transaction

    from channels_registry.models import Channel

    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dlq_entrystate SET status = 'discarded' "
            "WHERE entry_id >= %s AND entry_id < %s AND status NOT IN ('replayed', 'discarded')",
            [part.lower, part.upper],
        )
        updated = cursor.rowcount
        cursor.execute(f"SELECT max(ingested_at), array_agg(DISTINCT channel_id) FROM {part.name}")
        newest, channel_ids = cursor.fetchone()
    window = int((now - newest).total_seconds()) - 3600  # the newest entry is 1 h past it
    Channel.objects.filter(pk__in=channel_ids).update(retention_s=window)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {part.name}")
    print(
        f"prepared {part.name}: {updated} entries resolved, retention {window} s on "
        f"{len(channel_ids)} channels ({time.perf_counter() - started:.0f} s, not retention)"
    )


def widen(part: Any, now: dt.datetime) -> None:
    from django.db import connection

    from channels_registry.models import Channel

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT max(ingested_at), array_agg(DISTINCT channel_id) FROM {part.name}")
        newest, channel_ids = cursor.fetchone()
    window = int((now - newest).total_seconds()) - 3600
    Channel.objects.filter(pk__in=channel_ids).update(retention_s=window)


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to the PostgreSQL database bench.triage filled.")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.db import connection
    from django.utils import timezone

    from dlq.capture import partitions
    from dlq.capture.retention import PURGE_BATCH, do_purge_expired

    now = timezone.now()
    high = partitions.sequence_high()
    closed = [p for p in partitions.partitions() if p.upper - 1 <= high]
    if len(closed) < 2:
        sys.exit("Needs two closed partitions: fill more rows first (bench.triage --rows).")
    oldest = closed[0]
    if "--skip-prepare" not in sys.argv:
        prepare(oldest, now)
    if "--prepare-only" in sys.argv:
        return
    print(f"before: {len(partitions.partitions())} partitions; load {load()}")
    clock = StatementClock()
    started = time.perf_counter()
    with connection.execute_wrapper(clock):
        dropped = partitions.drop_expired_partitions(now, limit=1)
    elapsed = time.perf_counter() - started
    rows = sum(d["rows"] for d in dropped)
    print(
        f"drop: {len(dropped)} partition, {rows} entries in {elapsed:.1f} s"
        f" ({rows / max(elapsed, 1e-9):,.0f} entries/s); load {load()}"
    )
    for words, seconds in sorted(clock.seconds.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {seconds:7.2f} s  {words}")
    # The row-by-row path on the next partition: its resolved entries (10 % of bench rows) are
    # put past the window; its unresolved ones keep it from being dropped.
    widen(closed[1], now)
    started = time.perf_counter()
    result = do_purge_expired(now, max_batches=PURGE_BATCHES)
    elapsed = time.perf_counter() - started
    print(
        f"row by row: {result.purged} tombstones in {result.batches} batches of <= {PURGE_BATCH}"
        f" in {elapsed:.1f} s ({result.purged / max(elapsed, 1e-9):,.0f} entries/s); "
        f"load {load()}"
    )


if __name__ == "__main__":
    main()
