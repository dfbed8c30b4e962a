"""The web server's start-up leaves its long-lived objects out of the collector's way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, sys
import config.asgi
views = ('config.urls', 'dlq.triage.views', 'audit.views')
print(gc.get_freeze_count(), all(m in sys.modules for m in views))
"""


def test_loading_the_asgi_app_imports_the_views_and_freezes_the_heap() -> None:
    # A process of its own: freezing the test runner's heap would change every later test.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    frozen, views_loaded = int(out[0]), out[1] == "True"
    assert views_loaded  # the URLconf was resolved at start-up, not in the first request
    assert frozen > 10_000  # settings, apps, models, URLs and views
