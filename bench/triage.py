"""Triage list at scale (hand-run):
``DATABASE_URL=postgres://…/db python -m bench.triage [--rows N]``.

1. Fills ``dlq_deadletter`` up to ``--rows`` (default 1,000,000) entries over 5 channels and
   50 failure groups with ``COPY`` (no ORM): ~1 KiB JSON bodies with real-looking headers,
   the search text built by ingest's own ``dlq.capture.ingest.search_text``, ids in ingest order,
   one entry every 2 s of ingest time. Missing rows are added on top of earlier fills (1M, then
   3M, …). The dedupe keys and the search index (``dlq_searchtext``) follow, as ingest and
   its indexer fill them. Use a database of its own: the dead-letter table is truncated when
   it holds anything but bench rows.
2. Times, in-process with the Django test client (server time: routing, queries, templates),
   the triage list — first page, a deep page by keyset, filtered first and deep pages, a
   selective and a broad text search — against the Django admin changelist of the same model
   on the same table (first page, a deep ``?p=`` page, the same filter, the same search).
3. Prints p50/p95 per page and the ratio of admin to triage time, with ``uptime``.
Targets (DESIGN.md): triage >= 20x faster than the admin; triage p95 < 50 ms.
``--fill-only`` stops after step 1. ``BENCH_ADMIN=0`` skips the admin side (minutes per deep
page at 10M rows); ``BENCH_ADMIN_RUNS`` gives it fewer runs than ``BENCH_RUNS``;
``BENCH_PAGES=search,deep`` measures only the pages whose names contain one of the words.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import django

ROWS = int(
    sys.argv[sys.argv.index("--rows") + 1]
    if "--rows" in sys.argv
    else os.environ.get("BENCH_ROWS", "1000000")
)
RUNS = int(os.environ.get("BENCH_RUNS", "20"))
ADMIN = os.environ.get("BENCH_ADMIN", "1") != "0"
#: The admin's pages take seconds each at millions of rows: fewer runs give its p50.
ADMIN_RUNS = int(os.environ.get("BENCH_ADMIN_RUNS", str(RUNS)))
#: Rows per COPY statement (one transaction each, so a long fill commits as it goes).
COPY_CHUNK = 100_000
#: Adding more rows than this drops the trigram index and builds it again at the end.
REBUILD_GIN_ABOVE = 200_000
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
WORDS = [
    "payment",
    "capture",
    "failed",
    "upstream",
    "timeout",
    "retry",
    "ledger",
    "invoice",
    "customer",
    "shipment",
    "warehouse",
    "refund",
    "currency",
    "basket",
    "coupon",
    "address",
    "postcode",
    "carrier",
    "label",
    "tracking",
    "inventory",
    "reserve",
]


def body_of(g: int) -> bytes:
    """~1 KiB of JSON, different per entry (order number, customer, items, a note)."""
    items = [
        {
            "sku": f"SKU-{(g * 7 + i) % 10007:05d}",
            "qty": 1 + (g + i) % 4,
            "price": (g * 13 + i) % 997,
        }
        for i in range(6)
    ]
    note = " ".join(WORDS[(g + i * 5) % len(WORDS)] for i in range(40))
    document = {
        "order": g,
        "customer": f"c-{g % 977}",
        "email": f"user{g % 977}@example.com",
        "currency": "EUR",
        "items": items,
        "note": note,
        "trace": hashlib.sha1(str(g).encode()).hexdigest(),
    }
    return json.dumps(document).encode()


def headers_of(g: int) -> dict[str, Any]:
    return {
        "x-exception-class": f"Error{g % 50}",
        "x-exception-message": f"order {g} failed: upstream returned 503",
        "Idempotency-Key": f"key-{g}",
        "x-first-death-queue": "orders",
        "content_type": "application/json",
        "x-death": [{"queue": "orders", "reason": "rejected", "count": 3}],
    }


def copy_row(g: int, channel_ids: list[int], group_ids: list[int]) -> list[Any]:
    """One row in ``COLUMNS`` order, as ingest would store it (search text by its builder)."""
    from dlq.capture.ingest import search_text

    body, headers = body_of(g), headers_of(g)
    at = EPOCH + dt.timedelta(seconds=2 * g)
    return [
        channel_ids[(g % 50) % 5], "poison" if g % 10 == 0 else "dlq", f"bench:{g}",
        body, hashlib.sha256(body).hexdigest(), len(body), "application/json",
        json.dumps(headers), "{}", ("rejected", "expired", "maxlen")[g % 3], f"Error{g % 50}",
        f"order {g} failed: upstream returned 503", 3, "orders", "", None, at, at, f"key-{g}",
        False, "", True, '[{"queue": "orders", "reason": "rejected", "count": 3}]',
        group_ids[g % 50], None, None, search_text(body, headers), 0, "{}", "", "{}",
    ]  # fmt: skip


COLUMNS = (
    "channel_id, source, dedupe_key, body, body_sha256, size, content_type, headers, "
    "properties, reason, error_class, error_message, redelivery_count, first_death_queue, "
    "first_death_exchange, first_death_at, dead_lettered_at, ingested_at, idempotency_key, "
    "missing_idempotency_key, schema_version, is_parseable, death_history, group_id, parent_id, "
    "purged_at, search_text, generation, schema_error, message_type, job"
)


def fixtures() -> tuple[list[Any], list[Any]]:
    """Five channels and fifty failure groups (created once)."""
    from django.utils import timezone

    from channels_registry.models import Broker, Channel
    from dlq.models import FailureGroup

    broker, _ = Broker.objects.get_or_create(
        name="bench-triage", defaults={"kind": "rabbitmq", "url_env": "DLO_BROKER_BENCH_TRIAGE_URL"}
    )
    channels = [
        Channel.objects.get_or_create(
            slug=f"triage-{i}",
            defaults={"broker": broker, "name": f"Triage {i}", "address": f"triage.{i}",
                      "dlq_address": f"triage.{i}.dlq"},
        )[0]
        for i in range(5)
    ]  # fmt: skip
    now = timezone.now()
    groups = [
        FailureGroup.objects.get_or_create(
            channel=channels[i % 5], fingerprint=f"bench-{i}",
            defaults={"reason": "rejected", "error_class": f"Error{i}", "count": ROWS // 50,
                      "open_count": ROWS // 50 * 9 // 10, "first_seen": now, "last_seen": now},
        )[0]
        for i in range(50)
    ]  # fmt: skip
    return channels, groups


def _clear_foreign_rows(cursor: Any) -> None:
    cursor.execute(
        "SELECT EXISTS (SELECT 1 FROM dlq_deadletter WHERE dedupe_key NOT LIKE 'bench:%')"
    )
    if cursor.fetchone()[0]:
        print("the table holds non-bench rows: truncating it (use a database of its own)")
        cursor.execute("TRUNCATE dlq_searchtext, dlq_deadletter_key, dlq_deadletter CASCADE")


def fill(channels: list[Any], groups: list[Any]) -> None:
    """COPY the missing bench rows (``bench:1`` … ``bench:ROWS``), then keys, search index."""
    from django.db import connection, transaction

    from dlq.capture import partitions

    with connection.cursor() as cursor:
        _clear_foreign_rows(cursor)
        cursor.execute("SELECT count(*) FROM dlq_deadletter")
        have = cursor.fetchone()[0]
    if have >= ROWS:
        return
    started = time.perf_counter()
    channel_ids, group_ids = [c.pk for c in channels], [g.pk for g in groups]
    rebuild = ROWS - have > REBUILD_GIN_ABOVE
    if rebuild:  # one bulk build instead of ~300 trigram inserts per row
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS dlq_search_trgm")
    for start in range(have + 1, ROWS + 1, COPY_CHUNK):
        partitions.ensure_partitions(ahead=1 + COPY_CHUNK // partitions.partition_size())
        stop = min(start + COPY_CHUNK, ROWS + 1)
        with transaction.atomic(), connection.cursor() as cursor:
            # Keys below in one statement, as ingest writes them (not per row by the trigger).
            cursor.execute("SELECT set_config('dlo.dedupe_keys_written', 'on', true)")
            with cursor.cursor.copy(f"COPY dlq_deadletter ({COLUMNS}) FROM STDIN") as copy:
                for g in range(start, stop):
                    copy.write_row(copy_row(g, channel_ids, group_ids))
            cursor.execute(
                "INSERT INTO dlq_deadletter_key (dedupe_key) SELECT dedupe_key FROM dlq_deadletter"
                " WHERE id > (SELECT coalesce(max(entry_id), 0) FROM dlq_searchtext)"
            )
            # Every 20th replayed and the next discarded, in the state rows the insert trigger
            # made (before the search text, whose newest id marks this chunk's start).
            cursor.execute(
                "UPDATE dlq_entrystate s SET status = CASE WHEN d.g % 20 = 0 THEN 'replayed' "
                "ELSE 'discarded' END FROM (SELECT id, split_part(dedupe_key, ':', 2)::bigint AS g"
                " FROM dlq_deadletter WHERE id > (SELECT coalesce(max(entry_id), 0) FROM"
                " dlq_searchtext)) d WHERE d.id = s.entry_id AND d.g % 20 IN (0, 1)"
            )
            cursor.execute(
                "INSERT INTO dlq_searchtext (entry_id, text) SELECT id, search_text FROM"
                " dlq_deadletter WHERE id > (SELECT coalesce(max(entry_id), 0) FROM dlq_searchtext)"
            )
        print(f"  {stop - 1} rows ({time.perf_counter() - started:.0f} s)", flush=True)
    with connection.cursor() as cursor:
        if rebuild:
            cursor.execute("SET maintenance_work_mem = '1GB'")
            cursor.execute(
                "CREATE INDEX IF NOT EXISTS dlq_search_trgm ON dlq_searchtext"
                " USING gin (text gin_trgm_ops)"
            )
        cursor.execute("VACUUM ANALYZE dlq_deadletter")
        cursor.execute("VACUUM ANALYZE dlq_searchtext")
        cursor.execute("VACUUM ANALYZE dlq_entrystate")
    print(f"filled {ROWS - have} rows in {time.perf_counter() - started:.0f} s")


class SqlClock:
    """``connection.execute_wrapper``: statements and the time spent waiting for them."""

    def __init__(self) -> None:
        self.queries = 0
        self.seconds = 0.0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.queries += 1


def timed(client: Any, url: str, runs: int = RUNS) -> tuple[float, float, float, int]:
    """p50 and p95 of the whole request, median SQL wait (ms) and statements per request."""
    from django.db import connection

    samples, sql, queries = [], [], 0
    for i in range(runs + 2):
        clock = SqlClock()
        started = time.perf_counter()
        with connection.execute_wrapper(clock):
            response = client.get(url)
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, (url, response.status_code)
        if i >= 2:  # two warm-ups
            samples.append(elapsed)
            sql.append(clock.seconds * 1000)
            queries = clock.queries
    samples.sort()
    p95 = samples[max(0, int(len(samples) * 0.95) - 1)]
    return statistics.median(samples), p95, statistics.median(sql), queries


def cases(channels: list[Any]) -> list[tuple[str, str, str]]:
    """(name, triage url, admin url) per page measured."""
    from dlq.models import DeadLetter

    total = DeadLetter.objects.count()
    middle = DeadLetter.objects.order_by("-id").values_list("id", flat=True)[total // 2]
    c2 = channels[2]
    return [
        ("first page", "/dead-letters/list/", "/admin/dlq/deadletter/"),
        ("deep page (middle row)", f"/dead-letters/list/?after={middle}",
         f"/admin/dlq/deadletter/?p={total // 2 // 100}"),
        ("filtered: channel+status", f"/dead-letters/list/?channel={c2.slug}&status=new",
         f"/admin/dlq/deadletter/?channel__id__exact={c2.pk}&state__status__exact=new"),
        ("filtered, deep", f"/dead-letters/list/?channel={c2.slug}&status=new&after={middle}",
         f"/admin/dlq/deadletter/?channel__id__exact={c2.pk}&state__status__exact=new"
         f"&p={total // 10 // 100 // 2}"),
        ("search, selective", "/dead-letters/list/?q=c-123%22",
         "/admin/dlq/deadletter/?q=c-123%22"),
        ("search, broad", "/dead-letters/list/?q=error7", "/admin/dlq/deadletter/?q=error7"),
    ]  # fmt: skip


def client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    user, created = User.objects.get_or_create(username="bench-admin")
    if created or not user.is_superuser:
        user.is_superuser = user.is_staff = True
        user.save()
    browser = Client()
    browser.force_login(user)
    return browser


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to a PostgreSQL database for the benchmark.")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from dlq.models import DeadLetter

    settings.DEBUG = False
    call_command("migrate", verbosity=0)
    channels, groups = fixtures()
    fill(channels, groups)
    if "--fill-only" in sys.argv:
        return
    browser = client()
    print(f"{DeadLetter.objects.count()} entries; {RUNS} runs each; server time in ms "
          f"(Django test client); load: {subprocess.getoutput('uptime').strip()}")  # fmt: skip
    print(f"{'page':26} {'triage p50':>10} {'p95':>7} {'sql':>6} {'q':>3} "
          f"{'admin p50':>10} {'p95':>8} {'ratio':>6}")  # fmt: skip
    only = [w for w in os.environ.get("BENCH_PAGES", "").split(",") if w]
    for name, ours, admin in cases(channels):
        if only and not any(word in name for word in only):
            continue
        o50, o95, osql, oq = timed(browser, ours)
        line = f"{name:26} {o50:10.1f} {o95:7.1f} {osql:6.1f} {oq:3}"
        if ADMIN:
            a50, a95, _, _ = timed(browser, admin, ADMIN_RUNS)
            line += f" {a50:10.1f} {a95:8.1f} {a50 / o50:5.0f}x"
        print(line, flush=True)
    print(f"load after: {subprocess.getoutput('uptime').strip()}")


if __name__ == "__main__":
    main()
