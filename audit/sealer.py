"""The sealer: the one place where audit events get their order and their hashes.

Actions insert events *unsealed* (``seq`` and ``hash`` null) in their own transactions, so no
writer waits for another (the head row lock used to serialise every audited action). The
sealer, like a Certificate Transparency log's sequencer, takes the unsealed events in arrival
order, in batches, under the head row's lock: it numbers them after the head, chains their
hashes, extends the Merkle tree's right edge (``AuditHead.frontier``) and moves the head — one
transaction per batch. Only one sealer runs at a time: a second one finds the head row locked
and leaves (``SKIP LOCKED``) instead of queueing.

Who seals (``DLO_AUDIT_SEALER``):

* ``thread`` (default): each process that records an event wakes a small daemon thread of its
  own after the commit, which seals within ~0.1 s. The periodic job ``seal-audit-events``
  (every 2 s, Celery beat or the in-process scheduler) seals whatever a process that died
  before its thread ran left behind. The unsealed window is therefore bounded by seconds; the
  audit page and ``/metrics`` show its current size and age.
* ``inline``: the recording transaction seals at once (the old behaviour: writers queue on the
  head lock). The test suite uses it so that an event has its ``seq`` when ``record`` returns.
* ``off``: only the periodic job seals.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime as dt
import logging
import os
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, connection, transaction
from django.utils import timezone

from audit.anchors import MAC_ANCHOR
from audit.chain import GENESIS, MerkleFrontier, canonical_time, chain_hash, leaf_hash
from audit.mac import MacChecker, load_key
from audit.models import AuditEvent, AuditHead, RefusedEvent
from audit.recording import Actor, record

log = logging.getLogger(__name__)

BATCH = 5000  # events per sealing transaction
MAX_PER_RUN = 500_000  # a bound on one call; the next wake-up or tick continues
WAKE_DELAY_S = 0.05  # let a burst of commits gather before sealing it


class HeadMissing(RuntimeError):
    """The head row is gone while sealed events exist: the log cannot continue honestly."""


def seal(*, wait: bool = False) -> int:
    """Seal every unsealed event (up to ``MAX_PER_RUN``); returns how many. With ``wait``
    False another sealer at work makes this return 0 at once. Rows without a valid MAC (or
    misdated) are refused, kept out of the chain and alarmed on (``_alarm``)."""
    total = 0
    processed = 0
    while processed < MAX_PER_RUN:
        sealed, refused = _seal_batch(wait)
        total += sealed
        processed += sealed + len(refused)
        if refused:
            _alarm(refused)
        if sealed + len(refused) < BATCH:
            break
    return total


@dataclasses.dataclass(frozen=True)
class Refusal:
    event_id: int
    action: str
    actor: str
    created_at: dt.datetime
    problem: str


def _locked_head(wait: bool) -> AuditHead | None:
    head = AuditHead.objects.select_for_update(skip_locked=not wait).filter(pk=1).first()
    if head is not None:
        return head
    if AuditHead.objects.filter(pk=1).exists():
        return None  # another sealer holds it
    if AuditEvent.objects.filter(seq__isnull=False).exists():
        # A first writer may have created the head and sealed (one transaction) between the
        # reads above: its sealed events are visible now, so its head is too, unless it is gone.
        if AuditHead.objects.filter(pk=1).exists():
            return AuditHead.objects.select_for_update(skip_locked=not wait).filter(pk=1).first()
        raise HeadMissing(
            "the audit head row is missing while sealed events exist: new events stay "
            "unsealed until it is restored (run `manage.py audit verify`)"
        )
    AuditHead.objects.bulk_create([AuditHead(pk=1, seq=0, hash="")], ignore_conflicts=True)
    return AuditHead.objects.select_for_update(skip_locked=not wait).filter(pk=1).first()


def _exempt_below() -> int:
    """Rows recorded before the MAC existed are sealed without one: those with ids up to the
    MAC anchor while it is itself unsealed and no sealed row carries a MAC yet (migration
    0007_audit_a_mac runs before any MAC is made). Otherwise every row needs a MAC, and
    ``audit verify`` holds the same line by seq."""
    anchor = (
        AuditEvent.objects.filter(action=MAC_ANCHOR, seq__isnull=True)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if anchor is None:
        return 0
    if AuditEvent.objects.filter(action=MAC_ANCHOR, seq__isnull=False).exists():
        return 0  # a second anchor is forged
    if AuditEvent.objects.filter(seq__isnull=False).exclude(mac="").exists():
        return 0  # MACs existed before this "anchor": forged
    return anchor + 1


def _latest_created(head: AuditHead) -> dt.datetime | None:
    if head.created_max is not None or not head.seq:
        return head.created_max
    return AuditEvent.objects.filter(seq=head.seq).values_list("created_at", flat=True).first()


def _seal_batch(wait: bool) -> tuple[int, list[Refusal]]:
    with transaction.atomic():
        head = _locked_head(wait)
        if head is None:
            return 0, []
        rows = list(
            AuditEvent.objects.filter(seq__isnull=True)
            .exclude(id__in=RefusedEvent.objects.values("event_id"))
            .order_by("id")
            .values_list(
                "id", "index_json", "detail_json", "mac", "created_at", "action",
                "actor_username",
            )[:BATCH]
        )  # fmt: skip
        if not rows:
            return 0, []
        frontier = MerkleFrontier.loads(head.frontier)
        if frontier.size != head.seq:
            raise HeadMissing(
                f"the head's Merkle tree has {frontier.size} leaves but the head is "
                f"#{head.seq}: the head row was altered; sealing stops until it is restored"
            )
        mac_ok = MacChecker(load_key())
        exempt_below = _exempt_below()
        tolerance = dt.timedelta(seconds=settings.DLO_AUDIT_CLOCK_TOLERANCE_S)
        latest = _latest_created(head)
        future = timezone.now() + tolerance
        seq, prev = head.seq, head.hash or GENESIS
        ids, seqs, prevs, hashes = [], [], [], []
        refused: list[Refusal] = []
        for pk, index_json, detail_json, mac, created_at, action, actor in rows:
            problem = _refusal(
                pk, index_json, detail_json, mac, created_at, mac_ok, exempt_below, latest,
                future, tolerance,
            )  # fmt: skip
            if problem:
                refused.append(Refusal(pk, action, actor, created_at, problem))
                continue
            latest = created_at if latest is None else max(latest, created_at)
            seq += 1
            leaf = leaf_hash(index_json, detail_json)
            digest = chain_hash(prev, leaf)
            frontier.append(leaf)
            ids.append(pk)
            seqs.append(seq)
            prevs.append(prev)
            hashes.append(digest)
            prev = digest
        if refused:
            RefusedEvent.objects.bulk_create(
                [RefusedEvent(event_id=r.event_id, problem=r.problem) for r in refused],
                ignore_conflicts=True,
            )
        if ids:
            _apply(ids, seqs, prevs, hashes)
            AuditHead.objects.filter(pk=1).update(
                seq=seq,
                hash=prev,
                frontier=frontier.dumps(),
                sealed_at=timezone.now(),
                created_max=latest,
            )
    return len(ids), refused


def _refusal(
    pk: int,
    index_json: str,
    detail_json: str,
    mac: str,
    created_at: dt.datetime,
    mac_ok: MacChecker,
    exempt_below: int,
    latest: dt.datetime | None,
    future: dt.datetime,
    tolerance: dt.timedelta,
) -> str:
    """Why a row may not join the chain ("" when it may)."""
    if not index_json or not detail_json:
        return "the row has no canonical texts (a format-1 row cannot be added to the log)"
    if pk >= exempt_below and not mac_ok(
        mac, index_json.encode("utf-8"), detail_json.encode("utf-8")
    ):
        return (
            "no valid MAC: the row was not written by the application (inserted directly "
            "into the database)"
        )
    if latest is not None and created_at < latest - tolerance:
        behind = (latest - created_at).total_seconds()
        return (
            f"dated {behind:.0f} s before an event already sealed (tolerance "
            f"{tolerance.total_seconds():.0f} s): misdated or inserted late"
        )
    if created_at > future:
        return "dated in the future beyond the clock tolerance"
    return ""


def _alarm(refused: list[Refusal]) -> None:
    """An alarm per refused row: an error in the log and an audited event (the application
    writes it, with its MAC); the audit page and /metrics count ``RefusedEvent`` rows."""
    for r in refused:
        log.error(
            "audit sealer refused row id=%s (action %r, actor %r): %s",
            r.event_id, r.action[:64], r.actor[:150], r.problem,
        )  # fmt: skip
        record(
            "audit.event_refused",
            actor=Actor.system("audit-sealer"),
            target_type="audit.auditevent",
            target_id=r.event_id,
            target_repr=f"unsealed row id={r.event_id}",
            reason=r.problem,
            after={
                "action": r.action[:64],
                "actor": r.actor[:150],
                "created_at": canonical_time(r.created_at),
            },
            outcome="failed",
        )


def _apply(ids: list[int], seqs: list[int], prevs: list[str], hashes: list[str]) -> None:
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # ``e.seq IS NULL`` lets the join read the small partial index of unsealed rows
            # instead of hashing the whole table for every batch.
            cursor.execute(
                f"UPDATE {table} AS e SET seq = v.seq, prev_hash = v.prev, hash = v.hash "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::text[]) "
                "AS v(id, seq, prev, hash) WHERE e.id = v.id AND e.seq IS NULL",
                [ids, seqs, prevs, hashes],
            )
        else:
            cursor.executemany(
                f"UPDATE {table} SET seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
                list(zip(seqs, prevs, hashes, ids, strict=True)),
            )


# -- who seals, and when ---------------------------------------------------------------------

_wake = threading.Event()
_checkpoint_wanted = threading.Event()
_sealing = threading.Event()
_thread_lock = threading.Lock()
_thread: tuple[int, threading.Thread] | None = None


def after_record(event: AuditEvent | None) -> None:
    """Called by ``record``/``record_many`` inside the recording transaction."""
    mode = settings.DLO_AUDIT_SEALER
    if mode == "inline":
        try:
            seal(wait=True)
        except HeadMissing as exc:  # the event stays unsealed: recording never fails
            log.error("%s", exc)
            return
        if event is not None:
            event.refresh_from_db(fields=["seq", "prev_hash", "hash"])
    elif mode == "thread":
        transaction.on_commit(wake)


def wake() -> None:
    """Ask this process's sealer thread to seal soon (starting it if needed)."""
    global _thread
    with _thread_lock:
        pid = os.getpid()
        if _thread is None or _thread[0] != pid or not _thread[1].is_alive():
            if _thread is None or _thread[0] != pid:
                atexit.register(_seal_at_exit)
            thread = threading.Thread(target=_run, name="dlo-audit-sealer", daemon=True)
            _thread = (pid, thread)
            thread.start()
    _wake.set()


def request_checkpoint() -> None:
    """Call at the end of a burst (a replay or discard plan that finishes): once the current
    transaction commits, seal everything and write a signed checkpoint at once instead of at
    the next interval. Never raises: a checkpoint failure is kept for the audit page and
    /metrics like the periodic one's."""
    if settings.DLO_AUDIT_SEALER == "thread":
        transaction.on_commit(_checkpoint_soon)
    else:
        transaction.on_commit(_seal_and_checkpoint)


def _checkpoint_soon() -> None:
    _checkpoint_wanted.set()
    wake()


def _seal_and_checkpoint() -> None:
    from audit.checkpoints import CheckpointError, write_checkpoint

    try:
        seal(wait=True)
        write_checkpoint()
    except (CheckpointError, HeadMissing) as exc:
        log.warning("audit checkpoint after a burst not written: %s", exc)


def _seal_at_exit() -> None:
    """A short-lived process (a management command) seals what it recorded before it exits,
    rather than leaving it to the periodic job (only when its thread has not yet)."""
    if not _wake.is_set() and not _sealing.is_set():
        return
    try:
        seal(wait=True)
    except Exception as exc:  # the periodic job seals it; logging may be shut down already
        print(f"audit: sealing at exit failed ({exc}); the periodic job will", file=sys.stderr)


def _run() -> None:
    while True:
        _wake.wait()
        time.sleep(WAKE_DELAY_S)
        _wake.clear()
        _sealing.set()
        try:
            if _checkpoint_wanted.is_set():
                _checkpoint_wanted.clear()
                _seal_and_checkpoint()
            else:
                seal()
        except (DatabaseError, InterfaceError) as exc:  # an outage: one line, no traceback
            first = (str(exc).strip().splitlines() or [""])[0]
            log.warning("sealing audit events failed (%s); the periodic job retries", first)
        except Exception:
            log.exception("sealing audit events failed; the periodic job retries")
        finally:
            connection.close()  # idle between bursts: hold no connection
            _sealing.clear()


STATUS_LIMIT = 100_000  # the count shown stops here (a bounded read of the partial index)


def unsealed_status() -> dict[str, Any]:
    """How many events wait to be sealed (up to ``STATUS_LIMIT``) and how old the oldest is
    (seconds): a bounded read of the unsealed rows' partial index, no COUNT."""
    pending = (
        AuditEvent.objects.filter(seq__isnull=True)
        .exclude(id__in=RefusedEvent.objects.values("event_id"))
        .order_by("id")
    )
    count = len(pending.values_list("id", flat=True)[:STATUS_LIMIT])
    oldest: dt.datetime | None = (
        pending.order_by("created_at").values_list("created_at", flat=True).first()
        if count
        else None
    )
    age = (timezone.now() - oldest).total_seconds() if oldest else 0.0
    refused = RefusedEvent.objects.count()  # a handful, or an attack in progress
    return {"count": count, "oldest_age_s": max(age, 0.0), "refused": refused}
