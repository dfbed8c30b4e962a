"""Ingest with each batch stored on a thread of its own while the next is built (PostgreSQL,
outside a transaction of the caller's): acks stay after their commits, in order, on the
caller's thread, and no failure acks what was not committed."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from django.db import DatabaseError, connection

from brokers.base import BrokerError
from brokers.base import DeadLetter as Letter
from dlq.capture import ingest
from dlq.capture.ingest import do_ingest_channel
from dlq.models import DeadLetter, SearchText
from tests.conftest import make_channel
from tests.dlq.conftest import FakeAdapter, FakeSession, letter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("batches are stored on a thread of their own on PostgreSQL only")


class CheckedSession(FakeSession):
    """Acks only what is committed: each ack looks, from the caller's connection, for the
    acked letters' rows, and notes the thread it was called on."""

    def __init__(
        self, *args: Any, events: list[str], fail_fetch_at: int = 0, fetch_ahead: bool = True
    ) -> None:
        super().__init__(*args)
        self.events, self.fetches, self.fail_fetch_at = events, 0, fail_fetch_at
        self.fetch_ahead = fetch_ahead

    def fetch(self, max_batch: int, wait_s: float) -> list[Letter]:
        self.fetches += 1
        if self.fetches == self.fail_fetch_at:
            raise BrokerError("connection reset while fetching")
        return super().fetch(max_batch, wait_s)

    def ack(self, letters: Sequence[Letter]) -> None:
        keys = [lt.dedupe_key for lt in letters]
        committed = DeadLetter.objects.filter(dedupe_key__in=keys).count()
        self.events.append(f"ack {len(keys)} ({committed} committed) on {_thread()}")
        super().ack(letters)


class CheckedAdapter(FakeAdapter):
    def __init__(self, fail_fetch_at: int = 0, fetch_ahead: bool = True) -> None:
        super().__init__()
        self.events: list[str] = []
        self.fail_fetch_at, self.fetch_ahead = fail_fetch_at, fetch_ahead

    def open_drain(self, address: Any) -> CheckedSession:
        queue = self.queues.setdefault(address.name, [])
        return CheckedSession(
            queue,
            self.acked,
            self.fail_ack,
            events=self.events,
            fail_fetch_at=self.fail_fetch_at,
            fetch_ahead=self.fetch_ahead,
        )


def _thread() -> str:
    return "caller" if threading.current_thread() is threading.main_thread() else "other"


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> CheckedAdapter:
    adapter = CheckedAdapter()
    monkeypatch.setattr(ingest.adapters, "adapter_for", lambda channel: adapter)
    return adapter


@pytest.fixture
def store_threads(monkeypatch: pytest.MonkeyPatch, checked: CheckedAdapter) -> list[str]:
    """The thread each batch's transaction ran on, noted in the adapter's events too."""
    seen: list[str] = []
    real = ingest.store_batch

    def noted(*args: Any, **kwargs: Any) -> tuple[int, int]:
        seen.append(threading.current_thread().name)
        counts = real(*args, **kwargs)
        checked.events.append(f"commit {counts[0]}")
        return counts

    monkeypatch.setattr(ingest, "store_batch", noted)
    return seen


def test_batches_are_stored_beside_the_caller_and_acked_after_their_commits(
    checked: CheckedAdapter, store_threads: list[str]
) -> None:
    channel = make_channel()
    bodies = [b'{"n": %d}' % i for i in range(1201)]
    checked.queues["orders.dlq"] = [letter(b) for b in bodies]

    result = do_ingest_channel(channel.pk)

    assert (result.fetched, result.inserted, result.duplicates, result.batches) == (
        1201, 1201, 0, 3,
    )  # fmt: skip
    assert store_threads and all(n.startswith("dlq-ingest-store") for n in store_threads)
    assert checked.events == [
        "commit 500", "ack 500 (500 committed) on caller",
        "commit 500", "ack 500 (500 committed) on caller",
        "commit 201", "ack 201 (201 committed) on caller",
    ]  # fmt: skip
    assert [lt.body for lt in checked.acked] == bodies  # in fetch order
    stored = {bytes(b) for b in DeadLetter.objects.values_list("body", flat=True)}
    assert stored == set(bodies) and not checked.queues["orders.dlq"]
    assert SearchText.objects.count() == 1201  # the indexer followed the acks


def test_a_session_that_holds_the_next_batch_until_the_ack_is_stored_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ActiveMQ delivers no more than its page until the caller acks: fetching ahead would
    find nothing and end the drain early, so such a session's batches are stored here."""
    adapter = CheckedAdapter(fetch_ahead=False)
    monkeypatch.setattr(ingest.adapters, "adapter_for", lambda channel: adapter)
    threads: list[str] = []
    real = ingest.store_batch

    def noted(*args: Any, **kwargs: Any) -> tuple[int, int]:
        threads.append(_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest, "store_batch", noted)
    channel = make_channel()
    adapter.queues["orders.dlq"] = [letter(b'{"n": %d}' % i) for i in range(1001)]

    result = do_ingest_channel(channel.pk)

    assert (result.fetched, result.inserted) == (1001, 1001)
    assert threads == ["caller", "caller", "caller"]
    assert adapter.events == [
        "ack 500 (500 committed) on caller",
        "ack 500 (500 committed) on caller",
        "ack 1 (1 committed) on caller",
    ]


def test_a_failed_store_is_not_acked_and_the_batch_before_it_is(
    checked: CheckedAdapter, store_threads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = make_channel()
    letters = [letter(b'{"n": %d}' % i) for i in range(1500)]
    checked.queues["orders.dlq"] = list(letters)
    real, calls = ingest._insert_new, []

    def second_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise DatabaseError("connection lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest, "_insert_new", second_fails)
    with pytest.raises(DatabaseError):
        do_ingest_channel(channel.pk)

    assert [lt.dedupe_key for lt in checked.acked] == [lt.dedupe_key for lt in letters[:500]]
    assert DeadLetter.objects.count() == 500
    # The failed batch, and the one built behind it, went back to the broker.
    assert len(checked.queues["orders.dlq"]) == 1000

    monkeypatch.setattr(ingest, "_insert_new", real)
    again = do_ingest_channel(channel.pk)
    assert (again.inserted, again.duplicates) == (1000, 0)
    assert DeadLetter.objects.count() == 1500 and not checked.queues["orders.dlq"]


def test_a_failure_while_a_batch_is_stored_still_acks_it_once_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    adapter = CheckedAdapter(fail_fetch_at=2)
    monkeypatch.setattr(ingest.adapters, "adapter_for", lambda channel: adapter)
    channel = make_channel()
    adapter.queues["orders.dlq"] = [letter(b'{"n": %d}' % i) for i in range(700)]

    result = do_ingest_channel(channel.pk)  # a broker error is reported, not raised

    assert result.errors == ["connection reset while fetching"]
    assert adapter.events == ["ack 500 (500 committed) on caller"]
    assert DeadLetter.objects.count() == 500
    assert len(adapter.queues["orders.dlq"]) == 200


def test_crash_after_commit_exits_before_the_ack(
    checked: CheckedAdapter, store_threads: list[str], crash_exits: list[int]
) -> None:
    channel = make_channel()
    checked.queues["orders.dlq"] = [letter(b'{"n": %d}' % i) for i in range(3)]
    with pytest.raises(SystemExit):
        do_ingest_channel(channel.pk)
    assert crash_exits == [137] and checked.acked == []
    assert store_threads[0].startswith("dlq-ingest-store")
    assert DeadLetter.objects.count() == 3  # committed by the stage's thread
