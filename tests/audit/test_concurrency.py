"""Concurrent writers queue behind the head lock instead of forking the chain."""

from __future__ import annotations

import threading

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
