"""What a long-lived process does once, after start-up and before its first request or task."""

from __future__ import annotations

import gc
from typing import Any

from django.urls import get_resolver


def settle_heap() -> int:
    """The web server's: import every view now (not in the first request), then
    ``settle_process_heap``. Returns how many objects were frozen."""
    get_resolver().url_patterns  # noqa: B018 - imports the URLconf and every view module
    return settle_process_heap()


def settle_process_heap(**_signal: Any) -> int:
    """Collect once, then move every object still alive out of the garbage collector's
    generations (``gc.freeze``). A full collection then walks only what requests and tasks
    create, not the ~150,000 objects of settings, apps, models, URLs, views and broker
    clients: those collections paused a page 60-70 ms in ~1 of 30 requests, and took 13-30 %
    of a replay relay's time (docs/performance.md). Objects frozen here are still freed when
    their references go; only a reference cycle among them would outlive its use, and
    start-up makes few. Also a Celery signal handler (``config.celery``). Returns how many
    objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
