"""Page benchmark (hand-run, not a test): ``.venv/bin/python -m bench.pages``.

Server time of the pages on-call engineers keep open, at scale: 1,000 channels (with health
rows from one real poll through a synthetic adapter), 1,000,000 dead letters in 5,000 failure
groups, and 1,000,000 audit events (49 in 50 the system's own ``dlq.ingest``, as in the demo), in a
fresh PostgreSQL database.

1. Rows are generated inside PostgreSQL (``INSERT … SELECT generate_series``), then ANALYZE;
   audit events go through the real ``record_many`` (COPY) and the real sealer (hash chain).
2. Each page is requested ``BENCH_REQUESTS`` times (after two warm-ups) with Django's test
   ``Client`` in-process, as a user with the oncall and compliance roles; the time around
   ``client.get`` is the server time (middleware, queries, templates), without a network.
3. Report p50 / p95 / max per page and the number of queries of one request.

Pages: the board; the DLQ failure groups; the DLQ list (first page; filtered by channel and
status, deep keyset page); an entry detail; the audit trail (first page; a deep page; system
events hidden, first and deep page).
``DEBUG`` is off (no query log overhead). Everything is dropped afterwards, unless
``BENCH_DB=<name>`` names a database to keep and reuse (data made once). Loopback only.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
CHANNELS = int(os.environ.get("BENCH_CHANNELS", "1000"))
ENTRIES = int(os.environ.get("BENCH_ENTRIES", "1000000"))
AUDIT_EVENTS = int(os.environ.get("BENCH_AUDIT_EVENTS", "1000000"))
PERSON_EVERY = 50  # one audit event in 50 is a person's; the rest are system ingest events
REQUESTS = int(os.environ.get("BENCH_REQUESTS", "30"))
GROUPS_PER_CHANNEL = 5
MIDDLE = f"bench-{CHANNELS // 2:04d}"
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
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
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


class SyntheticAdapter:
    """Every address exists with plausible numbers; no broker involved."""

    def poll(self, addresses: Any) -> Any:
        from brokers.base import ChannelStats, PollResult

        stats = {
            a: ChannelStats(
                address=a,
                backlog=(hash(a.name) % 5000) if a.group else None,
                in_flight=3,
                retained=hash(a.name) % 50,
                consumers=2,
                active_consumers=2,
            )
            for a in addresses
        }
        return PollResult(stats, round_trips=1, duration_s=0.001)

    def inspect(self, addresses: Any) -> dict[Any, Any]:
        return {}


def make_data() -> dict[str, Any]:
    from django.contrib.auth.models import Group, User
    from django.db import connection, transaction

    from audit.actions import Actor, EventSpec, record_many
    from audit.sealer import seal
    from bench.fixtures import bench_channels
    from channels_registry import polling
    from channels_registry.models import Channel
    from dlq.models import DeadLetter, FailureGroup

    started = time.monotonic()
    user = User.objects.create_user("bench-oncall", password=uuid.uuid4().hex)
    user.groups.add(*Group.objects.filter(name__in=["viewer", "oncall", "compliance"]))
    broker = bench_channels(
        "bench-pages",
        CHANNELS,
        lambda i: {"redact_json_paths": ["$.customer.email"] if i % 2 else []},
    )
    polling.get_adapter = lambda *a, **k: SyntheticAdapter()  # type: ignore[assignment]
    polling.do_poll_broker(broker.pk, force=True)
    print(f"  {CHANNELS} channels with health: {time.monotonic() - started:.1f} s")

    started = time.monotonic()
    reasons = ["rejected", "expired", "delivery_limit", "retry-budget-exhausted", "poison"]
    classes = ["CustomerNotFound", "", "PaymentGatewayUnavailable", "TimeoutError", "PoisonMessage"]
    now = time.time()
    with connection.cursor() as cursor:
        # 1. Failure groups: GROUPS_PER_CHANNEL per channel, k-th group = k-th reason.
        cursor.execute(
            f"""
            INSERT INTO {FailureGroup._meta.db_table}
                (channel_id, fingerprint, reason, error_class, normalized_error, count,
                 open_count, first_seen, last_seen, message_type)
            SELECT c.id, md5(c.id::text || ':' || k), (ARRAY{reasons!r})[k + 1],
                   (ARRAY{classes!r})[k + 1], 'error <n> while booking order <str>', 0, 0,
                   to_timestamp(%s - 86400), to_timestamp(%s), ''
            FROM {Channel._meta.db_table} c, generate_series(0, {GROUPS_PER_CHANNEL - 1}) k
            """,
            [now, now],
        )
        # 2. Dead letters, spread over channels and groups, one day of dead_lettered_at.
        cursor.execute(
            f"""
            WITH ch AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n
                        FROM {Channel._meta.db_table}),
                 g AS (SELECT id, channel_id, reason, error_class,
                              row_number() OVER (PARTITION BY channel_id ORDER BY id) - 1 AS k
                       FROM {FailureGroup._meta.db_table})
            INSERT INTO {DeadLetter._meta.db_table}
                (channel_id, source, status, dedupe_key, body, body_sha256, size, content_type,
                 headers, properties, reason, error_class, error_message, redelivery_count,
                 first_death_queue, first_death_exchange, dead_lettered_at, ingested_at,
                 idempotency_key, missing_idempotency_key, schema_version, is_parseable,
                 death_history, group_id, generation, search_text, message_type, job,
                 schema_error)
            SELECT ch.id, CASE WHEN (s.i / {CHANNELS}) %% 20 = 7 THEN 'poison' ELSE 'dlq' END,
                   CASE WHEN (s.i / {CHANNELS}) %% 10 = 3 THEN 'discarded' ELSE 'new' END,
                   'bench:' || s.i,
                   convert_to('{{"order_id": "ord-' || s.i || '", "customer": {{"id": "c-'
                              || (s.i %% 997) || '", "email": "x@example.test"}},'
                              || ' "amount": 12.5}}', 'UTF8'),
                   md5(s.i::text), 90, 'application/json',
                   jsonb_build_object('Idempotency-Key', 'key-' || s.i, 'x-error-class',
                                      g_row.error_class),
                   '{{}}'::jsonb, g_row.reason, g_row.error_class,
                   'error ' || (s.i %% 7) || ' while booking order ''ord-' || s.i || '''',
                   s.i %% 5, 'bench.queue', '', to_timestamp(%s - (s.i %% 86400)),
                   to_timestamp(%s), 'key-' || s.i, false, '1', true, '[]'::jsonb, g_row.id,
                   0, 'order ord-' || s.i, '', '{{}}'::jsonb, '{{}}'::jsonb
            FROM generate_series(1, {ENTRIES}) s(i)
            JOIN ch ON ch.n = s.i %% {CHANNELS}
            JOIN g g_row ON g_row.channel_id = ch.id AND g_row.k = (s.i / {CHANNELS}) %% 5
            """,
            [now, now],
        )
        # 3. Group counts and samples, then statistics for the planner.
        cursor.execute(
            f"""
            UPDATE {FailureGroup._meta.db_table} fg
            SET count = x.n, open_count = x.open, sample_id = x.sample
            FROM (SELECT group_id, count(*) AS n, min(id) AS sample,
                         count(*) FILTER (WHERE status NOT IN ('replayed', 'discarded')) AS open
                  FROM {DeadLetter._meta.db_table} GROUP BY group_id) x
            WHERE x.group_id = fg.id
            """
        )
        cursor.execute("ANALYZE")
    print(
        f"  {DeadLetter.objects.count():,} dead letters in"
        f" {FailureGroup.objects.count():,} groups: {time.monotonic() - started:.1f} s"
    )

    started = time.monotonic()
    system = Actor.system()
    person = Actor(user.pk, user.get_username(), "127.0.0.1")
    for start in range(0, AUDIT_EVENTS, 10_000):
        numbers = range(start, min(AUDIT_EVENTS, start + 10_000))
        with transaction.atomic():
            record_many(
                [
                    EventSpec(
                        "dlq.ingest",
                        "channels_registry.channel",
                        n % CHANNELS,
                        target_repr=f"bench-{n % CHANNELS:04d} dlq bench.queue.dlq",
                        channel_slug=f"bench-{n % CHANNELS:04d}",
                        after={"inserted": 50, "duplicates": 0, "source": "dlq"},
                    )
                    for n in numbers
                    if n % PERSON_EVERY
                ],
                actor=system,
            )
            record_many(
                [
                    EventSpec(
                        "dlq.discard",
                        "dlq.deadletter",
                        n,
                        target_repr=f"entry {n}",
                        channel_slug=f"bench-{n % CHANNELS:04d}",
                        reason="bench",
                        after={"status": ["new", "discarded"]},
                    )
                    for n in numbers
                    if not n % PERSON_EVERY
                ],
                actor=person,
            )
        seal(wait=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"  {AUDIT_EVENTS:,} audit events: {time.monotonic() - started:.1f} s")

    return bench_targets()


def bench_targets() -> dict[str, Any]:
    from django.contrib.auth.models import User

    from channels_registry import polling
    from channels_registry.models import Broker
    from dlq.models import DeadLetter

    # Fresh health rows (a reused database's are stale, which would make every row unhealthy).
    os.environ["DLO_BROKER_BENCH_PAGES_URL"] = (
        "redis://bench.invalid:6379/0"  # never used: synthetic
    )
    polling.get_adapter = lambda *a, **k: SyntheticAdapter()  # type: ignore[assignment]
    polling.do_poll_broker(Broker.objects.get(name="bench-pages").pk, force=True)
    user = User.objects.get(username="bench-oncall")
    entry_ids = list(DeadLetter.objects.order_by("id").values_list("id", flat=True)[:1])
    deep = DeadLetter.objects.filter(channel__slug=MIDDLE, status="new").order_by("id")
    deep_after = deep.values_list("id", flat=True)[
        min(200, deep.count() - 1)
    ]  # 200 rows in: deep keyset page
    return {
        "user": user,
        "entry": entry_ids[0] + ENTRIES // 2,
        "deep_after": deep_after,
        "audit_before": AUDIT_EVENTS // 10,
    }


def measure(data: dict[str, Any]) -> None:
    from django.db import connection
    from django.test import Client

    client = Client()
    client.force_login(data["user"])
    pages = [
        ("board", "/"),
        ("board, all rows", "/?all=1"),
        ("board, next slice (htmx)", "/?from=100"),
        ("DLQ groups", "/dead-letters/"),
        ("DLQ list", "/dead-letters/list/"),
        (
            "DLQ list filtered, deep",
            f"/dead-letters/list/?channel={MIDDLE}&status=new&after={data['deep_after']}",
        ),
        ("entry detail", f"/dead-letters/{data['entry']}/"),
        ("audit", "/audit/"),
        ("audit deep page", f"/audit/?before={data['audit_before']}"),
        ("audit, system hidden", "/audit/?system=hide"),
        ("audit, system hidden, deep", f"/audit/?system=hide&before={data['audit_before']}"),
    ]
    print(f"{'page':<28}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'queries':>9}  bytes")
    for label, url in pages:
        headers = {"HX-Request": "true"} if "(htmx)" in label else {}
        for _ in range(2):
            response = client.get(url, headers=headers)
            assert response.status_code == 200, (url, response.status_code)
        times = []
        for _ in range(REQUESTS):
            started = time.perf_counter()
            response = client.get(url, headers=headers)
            times.append((time.perf_counter() - started) * 1000)
        queries: list[str] = []

        def count(execute: Any, sql: str, *args: Any, log: list[str] = queries) -> Any:
            log.append(sql)
            return execute(sql, *args)

        with connection.execute_wrapper(count):
            client.get(url, headers=headers)
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        print(
            f"{label:<28}{statistics.median(times):>9.1f}{p95:>9.1f}{times[-1]:>9.1f}"
            f"{len(queries):>9}  {len(response.content):,}"
        )


def main() -> None:
    print(
        f"bench.pages: {CHANNELS} channels, {ENTRIES:,} dead letters, {AUDIT_EVENTS:,} audit"
        f" events, {REQUESTS} requests per page (db {DB})"
    )
    fresh = setup_django()
    try:
        measure(make_data() if fresh else bench_targets())
    finally:
        if not REUSE:
            drop_database()


if __name__ == "__main__":
    main()
