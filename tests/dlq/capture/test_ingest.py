from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError

from audit.models import AuditEvent
from dlq.capture import ingest
from dlq.capture.ingest import do_ingest_channel
from dlq.models import DeadLetter, FailureGroup, Source, Status
from tests.conftest import make_channel
from tests.dlq.conftest import FakeAdapter, letter, store

pytestmark = pytest.mark.django_db


def test_ingest_stores_raw_bytes_then_acks(fake_adapter: FakeAdapter) -> None:
    channel = make_channel()
    bodies = [b'{"n": %d}' % i for i in range(1200)] + [b"\xff\xfe\x00binary"]
    fake_adapter.queues["orders.dlq"] = [letter(b) for b in bodies]
    result = do_ingest_channel(channel.pk)
    assert (result.fetched, result.inserted, result.duplicates) == (1201, 1201, 0)
    assert result.batches == 3  # 500 + 500 + 201
    assert len(fake_adapter.acked) == 1201 and not fake_adapter.queues["orders.dlq"]
    stored = {bytes(b) for b in DeadLetter.objects.values_list("body", flat=True)}
    assert stored == set(bodies)
    assert fake_adapter.prepared[0].name == "orders.dlq"
    # One audit event per batch, with its counts.
    events = list(AuditEvent.objects.filter(action="dlq.ingest").order_by("seq"))
    assert [e.after["inserted"] for e in events] == [500, 500, 201]


def test_redelivered_letters_are_stored_once(fake_adapter: FakeAdapter) -> None:
    channel = make_channel()
    letters = [letter(b'{"n": %d}' % i) for i in range(10)]
    store(channel, *letters[:4])  # a previous run committed these and crashed before its ack
    fake_adapter.queues["orders.dlq"] = list(letters)
    result = do_ingest_channel(channel.pk)
    assert (result.inserted, result.duplicates) == (6, 4)
    assert DeadLetter.objects.count() == 10
    assert len(fake_adapter.acked) == 10
    assert FailureGroup.objects.get().count == 10


def test_database_failure_means_no_ack(
    fake_adapter: FakeAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = make_channel()
    fake_adapter.queues["orders.dlq"] = [letter() for _ in range(3)]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("connection lost")

    monkeypatch.setattr(ingest, "_insert_new", broken)
    with pytest.raises(DatabaseError):
        do_ingest_channel(channel.pk)
    assert fake_adapter.acked == []
    assert len(fake_adapter.queues["orders.dlq"]) == 3  # back on the broker
    assert DeadLetter.objects.count() == 0
    assert not AuditEvent.objects.filter(action="dlq.ingest").exists()


def test_failed_ack_keeps_the_rows_and_reports(fake_adapter: FakeAdapter) -> None:
    channel = make_channel()
    fake_adapter.queues["orders.dlq"] = [letter()]
    fake_adapter.fail_ack = True
    result = do_ingest_channel(channel.pk)
    assert result.errors == ["ack failed"]
    assert DeadLetter.objects.count() == 1
    assert len(fake_adapter.queues["orders.dlq"]) == 1  # redelivered next run, then deduped


def test_entries_record_the_failure_metadata(fake_adapter: FakeAdapter) -> None:
    channel = make_channel()
    fake_adapter.queues["orders.dlq"] = [
        letter(
            b'{"order": {"id": 42}, "schema_version": "2"}',
            headers={
                "Idempotency-Key": "abc-1",
                "x-exception-class": "OrderNotFound",
                "x-exception-message": "order 42 missing",
            },
            dead_lettered_at=1_700_000_100.0,
            death_history=[{"queue": "orders", "reason": "rejected", "count": 3}],
        )
    ]
    do_ingest_channel(channel.pk)
    entry = DeadLetter.objects.get()
    assert entry.source == Source.DLQ and entry.status == Status.NEW
    assert entry.error_class == "OrderNotFound" and entry.error_message == "order 42 missing"
    assert entry.idempotency_key == "abc-1" and not entry.missing_idempotency_key
    assert entry.schema_version == "2" and entry.is_parseable is True
    assert entry.redelivery_count == 3 and entry.first_death_queue == "orders"
    assert entry.dead_lettered_at.timestamp() == 1_700_000_100.0
    assert entry.content_type == "application/json" and entry.size == len(entry.body)
    assert entry.group is not None and entry.group.error_class == "OrderNotFound"
    assert entry.group.sample_id == entry.pk


@pytest.mark.parametrize(
    ("source", "where", "expected"),
    [
        ("header", "Idempotency-Key", "k-1"),
        ("json-path", "$.order.id", "42"),
        ("json-path", "$.items[1].sku", "b"),
        ("message-id", "", "mid-9"),
    ],
)
def test_idempotency_key_is_read_from_the_declared_location(
    source: str, where: str, expected: str
) -> None:
    channel = make_channel(idempotency_source=source, idempotency_key=where)
    body = b'{"order": {"id": 42}, "items": [{"sku": "a"}, {"sku": "b"}]}'
    [entry] = store(
        channel,
        letter(body, headers={"Idempotency-Key": "k-1"}, properties={"message_id": "mid-9"}),
    )
    assert entry.idempotency_key == expected


def test_entries_without_a_key_are_flagged() -> None:
    channel = make_channel()
    [entry] = store(channel, letter(headers={}))
    assert entry.missing_idempotency_key and entry.idempotency_key == ""


def test_poison_by_address_and_by_unparseable_body_on_poison_channels(
    fake_adapter: FakeAdapter,
) -> None:
    channel = make_channel()  # declares the poison-queue strategy
    fake_adapter.queues["orders.poison"] = [letter(b'{"fine": true}')]
    fake_adapter.queues["orders.dlq"] = [letter(b"{not json"), letter(b'{"ok": 1}')]
    do_ingest_channel(channel.pk)
    sources = dict(DeadLetter.objects.values_list("body", "source"))
    assert {bytes(k): v for k, v in sources.items()} == {
        b'{"fine": true}': Source.POISON,
        b"{not json": Source.POISON,
        b'{"ok": 1}': Source.DLQ,
    }


def test_unparseable_body_stays_dlq_without_a_poison_strategy() -> None:
    channel = make_channel(dlq_strategies=["ttl-with-backoff", "dlq-alert"], poison_address="")
    [entry] = store(channel, letter(b"{not json"))
    assert entry.source == Source.DLQ and entry.is_parseable is False


def test_deeply_nested_body_does_not_break_ingest() -> None:
    channel = make_channel()
    [entry] = store(channel, letter(b"[" * 100_000 + b"]" * 100_000))
    assert entry.is_parseable is False and entry.size == 200_000


def test_nul_characters_in_headers_are_kept_losslessly() -> None:
    channel = make_channel()
    [entry] = store(channel, letter(headers={"x-bad": "a\x00b", "ok\x00": "v"}))
    assert entry.headers["x-bad"] == {"$bytes": "610062"}
    assert "ok\ufffd" in entry.headers


def test_same_failure_with_different_ids_lands_in_one_group() -> None:
    channel = make_channel()
    store(
        channel,
        *[
            letter(headers={"x-exception-class": "NotFound", "x-exception-message": f"id {i}"})
            for i in range(5)
        ],
        letter(headers={"x-exception-class": "Timeout", "x-exception-message": "after 30s"}),
    )
    counts = sorted(FailureGroup.objects.values_list("error_class", "count"))
    assert counts == [("NotFound", 5), ("Timeout", 1)]


def test_search_text_is_lowercased_and_redacted() -> None:
    channel = make_channel(redact_json_paths=["$.card"], redact_headers=["Authorization"])
    [entry] = store(
        channel,
        letter(b'{"card": "4111-SECRET", "Name": "Bob"}', headers={"Authorization": "Bearer X1"}),
    )
    assert "bob" in entry.search_text
    assert "secret" not in entry.search_text and "bearer" not in entry.search_text


def test_ingest_command_prints_a_summary(fake_adapter: FakeAdapter, capsys: Any) -> None:
    make_channel()
    make_channel(slug="no-dlq", address="nodlq", dlq_address="", poison_address="")
    fake_adapter.queues["orders.dlq"] = [letter() for _ in range(7)]
    call_command("ingest", "--once")
    out = capsys.readouterr().out
    assert "1 channels, 7 fetched, 7 new, 0 duplicates, 0 errors" in out


def test_crash_hook_exits_after_commit_before_ack(
    fake_adapter: FakeAdapter, crash_exits: list[int]
) -> None:
    channel = make_channel()
    fake_adapter.queues["orders.dlq"] = [letter()]
    with pytest.raises(SystemExit):
        do_ingest_channel(channel.pk)
    assert crash_exits == [137] and fake_adapter.acked == []
    assert DeadLetter.objects.count() == 1
