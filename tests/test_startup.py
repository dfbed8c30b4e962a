"""Long-lived processes settle their heap once they are ready (``config.startup``): the web
server at start-up, a Celery worker in each process that runs tasks."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from celery.signals import worker_process_init, worker_ready

import config  # noqa: F401 - the entry points' import: connects the worker's signals
from config.startup import settle_process_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("signal", [worker_process_init, worker_ready], ids=["pool", "main"])
def test_a_worker_process_freezes_what_start_up_left_alive(signal: object, unfrozen: None) -> None:
    assert gc.get_freeze_count() == 0
    signal.send(sender=None)  # type: ignore[attr-defined]
    # Everything alive at that moment, the test session's own modules and objects included.
    assert gc.get_freeze_count() > 10_000


def test_settling_collects_first(unfrozen: None) -> None:
    class Cycle:
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    del a, b  # garbage only a collection can free
    frozen = settle_process_heap()
    assert frozen == gc.get_freeze_count()
    assert not any(type(o) is Cycle for o in gc.get_objects(generation=2))
    gc.unfreeze()
    assert not any(type(o) is Cycle for o in gc.get_objects())
