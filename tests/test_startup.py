"""Long-lived processes settle their heap once they are ready (``config.startup``): the web
server at start-up (``tests/dashboard/test_startup.py``), a Celery worker in each process that
runs tasks. Each probe runs in a process of its own: freezing the test runner's heap would
change every later test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SIGNAL = """
import gc, sys
import django
django.setup()
import config  # the entry points' import: connects the worker's signals
from celery import signals
before = gc.get_freeze_count()
getattr(signals, sys.argv[1]).send(sender=None)
print(before, gc.get_freeze_count())
"""

CYCLE = """
import gc
from config.startup import settle_process_heap
class Cycle:
    pass
a, b = Cycle(), Cycle()
a.other, b.other = b, a
del a, b  # garbage only a collection can free
frozen = settle_process_heap()
gc.unfreeze()
print(frozen, sum(1 for o in gc.get_objects() if type(o) is Cycle))
"""


def _probe(code: str, *args: str) -> list[int]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    return [int(n) for n in out]


@pytest.mark.parametrize("signal", ["worker_process_init", "worker_ready"])
def test_a_worker_process_freezes_what_start_up_left_alive(signal: str) -> None:
    before, after = _probe(SIGNAL, signal)
    assert before == 0
    assert after > 10_000  # settings, apps, models, tasks and broker clients


def test_settling_collects_before_it_freezes() -> None:
    frozen, cycles_left = _probe(CYCLE)
    assert frozen > 0
    assert cycles_left == 0  # collected, not frozen (it would be back in the heap now)
