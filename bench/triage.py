"""Triage list at scale (hand-run):
``DATABASE_URL=postgres://…/db python -m bench.triage [--rows N]``.

1. Fills ``dlq_deadletter`` with ``--rows`` (default 1,000,000) entries over 5 channels and 50
   failure groups in one server-side ``INSERT … SELECT … FROM generate_series`` (no ORM, no
   client round trip per row; skipped when the table already holds them), and the search
   index (``dlq_searchtext``) from it, as ingest fills it after the ack.
2. Times, in-process with the Django test client (server time: routing, queries, templates),
   the triage list — first page, a deep page by keyset, filtered first and deep pages, a
   selective and a broad text search — against the Django admin changelist of the same model
   on the same table (first page, a deep ``?p=`` page, the same filter, the same search).
3. Prints p50/p95 per page and the ratio of admin to triage time.
Targets (DESIGN.md): triage >= 20x faster than the admin; triage p95 < 50 ms.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import django

ROWS = int(
    sys.argv[sys.argv.index("--rows") + 1]
    if "--rows" in sys.argv
    else os.environ.get("BENCH_ROWS", "1000000")
)
RUNS = int(os.environ.get("BENCH_RUNS", "20"))

FILL_SQL = """
INSERT INTO dlq_deadletter (
  channel_id, source, status, dedupe_key, body, body_sha256, size, content_type, headers,
  properties, reason, error_class, error_message, redelivery_count, first_death_queue,
  first_death_exchange, first_death_at, dead_lettered_at, ingested_at, idempotency_key,
  missing_idempotency_key, schema_version, is_parseable, death_history, group_id, parent_id,
  purged_at, search_text, generation, schema_error, message_type, job)
SELECT
  (%(channels)s)[1 + (g %% 50) %% 5],
  CASE WHEN g %% 10 = 0 THEN 'poison' ELSE 'dlq' END,
  CASE WHEN g %% 20 = 0 THEN 'replayed' WHEN g %% 20 = 1 THEN 'discarded' ELSE 'new' END,
  'bench:' || g,
  convert_to('{"order": ' || g || ', "customer": "c-' || (g %% 977) || '", "note": "bench"}',
             'UTF8'),
  md5(g::text) || md5((g + 1)::text),
  60,
  'application/json',
  jsonb_build_object('x-exception-class', 'Error' || (g %% 50), 'Idempotency-Key', 'key-' || g),
  '{}'::jsonb,
  (ARRAY['rejected', 'expired', 'maxlen'])[1 + g %% 3],
  'Error' || (g %% 50),
  'order ' || g || ' failed',
  3,
  'orders',
  '',
  NULL,
  now() - make_interval(secs => %(rows)s - g),
  now() - make_interval(secs => %(rows)s - g),
  'key-' || g,
  false,
  '',
  true,
  '[]'::jsonb,
  (%(groups)s)[1 + g %% 50],
  NULL,
  NULL,
  lower('{"order": ' || g || ', "customer": "c-' || (g %% 977) || '", "note": "bench"}'
        || E'\\nx-exception-class: error' || (g %% 50)),
  0, '{}'::jsonb, '', '{}'::jsonb
FROM generate_series(1, %(rows)s) AS g
"""


def timed(client: object, url: str) -> tuple[float, float]:
    samples = []
    for i in range(RUNS + 2):
        started = time.perf_counter()
        response = client.get(url)  # type: ignore[attr-defined]
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, (url, response.status_code)
        if i >= 2:  # two warm-ups
            samples.append(elapsed)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to a PostgreSQL database for the benchmark.")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from channels_registry.models import Broker, Channel
    from dlq.models import DeadLetter, FailureGroup

    settings.DEBUG = False
    call_command("migrate", verbosity=0)
    broker, _ = Broker.objects.get_or_create(
        name="bench-triage", defaults={"kind": "rabbitmq", "url_env": "DLO_BROKER_BENCH_TRIAGE_URL"}
    )
    channels = []
    for i in range(5):
        channel, _ = Channel.objects.get_or_create(
            slug=f"triage-{i}",
            defaults={
                "broker": broker,
                "name": f"Triage {i}",
                "address": f"triage.{i}",
                "dlq_address": f"triage.{i}.dlq",
            },
        )
        channels.append(channel)
    groups = []
    now = timezone.now()
    for i in range(50):
        group, _ = FailureGroup.objects.get_or_create(
            channel=channels[i % 5],
            fingerprint=f"bench-{i}",
            defaults={
                "reason": "rejected",
                "error_class": f"Error{i}",
                "count": ROWS // 50,
                "first_seen": now,
                "last_seen": now,
            },
        )
        groups.append(group)
    existing = DeadLetter.objects.filter(dedupe_key__startswith="bench:").count()
    if existing < ROWS:
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM dlq_searchtext WHERE entry_id IN"
                " (SELECT id FROM dlq_deadletter WHERE dedupe_key LIKE 'bench:%%')"
            )
            cursor.execute("DELETE FROM dlq_deadletter WHERE dedupe_key LIKE 'bench:%%'")
            cursor.execute(
                FILL_SQL,
                {"channels": [c.pk for c in channels], "groups": [g.pk for g in groups],
                 "rows": ROWS},
            )  # fmt: skip
            cursor.execute(
                "INSERT INTO dlq_searchtext (entry_id, text) SELECT id, search_text"
                " FROM dlq_deadletter WHERE dedupe_key LIKE 'bench:%%'"
            )
            cursor.execute("ANALYZE dlq_deadletter")
            cursor.execute("ANALYZE dlq_searchtext")
        print(f"filled {ROWS} rows in {time.perf_counter() - started:.0f} s")
    total = DeadLetter.objects.count()
    ids = DeadLetter.objects.order_by("-id").values_list("id", flat=True)
    middle = ids[total // 2]
    user, created = User.objects.get_or_create(username="bench-admin")
    if created or not user.is_superuser:
        user.is_superuser = user.is_staff = True
        user.save()
    client = Client()
    client.force_login(user)
    c2 = channels[2]
    cases = [
        ("first page", "/dead-letters/list/", "/admin/dlq/deadletter/"),
        (
            "deep page (row ~500k)",
            f"/dead-letters/list/?after={middle}",
            f"/admin/dlq/deadletter/?p={total // 2 // 100}",
        ),
        (
            "filtered: channel+status",
            f"/dead-letters/list/?channel={c2.slug}&status=new",
            f"/admin/dlq/deadletter/?channel__id__exact={c2.pk}&status__exact=new",
        ),
        (
            "filtered, deep",
            f"/dead-letters/list/?channel={c2.slug}&status=new&after={middle}",
            f"/admin/dlq/deadletter/?channel__id__exact={c2.pk}&status__exact=new"
            f"&p={total // 10 // 100 // 2}",
        ),
        (
            "search, selective",
            "/dead-letters/list/?q=c-123%22",
            "/admin/dlq/deadletter/?q=c-123%22",
        ),
        ("search, broad", "/dead-letters/list/?q=error7", "/admin/dlq/deadletter/?q=error7"),
    ]
    print(f"{total} entries; {RUNS} runs each; server time in ms (Django test client)")
    print(f"{'page':26} {'triage p50':>10} {'p95':>7} {'admin p50':>10} {'p95':>8} {'ratio':>6}")
    for name, ours, admin in cases:
        o50, o95 = timed(client, ours)
        a50, a95 = timed(client, admin)
        print(f"{name:26} {o50:10.1f} {o95:7.1f} {a50:10.1f} {a95:8.1f} {a50 / o50:5.0f}x")


if __name__ == "__main__":
    main()
