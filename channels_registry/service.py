"""Long-running commands (``poll`` and ``ingest`` without ``--once``) that ride out outages.

``run_service`` repeats one step until SIGTERM/SIGINT:

1. Run the step. It returns how long to wait before the next one.
2. A database failure (PostgreSQL restarting, connections terminated, the database refusing
   connections) is one log line, not a traceback: the connections are closed so the next step
   reconnects, and the loop waits with bounded exponential backoff (1 s doubling to
   ``max_backoff_s``, with jitter). When the database answers again, one line says so.
3. Any other unexpected error is handled the same way (one line; the traceback only at debug
   level), so an operator's terminal and log stay readable.
4. SIGTERM and SIGINT set a flag; the loop ends after the current step, and every wait is cut
   short by it. The step itself is bounded (brokers have timeouts, batches are bounded).

Broker outages are the step's business: each step reports a broker that does not answer in
its result, and keeps its own per-broker or per-channel backoff.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django.db import DatabaseError, InterfaceError, connections
from django.db.models import QuerySet

log = logging.getLogger(__name__)

Write = Callable[[str], None]


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs (main thread only)."""
    stop = threading.Event()
    previous = {}

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def one_line(exc: BaseException) -> str:
    """The first line of an error, prefixed with its type: what a log line has room for."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


class Backoff:
    """Bounded exponential backoff with jitter: 1 s, 2 s, 4 s … ``cap_s``."""

    def __init__(self, cap_s: float, first_s: float = 1.0) -> None:
        self.cap_s, self.first_s, self.failures = cap_s, first_s, 0

    def next_delay(self) -> float:
        self.failures += 1
        delay = min(self.cap_s, self.first_s * 2 ** min(self.failures - 1, 30))
        return delay * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self.failures = 0


def exists_unless_away(rows: QuerySet[Any], *, once: bool) -> bool:
    """Whether ``rows`` has any row, for a command's start-up check. The long-running form
    starts even while the database is away (``run_service`` rides the outage out), so there
    an unreachable database counts as "yes, maybe"; only a one-shot run lets the error out."""
    try:
        return rows.exists()
    except (DatabaseError, InterfaceError):
        if once:
            raise
        return True


def run_service(
    name: str,
    step: Callable[[], float],
    *,
    write: Write,
    stop: threading.Event,
    max_backoff_s: float = 60.0,
) -> None:
    """Run ``step`` until ``stop`` is set (module docstring). ``write`` takes one line."""
    backoff = Backoff(max_backoff_s)
    failing = ""
    while not stop.is_set():
        try:
            wait_s = step()
        except (DatabaseError, InterfaceError) as exc:
            failing = "database"
            close_connections()
            delay = backoff.next_delay()
            write(f"{name}: database unavailable ({one_line(exc)}); retrying in {delay:.0f} s")
            stop.wait(delay)
            continue
        except Exception as exc:
            failing = "error"
            log.debug("%s step failed", name, exc_info=True)
            close_connections()
            delay = backoff.next_delay()
            write(f"{name}: step failed ({one_line(exc)}); retrying in {delay:.0f} s")
            stop.wait(delay)
            continue
        if failing:
            write(f"{name}: {'database' if failing == 'database' else 'step'} ok again")
            failing = ""
        backoff.reset()
        stop.wait(max(0.0, wait_s))
    write(f"{name}: stopped")


def close_connections() -> None:
    """Drop this thread's database connections (a broken one included), so its next step
    reconnects: for loops and threads that outlive a database outage."""
    for conn in connections.all(initialized_only=True):
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - a dead connection may fail to close; it is gone
            conn.connection = None
