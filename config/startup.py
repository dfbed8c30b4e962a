"""What the web server does once, after start-up and before its first request."""

from __future__ import annotations

import gc

from django.urls import get_resolver


def settle_heap() -> int:
    """Import every view now (not in the first request), collect once, then move every object
    still alive out of the garbage collector's generations (``gc.freeze``). A full collection
    then walks only what requests create, not the ~130,000 objects of settings, apps, models,
    URLs and views: those collections paused a page 60-70 ms in ~1 of 30 requests
    (docs/performance.md). Objects frozen here are still freed when their references go;
    only a reference cycle among them would outlive its use, and start-up makes few.
    Returns how many objects were frozen."""
    get_resolver().url_patterns  # noqa: B018 - imports the URLconf and every view module
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
