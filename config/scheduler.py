"""The in-process scheduler used by ``make run`` instead of Celery beat and a worker.

One daemon thread runs every job of ``config.periodic.PERIODIC_JOBS`` at its interval (with a
little jitter), each call bounded by the job itself; a failing job is logged and retried at its
next tick. Started only when ``DLO_INPROCESS_SCHEDULER`` is set, and only in the serving process
(not in the autoreloader's parent, not in management commands).
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from importlib import import_module
from typing import Any

from django.conf import settings

from config.periodic import PERIODIC_JOBS

log = logging.getLogger(__name__)
_started = threading.Event()


def _resolve(dotted: str) -> Any:
    module_name, attr = dotted.rsplit(".", 1)
    return getattr(import_module(module_name), attr)


def run_forever(stop: threading.Event) -> None:
    next_due = {name: time.monotonic() + 5.0 for name in PERIODIC_JOBS}
    while not stop.is_set():
        now = time.monotonic()
        for name, (dotted, every) in PERIODIC_JOBS.items():
            if now < next_due[name]:
                continue
            next_due[name] = now + every * random.uniform(0.95, 1.05)
            try:
                _resolve(dotted)()
            except Exception:
                log.exception("periodic job %s failed; retrying at its next tick", name)
        stop.wait(min(1.0, max(0.05, min(next_due.values()) - time.monotonic())))


def start_if_enabled() -> None:
    if not settings.DLO_INPROCESS_SCHEDULER or _started.is_set():
        return
    serving = "runserver" in sys.argv and os.environ.get("RUN_MAIN") == "true"
    if not serving:
        return
    _started.set()
    thread = threading.Thread(
        target=run_forever, args=(threading.Event(),), name="dlo-scheduler", daemon=True
    )
    thread.start()
    log.info("in-process scheduler started with %d jobs", len(PERIODIC_JOBS))
