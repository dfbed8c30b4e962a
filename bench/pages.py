"""Page benchmark (hand-run, not a test): ``.venv/bin/python -m bench.pages``.

Server time of the pages on-call engineers keep open, at scale: 10,000 channels (health rows
from one real poll through a synthetic adapter), 1,000,000 dead letters in 50,000 failure groups
over 72 hours, and 1,000,000 audit events (49 in 50 the system's own ``dlq.ingest``, as in the
demo), in a fresh PostgreSQL database. ``BENCH_CHANNELS``, ``BENCH_ENTRIES``,
``BENCH_AUDIT_EVENTS`` and ``BENCH_REQUESTS`` change the sizes.

1. Rows are written with ``COPY`` (``bench.pages_data``), then VACUUM ANALYZE; audit events go
   through the real ``record_many`` (COPY) and the real sealer (hash chain).
2. Each page is requested ``BENCH_REQUESTS`` times (after two warm-ups) with Django's test
   ``Client`` in-process, as a user with the oncall and compliance roles; the time around
   ``client.get`` is the server time (middleware, queries, templates), without a network.
   Before the first request the heap is settled as the ASGI server does at start-up
   (``config.startup.settle_heap``); ``BENCH_SETTLE_HEAP=0`` leaves it as it is, to compare.
3. Report p50 / p95 / max per page, the number of queries of one request and the 1-minute load
   average while it ran; ``uptime`` before and after (other work on the machine distorts the
   figures: quote them with it).

Pages: the board (first screen, every row, the next slice, one state); the DLQ failure groups
(all, one channel); the DLQ list (first page; filtered by channel and status, deep keyset page);
an entry detail; the audit trail (first page; a deep page; system events hidden, first and deep
page). ``DEBUG`` is off (no query log overhead). Everything is dropped afterwards, unless
``BENCH_DB=<name>`` names a database to keep and reuse (data made once). Loopback only.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
import uuid
from typing import Any

from bench.pages_data import AUDIT_EVENTS, CHANNELS, ENTRIES

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REQUESTS = int(os.environ.get("BENCH_REQUESTS", "30"))
MIDDLE = f"bench-{CHANNELS // 2:05d}"
RUN = uuid.uuid4().hex[:8]
# BENCH_DB=<name>: reuse (or create and keep) that database instead of a throwaway one.
REUSE = os.environ.get("BENCH_DB", "")
DB = REUSE or f"bench_pages_{RUN}"


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def setup_django() -> bool:
    """Create the database (unless reused and present); True when it needs the data."""
    with _pg() as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB
    os.environ["DEBUG"] = "0"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ.pop("REDIS_URL", None)  # in-memory channel layer: pushes go nowhere
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return not exists


def drop_database() -> None:
    from django.db import connections

    connections.close_all()
    with _pg() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def bench_targets() -> dict[str, Any]:
    from django.contrib.auth.models import User

    from bench.pages_data import BROKER, poll_health
    from channels_registry.models import Broker
    from dlq.models import DeadLetter

    # Fresh health rows (a reused database's are stale, which would make every row unhealthy).
    os.environ["DLO_BROKER_BENCH_PAGES_URL"] = "redis://bench.invalid:6379/0"  # never used
    poll_health(Broker.objects.get(name=BROKER).pk)
    # A first poll rewrites every channel row (awaiting_health, board state); later polls write
    # a row only when its state changes, so autovacuum keeps the table's visibility map set and
    # the board's counts an index-only scan. Vacuum once to measure that steady state.
    from django.db import connection

    with connection.cursor() as cursor:
        tables = "channels_registry_channel, channels_registry_channelhealth"
        cursor.execute(f"VACUUM (ANALYZE) {tables}")
    user = User.objects.get(username="bench-oncall")
    first = DeadLetter.objects.order_by("id").values_list("id", flat=True)[0]
    deep = DeadLetter.objects.filter(channel__slug=MIDDLE, state__status="new").order_by("id")
    # 20 rows in (each channel holds ENTRIES / CHANNELS entries): a keyset page past the first.
    deep_after = deep.values_list("id", flat=True)[min(20, deep.count() - 1)]
    return {
        "user": user,
        "entry": first + ENTRIES // 2,
        "deep_after": deep_after,
        "audit_before": AUDIT_EVENTS // 10,
    }


def pages(data: dict[str, Any]) -> list[tuple[str, str]]:
    before = data["audit_before"]
    return [
        ("board", "/"),
        ("board, all rows", "/?all=1"),
        ("board, next slice (htmx)", "/?from=100"),
        ("board, ?state=ok", "/?state=ok"),
        ("DLQ groups", "/dead-letters/"),
        ("DLQ groups, one channel", f"/dead-letters/?channel={MIDDLE}"),
        ("DLQ list", "/dead-letters/list/"),
        (
            "DLQ list filtered, deep",
            f"/dead-letters/list/?channel={MIDDLE}&status=new&after={data['deep_after']}",
        ),
        ("entry detail", f"/dead-letters/{data['entry']}/"),
        ("audit", "/audit/"),
        ("audit deep page", f"/audit/?before={before}"),
        ("audit, system hidden", "/audit/?system=hide"),
        ("audit, system hidden, deep", f"/audit/?system=hide&before={before}"),
    ]


def timed(client: Any, url: str, headers: dict[str, str]) -> tuple[list[float], Any]:
    """``REQUESTS`` server times in ms (after two warm-ups), sorted, and the last response."""
    for _ in range(2):
        response = client.get(url, headers=headers)
        assert response.status_code == 200, (url, response.status_code)
    times = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        response = client.get(url, headers=headers)
        times.append((time.perf_counter() - started) * 1000)
    return sorted(times), response


def query_count(client: Any, url: str, headers: dict[str, str]) -> int:
    from django.db import connection

    queries: list[str] = []

    def count(execute: Any, sql: str, *args: Any) -> Any:
        queries.append(sql)
        return execute(sql, *args)

    with connection.execute_wrapper(count):
        client.get(url, headers=headers)
    return len(queries)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(data: dict[str, Any]) -> None:
    from django.test import Client

    client = Client()
    client.force_login(data["user"])
    print(f"uptime: {uptime()}")
    print(f"{'page':<28}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'queries':>9}{'load':>7}  bytes")
    for label, url in pages(data):
        headers = {"HX-Request": "true"} if "(htmx)" in label else {}
        times, response = timed(client, url, headers)
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        print(
            f"{label:<28}{statistics.median(times):>9.1f}{p95:>9.1f}{times[-1]:>9.1f}"
            f"{query_count(client, url, headers):>9}{os.getloadavg()[0]:>7.2f}"
            f"  {len(response.content):,}"
        )
    print(f"uptime: {uptime()}")


def main() -> None:
    print(
        f"bench.pages: {CHANNELS:,} channels, {ENTRIES:,} dead letters, {AUDIT_EVENTS:,} audit"
        f" events, {REQUESTS} requests per page (db {DB})"
    )
    fresh = setup_django()
    try:
        if fresh:
            from bench.pages_data import make_data

            make_data()
        targets = bench_targets()
        if os.environ.get("BENCH_SETTLE_HEAP", "1") == "1":
            from config.startup import settle_heap

            print(f"heap: settled as at the server's start-up, {settle_heap():,} objects frozen")
        else:
            print("heap: not settled (BENCH_SETTLE_HEAP=0)")
        measure(targets)
    finally:
        if not REUSE:
            drop_database()


if __name__ == "__main__":
    main()
