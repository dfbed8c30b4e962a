"""Freeze benchmark (hand-run, not a test): ``.venv/bin/python -m bench.freeze``.

1. A fresh PostgreSQL database; ``BENCH_ROWS`` (default 1,000,000) dead letters of one
   channel written with ``COPY … FROM STDIN`` (no ORM): 1 KiB JSON bodies and ~1.3 KB search
   text, as ingest stores them, all in the failure group a real ingest batch created.
2. Another writer runs in its own process for the whole run: a loop of audited actions (one
   ``record`` per transaction, every 20 ms) and, every fifth turn, a real ingest batch of 20
   letters into the same channel and failure group (``dlq.capture.ingest.store_batch``).
3. A third process confirms a replay plan over the whole channel (``do_create_plan``: it
   returns at once, FREEZING) and freezes it as the background task does
   (``dlq.plans.freeze.run_freeze``), with the audit sealer on its thread as in production.
4. Printed: the request's time, the freeze's time and rate, the freezing process's peak RSS
   (``resource.getrusage``), when the last audit event was sealed, the other writer's
   latency (p50/p99/max) before and during the freeze, and how many lock waits of 100 ms or
   more PostgreSQL logged in the bench database (``log_lock_waits`` with a 100 ms
   ``deadlock_timeout``, set on that database; read from ``BENCH_PG_LOG``, by default
   Debian's log of the server's major version). Targets (issue 13): 1M entries frozen in
   < 60 s with bounded memory; the other writer never waits > 100 ms for the freeze.

``BENCH_FREEZE_MODE=one-transaction`` freezes the same work in ONE transaction instead (the
pre-chunking shape, for comparison). ``BENCH_CHUNK`` sets ``DLO_FREEZE_CHUNK``. The database is
dropped at the end.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
ROWS = int(os.environ.get("BENCH_ROWS", "1000000"))
MODE = os.environ.get("BENCH_FREEZE_MODE", "chunked")
RUN = os.environ.get("BENCH_RUN", uuid.uuid4().hex[:8])
#: The server's log (Debian's path for the server's major version unless ``BENCH_PG_LOG``).
PG_LOG = os.environ.get("BENCH_PG_LOG", "")
DB = f"bench_freeze_{RUN}"
SLUG = f"bench-freeze-{RUN}"
ADDRESS = f"bench.freeze.{RUN}"

COLUMNS = (
    "source, dedupe_key, body, body_sha256, size, content_type, headers, properties, "
    "reason, error_class, error_message, redelivery_count, first_death_queue, "
    "first_death_exchange, first_death_at, dead_lettered_at, ingested_at, idempotency_key, "
    "missing_idempotency_key, schema_version, is_parseable, death_history, purged_at, "
    "search_text, channel_id, parent_id, group_id, generation, job, message_type, schema_error"
)


def _url(dbname: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(_url(dbname), autocommit=True)


def _django() -> None:
    os.environ["DATABASE_URL"] = _url(DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # As production runs (DEBUG is off there): no per-statement SQL log (DEBUG=1 to compare).
    os.environ.setdefault("DEBUG", "0")
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()


def _letters(start: int, count: int) -> list[Any]:
    from brokers.base import DeadLetter as Letter

    return [
        Letter(
            dedupe_key=f"bench:writer:{RUN}:{i}",
            body=(f'{{"order": {i}, "note": "writer"}}'.encode()).ljust(1024, b" "),
            headers={"x-first-death-queue": ADDRESS, "x-first-death-reason": "rejected"},
            properties={"content_type": "application/json"},
            token=i,
            broker_id=str(i),
            reason="rejected",
            first_death_queue=ADDRESS,
        )
        for i in range(start, start + count)
    ]


# -- child processes ---------------------------------------------------------------------------


def child_setup() -> None:
    """Broker, channel, users, and one real ingest batch (it creates the failure group)."""
    _django()
    from brokers.base import Address
    from channels_registry.models import Broker, Channel
    from dlq.capture.ingest import store_batch
    from dlq.models import FailureGroup, Source

    os.environ["DLO_BROKER_BENCH_FREEZE_URL"] = "redis://bench.invalid:6379/0"
    broker = Broker.objects.create(
        name=f"bench-freeze-{RUN}", kind="redis", url_env="DLO_BROKER_BENCH_FREEZE_URL"
    )
    channel = Channel.objects.create(
        broker=broker, name=f"Bench freeze {RUN}", slug=SLUG, address=ADDRESS,
        address_group="workers", dlq_address=f"{ADDRESS}.dlq", semantic="at-least-once",
    )  # fmt: skip
    store_batch(channel, _letters(0, 1), Source.DLQ, Address(f"{ADDRESS}.dlq"))
    group = FailureGroup.objects.get(channel=channel)
    print(json.dumps({"channel": channel.pk, "group": group.pk}))


def child_writer() -> None:
    """Audited actions every 20 ms and an ingest batch every fifth turn, until stdin closes;
    prints ``[kind, start, seconds]`` per operation."""
    _django()
    from django.db import transaction

    from audit.actions import Actor, record
    from brokers.base import Address
    from channels_registry.models import Channel
    from dlq.capture.ingest import store_batch
    from dlq.models import Source

    channel = Channel.objects.get(slug=SLUG)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    samples: list[tuple[str, float, float]] = []
    turn, letter = 0, 1000
    while not stop.is_set():
        started = time.time()
        with transaction.atomic():
            record("bench.writer", actor=Actor.system("bench-writer"), target_id=str(turn))
        samples.append(("record", started, time.time() - started))
        if turn % 5 == 0:
            started = time.time()
            store_batch(channel, _letters(letter, 20), Source.DLQ, Address(f"{ADDRESS}.dlq"))
            samples.append(("ingest", started, time.time() - started))
            letter += 20
        turn += 1
        stop.wait(0.02)
    print(json.dumps(samples))


def child_freeze() -> None:
    """Confirm a replay plan over the channel and freeze it as the background task does."""
    if MODE == "one-transaction":
        os.environ["DLO_FREEZE_INLINE"] = str(ROWS * 2)
    if os.environ.get("BENCH_CHUNK"):
        os.environ["DLO_FREEZE_CHUNK"] = os.environ["BENCH_CHUNK"]
    _django()
    from django.contrib.auth.models import User

    from audit.actions import Actor
    from dlq.models import DeadLetter, PlanStatus
    from dlq.plans import freeze
    from dlq.plans.actions import do_create_plan
    from dlq.plans.preview import Selection
    from dlq.triage.filters import EntryFilter

    requester = User.objects.create(username=f"bench-requester-{RUN}")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.time()
    plan, _ = do_create_plan(
        "replay", Selection(EntryFilter(channel=SLUG)), DeadLetter.objects.all(),
        actor=Actor.for_user(requester), reason="bench", velocity=None,
    )  # fmt: skip
    answered = time.time()
    chunks = 0
    while plan.status == PlanStatus.FREEZING:
        result = freeze.run_freeze(plan.pk, max_seconds=3600)
        chunks += result.chunks
        plan.refresh_from_db()
    done = time.time()
    print(
        json.dumps(
            {
                "start": started,
                "answered": answered,
                "done": done,
                "status": plan.status,
                "total": plan.total,
                "chunks": chunks,
                "rss_before_kb": rss_before,
                "rss_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }  # fmt: skip
        ),
        flush=True,
    )


# -- the run -----------------------------------------------------------------------------------


def _child(role: str, **kwargs: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "BENCH_RUN": RUN}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.freeze", f"--{role}"],
        env=env, stdout=subprocess.PIPE, text=True, **kwargs,
    )  # fmt: skip


def _json(proc: subprocess.Popen[str]) -> Any:
    assert proc.stdout is not None
    out = proc.stdout.read()
    if proc.wait(timeout=3600):
        raise SystemExit(f"child failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def fill(channel: int, group: int) -> float:
    """``ROWS`` dead letters with ``COPY`` in blocks (bounded memory); returns seconds."""
    words = [uuid.uuid4().hex[:7] for _ in range(400)]
    started = time.monotonic()
    base = int(time.time()) - ROWS // 1000 - 3600
    with _pg(DB) as conn, conn.cursor() as cursor:
        with cursor.copy(f"COPY dlq_deadletter ({COLUMNS}) FROM STDIN") as copy:
            lines: list[str] = []
            for i in range(ROWS):
                text = " ".join(words[(i * 7 + k) % 400] for k in range(128))[:1000]
                body = f'{{"order": {i}, "note": "{text}"}}'.encode().ljust(1024, b" ")
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(base + i // 1000))
                when += f".{i % 1000:03d}+00"
                search = f"{body.decode().lower()} x-first-death-queue: {ADDRESS} {text}"
                lines.append(
                    f"dlq\tbench:{RUN}:{i}\t\\\\x{body.hex()}\t{uuid.uuid4().hex * 2}\t"
                    f'1024\tapplication/json\t{{"x-first-death-queue": "{ADDRESS}"}}\t{{}}\t'
                    f"rejected\t\t\t1\t{ADDRESS}\t\t\\N\t{when}\t{when}\tk-{i}\tf\t\tt\t[]\t\\N\t"
                    f"{search[:1300]}\t{channel}\t\\N\t{group}\t0\t{{}}\t\t{{}}\n"
                )
                if len(lines) == 2000:
                    copy.write("".join(lines))
                    lines = []
            if lines:
                copy.write("".join(lines))
        cursor.execute(f"UPDATE dlq_failuregroup SET count = count + {ROWS}, "
                       f"open_count = open_count + {ROWS} WHERE id = {group}")  # fmt: skip
        # As autovacuum would have by the time a million entries wait (their state rows too).
        cursor.execute("VACUUM ANALYZE dlq_deadletter, dlq_entrystate")
    return time.monotonic() - started


def _stats(samples: list[list[Any]], kind: str, since: float, until: float) -> str:
    waits = sorted(s[2] * 1000 for s in samples if s[0] == kind and since <= s[1] <= until)
    if not waits:
        return f"{kind}: no samples"
    p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    return (
        f"{kind}: n={len(waits)} p50 {statistics.median(waits):.1f} ms, p99 {p99:.1f} ms, "
        f"max {waits[-1]:.1f} ms"
    )


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _sealed_after(deadline_s: float = 600) -> float:
    started = time.monotonic()
    with _pg(DB) as conn:
        while time.monotonic() - started < deadline_s:
            row = conn.execute("SELECT 1 FROM audit_auditevent WHERE seq IS NULL LIMIT 1")
            if row.fetchone() is None:
                return time.time()
            time.sleep(0.2)
    return float("nan")


def _log_path() -> str:
    if PG_LOG:
        return PG_LOG
    with _pg() as conn:
        [(version,)] = conn.execute("SHOW server_version_num").fetchall()
    return f"/var/log/postgresql/postgresql-{int(version) // 10000}-main.log"


def _log_size() -> int | None:
    try:
        return os.path.getsize(_log_path())
    except OSError:
        return None


def _lock_waits(since: int | None) -> str:
    """Lock waits of 100 ms or more PostgreSQL logged for the bench database since ``since``."""
    if since is None:
        return f"not counted ({_log_path()} is not readable; set BENCH_PG_LOG)"
    with open(_log_path(), "rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    waits = [line for line in lines if f"@{DB} " in line and "still waiting for" in line]
    return f"{len(waits)}" + (f" (first: {waits[0][:200]})" if waits else "")


def main() -> None:
    print(f"freeze bench: {ROWS:,} entries, mode {MODE}; {_uptime()}")
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{DB}"')
        conn.execute(f'ALTER DATABASE "{DB}" SET log_lock_waits = on')
        conn.execute(f'ALTER DATABASE "{DB}" SET deadlock_timeout = 100')
    log_from = _log_size()
    try:
        env = {**os.environ, "DATABASE_URL": _url(DB)}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, check=True)
        ids = _json(_child("setup"))
        print(f"  COPY {ROWS:,} rows: {fill(ids['channel'], ids['group']):.1f} s")
        writer = _child("writer", stdin=subprocess.PIPE)
        time.sleep(5)  # the writer's baseline
        result = _json(_child("freeze"))
        sealed = _sealed_after()
        with _pg(DB) as conn:
            [(requests,)] = conn.execute(
                "SELECT count(*) FROM audit_auditevent WHERE action = 'dlq.replay.request'"
            ).fetchall()
        time.sleep(2)
        assert writer.stdin is not None
        writer.stdin.close()
        samples = _json(writer)
        took = result["done"] - result["start"]
        print(
            f"  request answered in {result['answered'] - result['start']:.2f} s "
            f"(plan {result['status']} after the freeze, total {result['total']:,})"
        )
        print(
            f"  freeze: {result['total']:,} items + {requests:,} request audit events "
            f"in {took:.1f} s = {result['total'] / took:,.0f}/s, {result['chunks']} chunks"
        )
        print(
            f"  freezing process peak RSS: {result['rss_peak_kb'] / 1024:.0f} MB "
            f"(after start-up {result['rss_before_kb'] / 1024:.0f} MB)"
        )
        print(f"  last audit event sealed {sealed - result['done']:.1f} s after the freeze")
        first, start, done = min(s[1] for s in samples), result["start"], result["done"]
        for kind in ("record", "ingest"):
            print("  other writer before: " + _stats(samples, kind, first, start))
            print("  other writer during: " + _stats(samples, kind, start, done))
        print(f"  lock waits of 100 ms or more in the bench database: {_lock_waits(log_from)}")
        print(f"  {_uptime()}")
    finally:
        with _pg() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    if "--setup" in sys.argv:
        child_setup()
    elif "--writer" in sys.argv:
        child_writer()
    elif "--freeze" in sys.argv:
        child_freeze()
    else:
        main()
