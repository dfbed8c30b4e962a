"""Concurrent writers queue behind the head lock instead of forking the chain."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from audit.actions import Actor, record, verify_chain
from audit.models import AuditEvent


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_do_not_fork_the_chain() -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(10):
                with transaction.atomic():
                    record("test.concurrent", actor=Actor.system(f"w{n}"), target_id=str(i))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert AuditEvent.objects.count() == 40
    assert list(AuditEvent.objects.values_list("seq", flat=True)) == list(range(1, 41))
    assert verify_chain().ok


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_writers_agree_on_one_head_row() -> None:
    """A wiped table has no head row: concurrent first writers must not collide creating it."""
    from audit.models import AuditHead

    AuditHead.objects.all().delete()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(n: int) -> None:
        try:
            start.wait(timeout=30)
            with transaction.atomic():
                record("test.first", actor=Actor.system(f"w{n}"))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert AuditHead.objects.get().seq == 4
    assert verify_chain().ok


@pytest.mark.django_db(transaction=True)
def test_a_writer_never_waits_for_another_writers_transaction(settings: Any) -> None:
    """The log is not a global lock: while one action's transaction stays open after
    recording, another action records and commits at once, and the sealer seals it within
    seconds (the open one's event joins the chain when it commits)."""
    from audit.sealer import unsealed_status

    settings.DLO_AUDIT_SEALER = "thread"
    recorded, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def slow_action() -> None:
        try:
            with transaction.atomic():
                record("test.slow", actor=Actor.system("slow"))
                recorded.set()
                release.wait(timeout=30)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    slow = threading.Thread(target=slow_action)
    slow.start()
    try:
        assert recorded.wait(timeout=30)
        with connection.cursor() as cursor:  # a held lock would make this fail, not wait
            cursor.execute("SET lock_timeout = '2s'" if connection.vendor == "postgresql" else "")
        if connection.vendor == "postgresql":
            with transaction.atomic():
                fast = record("test.fast", actor=Actor.system("fast"))
            assert fast.seq is None  # unsealed until the sealer runs
            deadline = time.monotonic() + 30
            while AuditEvent.objects.get(pk=fast.pk).seq is None:
                assert time.monotonic() < deadline, "the sealer did not seal within 30 s"
                time.sleep(0.05)
            assert AuditEvent.objects.get(pk=fast.pk).seq == 1
    finally:
        release.set()
        slow.join(timeout=60)
    assert not errors
    deadline = time.monotonic() + 30
    while unsealed_status()["count"]:
        assert time.monotonic() < deadline, "the sealer did not seal within 30 s"
        time.sleep(0.05)
    assert verify_chain().ok


@pytest.mark.django_db(transaction=True)
def test_the_periodic_job_seals_what_no_thread_did(settings: Any) -> None:
    from audit.tasks import seal_audit_events_task

    settings.DLO_AUDIT_SEALER = "off"
    for i in range(3):
        record("test.off", actor=Actor.system(), target_id=str(i))
    assert AuditEvent.objects.filter(seq__isnull=True).count() == 3
    assert verify_chain().events == 0  # an unsealed tail is not claimed as verified
    assert seal_audit_events_task() == 3
    assert list(AuditEvent.objects.order_by("id").values_list("seq", flat=True)) == [1, 2, 3]
    assert verify_chain().ok
