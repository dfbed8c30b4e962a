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
3. The real sealer over a burst of ``BENCH_SEAL_EVENTS`` (default 20,000) unsealed events.
4. ``audit verify`` of ``BENCH_VERIFY_EVENTS`` (default 1,000,000) events, stored exactly as
   ``record_many`` and the sealer store them (the same builder and hashes, written by COPY in
   their sealed form so the set-up takes minutes), against a signed checkpoint, with the
   process's peak memory before and after the walk.

5. Checkpoints at scale (issue 23): ``BENCH_VERIFY_EVENTS`` events and ``BENCH_CHECKPOINTS``
   (default 525,600: a year of minutely checkpoints) signed checkpoint files spread over them,
   in the real format with the real key (signed and written as ``write_checkpoint`` does, the
   roots taken from the same frontier), the stored Merkle subtrees built by the real
   ``audit.tree.extend``. Timed: ``audit verify`` against all of them, one more checkpoint
   write, the audit page's and ``/metrics``' status, consistency proofs, a witness poll
   (``audit/witness.py`` over the real views), and the standard-library verifier reading the
   checkpoint directory.

``BENCH_PARTS=4`` runs only part 4, and so on (default ``1234``; ``5`` on its own).

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
SEAL_EVENTS = int(os.environ.get("BENCH_SEAL_EVENTS", "20000"))
CHECKPOINTS = int(os.environ.get("BENCH_CHECKPOINTS", "525600"))
PARTS = os.environ.get("BENCH_PARTS", "1234")  # which numbered parts to run
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
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
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


def _spec(n: int) -> Any:
    from audit.actions import EventSpec

    return EventSpec(
        "dlq.replay.request", "dlq.deadletter", n, f"dead letter #{n}", "orders",
        reason="bench", after={"plan": 42, "item": n, "w": 1.5e300},
    )  # fmt: skip


def sealing_rate() -> None:
    """The real sealer over a burst of ``SEAL_EVENTS`` unsealed events (one record_many)."""
    from django.conf import settings
    from django.db import connection, transaction

    from audit.actions import Actor, record_many
    from audit.sealer import seal

    settings.DLO_AUDIT_SEALER = "off"
    with transaction.atomic():
        record_many([_spec(n) for n in range(SEAL_EVENTS)], actor=Actor(1, "bench"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_auditevent")
    start = time.perf_counter()
    sealed = seal()
    elapsed = time.perf_counter() - start
    print(f"  sealed a burst of {sealed} events in {elapsed:.1f} s ({sealed / elapsed:.0f}/s)")


def _sealed_rows(first_seq: int, count: int, prev: str, frontier: Any) -> tuple[list[Any], str]:
    """Rows exactly as record_many + the sealer store them (same builder, same hashes)."""
    from django.utils import timezone

    from audit.actions import Actor, _event_fields
    from audit.chain import chain_hash, leaf_hash
    from audit.mac import event_mac

    rows = []
    now = timezone.now()
    for n in range(first_seq, first_seq + count):
        spec = _spec(n)
        fields = _event_fields(
            now=now, actor=Actor(1, "bench"), action=spec.action, target_type=spec.target_type,
            target_id=spec.target_id, target_repr=spec.target_repr,
            channel_slug=spec.channel_slug, reason=spec.reason, before=None, after=spec.after,
            changes=None, outcome=spec.outcome,
        )  # fmt: skip
        leaf = leaf_hash(fields["index_json"], fields["detail_json"])
        digest = chain_hash(prev, leaf)
        frontier.append(leaf)
        fields.update(seq=n, prev_hash=prev, hash=digest)
        fields["mac"] = event_mac(fields["index_json"], fields["detail_json"])
        rows.append(fields)
        prev = digest
    return rows, prev


def verify_million() -> None:
    """``VERIFY_EVENTS`` sealed events stored as the sealer stores them (written by COPY
    straight in their sealed form, so the set-up takes minutes, not the sealer's time), a
    signed checkpoint, then the timed ``audit verify`` walk."""
    from django.conf import settings
    from django.db import connection, transaction
    from django.utils import timezone

    from audit import triggers
    from audit.actions import _copy_events, verify_chain
    from audit.chain import GENESIS, MerkleFrontier
    from audit.checkpoints import write_checkpoint
    from audit.models import AuditEvent, AuditHead
    from audit.sealer import seal

    settings.DLO_AUDIT_SEALER = "off"
    seal()
    head = AuditHead.objects.get(pk=1)
    frontier, prev, seq = MerkleFrontier.loads(head.frontier), head.hash or GENESIS, head.seq
    start = time.perf_counter()
    triggers.drop(connection)  # sealed rows straight in, past the insert trigger
    while seq < VERIFY_EVENTS:
        n = min(20_000, VERIFY_EVENTS - seq)
        rows, prev = _sealed_rows(seq + 1, n, prev, frontier)
        with transaction.atomic():
            _copy_events(rows)
        seq += n
    AuditHead.objects.filter(pk=1).update(
        seq=seq, hash=prev, frontier=frontier.dumps(), sealed_at=timezone.now()
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_auditevent")
    triggers.install(connection)
    write_checkpoint(force=True)
    print(f"  stored {AuditEvent.objects.count()} events in {time.perf_counter() - start:.0f} s")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    result = verify_chain(checkpoint_dir=settings.DLO_AUDIT_CHECKPOINT_DIR)
    elapsed = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"  audit verify: {result.summary()[:100]}")
    print(
        f"  verified {result.events} events in {elapsed:.1f} s "
        f"({result.events / elapsed:.0f}/s); checkpoint #{result.checkpoints_matched} "
        f"matched; peak RSS {rss_before // 1024} MiB before, {rss_after // 1024} MiB after"
    )


def _store_events_and_checkpoints(total: int, checkpoints: int, directory: Path) -> None:
    """Events #1–#total (as in part 4) with ``checkpoints`` signed checkpoint files at evenly
    spread tree sizes, each body built, signed and written as ``audit.checkpoints._write``
    does (the same format, key, canonical JSON, file naming and hard-link write)."""
    import base64
    import datetime as dt

    from django.conf import settings
    from django.db import connection, transaction
    from django.utils import timezone

    from audit import triggers
    from audit.actions import _copy_events
    from audit.chain import GENESIS, MerkleFrontier, canonical_json
    from audit.checkpoints import (
        FORMAT,
        Checkpoint,
        _write_file,
        key_id,
        load_private_key,
    )
    from audit.models import AuditHead
    from audit.sealer import seal

    settings.DLO_AUDIT_SEALER = "off"
    seal()
    key = load_private_key(settings.DLO_AUDIT_SIGNING_KEY)
    kid = key_id(key.public_key())
    head = AuditHead.objects.get(pk=1)
    frontier, prev, seq = MerkleFrontier.loads(head.frontier), head.hash or GENESIS, head.seq
    assert seq == 0, "part 5 needs an empty log (run it on its own: BENCH_PARTS=5)"
    triggers.drop(connection)  # sealed rows straight in, past the insert trigger
    sizes = iter([max(1, -(-i * total // checkpoints)) for i in range(1, checkpoints + 1)])
    next_size, number, prev_cp = next(sizes), 0, GENESIS
    year_ago = timezone.now().astimezone(dt.UTC) - dt.timedelta(minutes=checkpoints + 1)
    start = time.perf_counter()
    while seq < total:
        n = min(2_000, total - seq)
        rows, _ = [], None
        for _ in range(n):
            batch, prev = _sealed_rows(seq + 1, 1, prev, frontier)
            rows += batch
            seq += 1
            while next_size == seq:
                number += 1
                body = {"format": FORMAT, "number": number, "tree_size": seq,
                        "root_hash": frontier.root(), "head_hash": prev,
                        "time": (year_ago + dt.timedelta(minutes=number))
                        .strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                        "prev_checkpoint": prev_cp, "key_id": kid}  # fmt: skip
                signature = base64.b64encode(key.sign(canonical_json(body).encode()))
                cp = Checkpoint(body, signature.decode("ascii"))
                _write_file(directory, cp, sync=False)  # a day segment each 1,440
                prev_cp = cp.digest()
                next_size = next(sizes, -1)
        with transaction.atomic():
            _copy_events(rows)
    AuditHead.objects.filter(pk=1).update(
        seq=seq, hash=prev, frontier=frontier.dumps(), sealed_at=timezone.now(),
        checkpoint_number=number, checkpoint_tree_size=seq, checkpoint_root=frontier.root(),
        checkpoint_at=timezone.now(),
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_auditevent")
    triggers.install(connection)
    print(
        f"  stored {seq} events and {number} signed checkpoint files in "
        f"{time.perf_counter() - start:.0f} s"
    )


def checkpoints_at_scale(workdir: Path) -> None:
    """Part 5, in its steps: the data set, verification, writes and proofs, a witness, the
    offline verifier."""
    from django.conf import settings

    directory = Path(settings.DLO_AUDIT_CHECKPOINT_DIR)
    _store_events_and_checkpoints(VERIFY_EVENTS, CHECKPOINTS, directory)
    _measure_verify(directory)
    _measure_writes_and_proofs()
    _measure_witness(workdir)
    _measure_offline_verifier(directory)


def _measure_verify(directory: Path) -> None:
    from audit import tree
    from audit.actions import verify_chain
    from audit.chain import MerkleFrontier
    from audit.checkpoints import read_dir, trusted_keys, verify_chain_of_checkpoints
    from audit.models import AuditHead

    head = AuditHead.objects.get(pk=1)
    start = time.perf_counter()
    tree.extend(head.seq, MerkleFrontier.loads(head.frontier).root())
    print(
        f"  stored Merkle subtrees built once (the one-time upgrade of an existing log) "
        f"in {time.perf_counter() - start:.0f} s"
    )
    start = time.perf_counter()
    files = read_dir(directory)
    read_s = time.perf_counter() - start
    check = verify_chain_of_checkpoints(files, trusted_keys(), expected_last=len(files))
    chain_s = time.perf_counter() - start - read_s
    print(
        f"  of which: reading {len(files)} checkpoint files {read_s:.1f} s, checking their "
        f"numbers, links and signatures {chain_s:.1f} s (ok={check.ok})"
    )
    del files, check
    start = time.perf_counter()
    walk_only = verify_chain(checkpoint_dir=None)
    print(
        f"  the walk alone (no checkpoints): {walk_only.events} events in "
        f"{time.perf_counter() - start:.1f} s"
    )
    start = time.perf_counter()
    result = verify_chain(checkpoint_dir=directory)
    elapsed = time.perf_counter() - start
    print(f"  audit verify: {result.summary()[:90]}")
    print(
        f"  verified {result.events} events against {result.checkpoints_matched} checkpoints "
        f"in {elapsed:.1f} s (load {os.getloadavg()[0]:.2f})"
    )


def _measure_writes_and_proofs() -> None:
    import random

    from django.conf import settings

    from audit import tree
    from audit.actions import Actor, record
    from audit.checkpoints import write_checkpoint
    from audit.status import log_status

    settings.DLO_AUDIT_SEALER = "inline"
    for label in ("next", "one after"):
        record("bench.tick", actor=Actor(1, "bench"))
        start = time.perf_counter()
        cp = write_checkpoint()
        print(
            f"  {label} checkpoint write (#{cp.number if cp else '-'}): "
            f"{(time.perf_counter() - start) * 1000:.1f} ms"
        )
    start = time.perf_counter()
    for _ in range(20):
        log_status()
    print(f"  audit page / metrics status: {(time.perf_counter() - start) / 20 * 1000:.1f} ms")
    size = tree.stored_size()
    pairs = [(random.randint(1, size), size) for _ in range(200)]
    start = time.perf_counter()
    for first, second in pairs:
        tree.consistency_proof(min(first, second), second)
    per = (time.perf_counter() - start) / len(pairs) * 1000
    print(f"  consistency proof at {size} leaves: {per:.2f} ms each (200 random pairs)")


def _measure_witness(workdir: Path) -> None:
    from django.conf import settings
    from django.test import Client

    from audit import witness
    from audit.actions import Actor, record
    from audit.checkpoints import write_checkpoint
    from audit.verify_export import read_public_key
    from dashboard.models import ApiToken
    from tests.conftest import make_user

    token = ApiToken.issue(make_user("bench-witness", "audit_witness"), "bench")[1]

    class ClientLog:
        client = Client()

        def get(self, path: str) -> Any:
            response = self.client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
            if response.status_code != 200:
                raise witness.CannotCheck(f"{path}: {response.status_code}")
            return response.json()

    pinned = read_public_key(f"{settings.DLO_AUDIT_SIGNING_KEY}.pub")
    state = workdir / "witness.jsonl"
    witness.poll(ClientLog(), pinned, str(state))  # the first head (trusted on first use)
    times = []
    for _ in range(10):
        record("bench.tick", actor=Actor(1, "bench"))
        write_checkpoint()
        start = time.perf_counter()
        witness.poll(ClientLog(), pinned, str(state))
        times.append(time.perf_counter() - start)
    times.sort()
    print(
        f"  witness poll (fetch, Ed25519 check in pure Python, consistency proof, state "
        f"append): median {times[5] * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms"
    )


def _measure_offline_verifier(directory: Path) -> None:
    import subprocess
    import sys

    from django.conf import settings

    script = Path(__file__).resolve().parents[1] / "audit" / "verify_export.py"
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import verify_export as v; "
        "keys = dict([v.read_public_key(sys.argv[3])]); t = time.perf_counter(); "
        "good, problem = v.read_checkpoints(sys.argv[2], keys); "
        "print(len(good), problem, f'{time.perf_counter() - t:.1f}')"
    )
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code, str(script.parent), str(directory),
         f"{settings.DLO_AUDIT_SIGNING_KEY}.pub"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    count, problem, seconds = done.stdout.split()[:3] if done.stdout else ("?", done.stderr, "?")
    print(
        f"  verify_export.py read and checked {count} checkpoint files in {seconds} s "
        f"(problem: {problem})"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        setup_django(Path(tmp))
        try:
            print(f"load: {os.getloadavg()}")
            if "1" in PARTS:
                print("1. record() throughput (checkpoint written every 0.5 s meanwhile)")
                for mode in ("inline", "thread"):
                    single_writer(mode)
            if "2" in PARTS:
                print(f"2. audited actions ({ACTION_S * 1000:.0f} ms of work per transaction)")
                for mode in ("inline", "thread"):
                    concurrent(mode)
            if "3" in PARTS:
                print("3. the sealer")
                sealing_rate()
            if "4" in PARTS:
                print(f"4. verify {VERIFY_EVENTS} events")
                verify_million()
            if "5" in PARTS:
                print(f"5. {VERIFY_EVENTS} events and {CHECKPOINTS} checkpoints")
                checkpoints_at_scale(Path(tmp))
            print(f"load: {os.getloadavg()}")
        finally:
            from django.db import connections

            connections.close_all()
            with _pg() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()
