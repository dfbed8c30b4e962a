"""Helpers for the dead-letter tests: a fake drain session and entry factories."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from brokers.base import Address, BrokerAdapter, DrainSession, Publisher
from brokers.base import DeadLetter as Letter
from channels_registry.models import Channel
from dlq.capture import adapters, ingest, search, store_stage
from dlq.models import DeadLetter, Source, set_status

_seq = itertools.count(1)


def letter(body: bytes = b'{"order": {"id": 1}}', **overrides: Any) -> Letter:
    n = next(_seq)
    fields: dict[str, Any] = {
        "dedupe_key": f"test:{n}:{hashlib.sha256(body).hexdigest()[:16]}",
        "body": body,
        "headers": {"Idempotency-Key": f"key-{n}"},
        "properties": {"content_type": "application/json", "message_id": f"m-{n}"},
        "token": n,
        "broker_id": str(n),
        "redelivery_count": 3,
        "reason": "rejected",
        "first_death_queue": "orders",
        "first_death_exchange": "",
        "first_death_at": 1_700_000_000.0,
        "dead_lettered_at": None,
        "death_history": [],
    }
    fields.update(overrides)
    return Letter(**fields)


def store(channel: Channel, *letters: Letter, source: str = Source.DLQ) -> list[DeadLetter]:
    """Store letters through the real ingest path and return the rows, oldest first."""
    ids: list[int] = []
    ingest.store_batch(channel, list(letters), source, Address(channel.dlq_address or "dlq"), ids)
    search.index_entries(ids)  # as ingest_channel does after the ack
    keys = [lt.dedupe_key for lt in letters]
    return list(DeadLetter.objects.filter(dedupe_key__in=keys).order_by("id"))


def update_entries(entries: Any, **changes: Any) -> None:
    """``QuerySet.update`` of dead letters for a test's set-up (``entries``: a queryset or a
    list of entries), with ``status`` written where it lives, the entries' state rows."""
    ids = (
        [e.pk for e in entries]
        if isinstance(entries, list)
        else list(entries.values_list("pk", flat=True))
    )
    status = changes.pop("status", None)
    if changes:
        DeadLetter.objects.filter(pk__in=ids).update(**changes)
    if status is not None:
        set_status(ids, status)


class FakeSession(DrainSession):
    fetch_ahead = True  # hands out whatever is queued, acked or not

    def __init__(self, queue: list[Letter], acked: list[Letter], fail_ack: bool = False) -> None:
        self.queue, self.acked, self.fail_ack = queue, acked, fail_ack
        self.outstanding: list[Letter] = []
        self.closed = False

    def fetch(self, max_batch: int, wait_s: float) -> list[Letter]:
        batch = self.queue[:max_batch]
        del self.queue[:max_batch]
        self.outstanding.extend(batch)
        return batch

    def ack(self, letters: Sequence[Letter]) -> None:
        from brokers.base import BrokerError

        if self.fail_ack:
            raise BrokerError("ack failed")
        self.acked.extend(letters)
        for lt in letters:
            self.outstanding.remove(lt)

    def close(self) -> None:
        # Unacked letters go back to the broker, as on a real one.
        self.queue[:0] = self.outstanding
        self.outstanding = []
        self.closed = True


class FakeAdapter(BrokerAdapter):
    kind = "fake"

    def __init__(self) -> None:
        super().__init__("fake://")
        self.queues: dict[str, list[Letter]] = {}
        self.acked: list[Letter] = []
        self.prepared: list[Address] = []
        self.fail_ack = False

    def ping(self) -> None:
        return None

    def poll(self, addresses: Sequence[Address]) -> Any:
        raise NotImplementedError

    def inspect(self, addresses: Sequence[Address]) -> Any:
        raise NotImplementedError

    def prepare_drain(self, address: Address) -> None:
        self.prepared.append(address)

    def open_drain(self, address: Address) -> DrainSession:
        return FakeSession(self.queues.setdefault(address.name, []), self.acked, self.fail_ack)

    def open_publisher(self, target: Address) -> Publisher:
        raise NotImplementedError


@pytest.fixture
def fake_adapter(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAdapter]:
    adapter = FakeAdapter()
    monkeypatch.setattr(adapters, "adapter_for", lambda channel: adapter)
    yield adapter


@pytest.fixture
def crash_exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Ingest's crash-after-commit hook on (``DLO_TEST_CRASH_AFTER_COMMIT``), its ``os._exit``
    raising ``SystemExit`` instead: the exit codes, in order."""
    monkeypatch.setenv("DLO_TEST_CRASH_AFTER_COMMIT", "1")
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(store_stage.os, "_exit", fake_exit)
    return exits
