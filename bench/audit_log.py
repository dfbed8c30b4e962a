"""Audit log benchmark (hand-run, not a test): ``.venv/bin/python -m bench.audit_log``.

In a fresh PostgreSQL database, in one run:

1. ``record()`` throughput, one writer, one event per transaction: sealed inside the recording
   transaction under the head row lock (``inline``, the behaviour before sealing moved off the
   actions' path) against unsealed insert + the sealer thread (``thread``, the default), with
   a checkpoint being signed and written every 0.5 s meanwhile (it must cost the writers
   nothing), and how long the sealer lagged behind the last commit.
2. Audited-action throughput with 1, 4 and 8 concurrent writers, in both modes. Each action is
   one transaction that records its event and then does ``BENCH_ACTION_MS`` of other work
   (default 2 ms, as an action's own UPDATE and round trips would) before committing — the
   time the head lock used to be held.
3. ``audit verify`` of ``BENCH_VERIFY_EVENTS`` (default 1,000,000) events made by the real
   ``record_many`` and sealed by the real sealer, against a signed checkpoint, with the
   process's peak memory before and after the walk.

Everything is dropped afterwards. Loopback only. Quote ``uptime`` with the figures.
"""

from __future__ import annotations

import contextlib
import os
import resource
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
VERIFY_EVENTS = int(os.environ.get("BENCH_VERIFY_EVENTS", "1000000"))
SINGLE = int(os.environ.get("BENCH_RECORDS", "2000"))
PER_WRITER = int(os.environ.get("BENCH_PER_WRITER", "300"))
ACTION_S = float(os.environ.get("BENCH_ACTION_MS", "2")) / 1000
DB = f"bench_audit_{uuid.uuid4().hex[:8]}"


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def setup_django(workdir: Path) -> None:
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB
    os.environ["DEBUG"] = "0"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ["DLO_AUDIT_SIGNING_KEY"] = str(workdir / "key.pem")
    os.environ["DLO_AUDIT_CHECKPOINT_DIR"] = str(workdir / "checkpoints")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from audit.checkpoints import keygen

    call_command("migrate", verbosity=0)
    keygen(workdir / "key.pem")


def _wait_sealed() -> float:
    from audit.models import AuditEvent

    start = time.perf_counter()
    while AuditEvent.objects.filter(seq__isnull=True).exists():
        time.sleep(0.01)
    return time.perf_counter() - start


def _writer(n: int, count: int, errors: list[BaseException]) -> None:
    from django.db import connection, transaction

    from audit.actions import Actor, record

    try:
        for i in range(count):
            with transaction.atomic():
                record(
                    "bench.action",
                    actor=Actor(n, f"writer{n}", "10.0.0.1"),
                    target_type="bench.thing",
                    target_id=i,
                    reason="bench",
                    before={"v": i},
                    after={"v": i + 1, "f": 1.0e16},
                )
                if ACTION_S:
                    time.sleep(ACTION_S)  # the rest of the audited action, in its transaction
    except BaseException as exc:
        errors.append(exc)
    finally:
        connection.close()


def run_writers(writers: int, per_writer: int) -> float:
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_writer, args=(n, per_writer, errors)) for n in range(writers)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return writers * per_writer / elapsed


def single_writer(mode: str) -> None:
    from django.conf import settings

    from audit.checkpoints import CheckpointError, write_checkpoint

    settings.DLO_AUDIT_SEALER = mode
    stop = threading.Event()

    def checkpoints() -> None:
        from django.db import connection

        while not stop.wait(0.5):
            with contextlib.suppress(CheckpointError):
                write_checkpoint()
        connection.close()

    ticker = threading.Thread(target=checkpoints)
    ticker.start()
    global ACTION_S
    saved, ACTION_S = ACTION_S, 0.0
    try:
        rate = run_writers(1, SINGLE)
    finally:
        ACTION_S = saved
        stop.set()
        ticker.join()
    lag = _wait_sealed()
    print(f"  record() one writer, {mode:6}: {rate:8.0f} events/s; sealed {lag:.2f} s after")


def concurrent(mode: str) -> None:
    from django.conf import settings

    settings.DLO_AUDIT_SEALER = mode
    for writers in (1, 4, 8):
        rate = run_writers(writers, PER_WRITER)
        lag = _wait_sealed()
        print(
            f"  {writers} writers, {mode:6}: {rate:8.0f} audited actions/s "
            f"(sealer {lag:.2f} s behind at the end)"
        )


def verify_million() -> None:
    from django.conf import settings
    from django.db import transaction

    from audit.actions import Actor, EventSpec, record_many, verify_chain
    from audit.checkpoints import write_checkpoint
    from audit.models import AuditEvent
    from audit.sealer import seal

    settings.DLO_AUDIT_SEALER = "off"
    have = AuditEvent.objects.count()
    start = time.perf_counter()
    batch = 10_000
    made = have
    while made < VERIFY_EVENTS:
        n = min(batch, VERIFY_EVENTS - made)
        specs = [
            EventSpec(
                "dlq.replay.request",
                "dlq.deadletter",
                made + i,
                f"dead letter #{made + i}",
                "orders",
                reason="bench",
                after={"plan": 42, "item": made + i, "w": 1.5e300},
            )  # fmt: skip
            for i in range(n)
        ]
        with transaction.atomic():
            record_many(specs, actor=Actor(1, "bench"))
        made += n
    made_s = time.perf_counter() - start
    start = time.perf_counter()
    sealed = seal()
    seal_s = time.perf_counter() - start
    write_checkpoint(force=True)
    print(
        f"  made {made - have} events with record_many in {made_s:.1f} s; sealed {sealed} in "
        f"{seal_s:.1f} s ({sealed / seal_s:.0f} events/s)"
    )
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    result = verify_chain(checkpoint_dir=settings.DLO_AUDIT_CHECKPOINT_DIR)
    elapsed = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"  audit verify: {result.summary()[:90]}")
    print(
        f"  verified {result.events} events in {elapsed:.1f} s "
        f"({result.events / elapsed:.0f}/s); checkpoint #{result.checkpoints_matched} "
        f"matched; peak RSS {rss_before // 1024} MiB before, {rss_after // 1024} MiB after"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        setup_django(Path(tmp))
        try:
            print(f"load: {os.getloadavg()}")
            print("1. record() throughput (checkpoint written every 0.5 s meanwhile)")
            for mode in ("inline", "thread"):
                single_writer(mode)
            print(f"2. audited actions ({ACTION_S * 1000:.0f} ms of work in each transaction)")
            for mode in ("inline", "thread"):
                concurrent(mode)
            print(f"3. verify {VERIFY_EVENTS} events")
            verify_million()
            print(f"load: {os.getloadavg()}")
        finally:
            from django.db import connections

            connections.close_all()
            with _pg() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()
