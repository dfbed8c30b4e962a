"""The audit chain: written in the caller's transaction, append-only, and tamper-evident."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from audit import triggers
from audit.actions import Actor, EventSpec, record, record_many, verify_chain
from audit.chain import GENESIS, chain_hash, leaf_hash
from audit.mac import event_mac
from audit.models import AuditEvent, AuditHead, Outcome

pytestmark = pytest.mark.django_db

TABLE = "audit_auditevent"


def write_events(n: int) -> list[AuditEvent]:
    return [
        record(
            "test.event",
            actor=Actor(7, "tess", "10.0.0.1"),
            target_type="thing",
            target_id=str(i),
            target_repr=f"thing {i}",
            reason=f"because {i}",
            before={"v": i},
            after={"v": i + 1},
        )
        for i in range(1, n + 1)
    ]


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def test_events_chain_from_genesis_and_verify() -> None:
    events = write_events(3)
    assert [e.seq for e in events] == [1, 2, 3]
    assert events[0].prev_hash == GENESIS
    assert events[1].prev_hash == events[0].hash
    assert events[2].changes == {"v": [3, 4]}
    head = AuditHead.objects.get(pk=1)
    assert (head.seq, head.hash) == (3, events[2].hash)
    result = verify_chain()
    assert result.ok and result.events == 3 and result.head_seq == 3


def test_hash_covers_exactly_the_stored_texts() -> None:
    event = write_events(1)[0]
    assert event.hash_version == 2
    assert event.hash == chain_hash(GENESIS, leaf_hash(event.index_json, event.detail_json))
    index, detail = json.loads(event.index_json), json.loads(event.detail_json)
    assert index["actor"] == "tess" and index["target_id"] == "1"
    assert detail["before"] == {"v": 1} and detail["reason"] == "because 1"
    for text in [event.index_json, event.detail_json]:
        tampered = text.replace("1", "2", 1)
        assert leaf_hash(tampered, event.detail_json) != leaf_hash(event.index_json, text) or (
            tampered == text
        )
    assert chain_hash(GENESIS, leaf_hash(event.index_json + " ", event.detail_json)) != event.hash


def test_event_rolls_back_with_the_change() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        record("test.event", actor=Actor.system())
        raise RuntimeError("the change failed")
    assert AuditEvent.objects.count() == 0
    assert AuditHead.objects.get(pk=1).seq == 0


def test_nul_characters_are_stored_safely() -> None:
    event = record("test.event", actor=Actor.system(), reason="a\x00b", after={"k": "v\x00"})
    event.refresh_from_db()
    assert event.reason == "a\ufffdb"
    assert verify_chain().ok


def test_update_is_refused_by_the_database() -> None:
    write_events(1)
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(seq=1).update(reason="edited")


def test_delete_is_refused_by_the_database() -> None:
    write_events(1)
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(seq=1).delete()


def test_truncate_is_refused_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no TRUNCATE; DELETE is refused instead")
    write_events(1)
    with pytest.raises(DatabaseError), transaction.atomic():
        raw(f"TRUNCATE {TABLE}")


# Tampering: the triggers are dropped inside the test (its transaction restores them).


@pytest.fixture
def tamperable() -> list[AuditEvent]:
    events = write_events(10)
    triggers.drop(connection)
    return events


def test_tamper_modified_field_is_named(tamperable: list[AuditEvent]) -> None:
    raw(f"UPDATE {TABLE} SET reason = %s WHERE seq = 4", ["nothing to see"])
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == 4
    assert "modified" in result.problem


def test_tamper_deleted_row_is_named(tamperable: list[AuditEvent]) -> None:
    raw(f"DELETE FROM {TABLE} WHERE seq = 6")
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == 6
    assert "#6 is missing" in result.problem


def test_tamper_inserted_row_is_named(tamperable: list[AuditEvent]) -> None:
    # Make room after #5 by shifting the later events up, then insert a forged #6 whose hash is
    # internally consistent: the event after it (#7, formerly #6) no longer links to it.
    raw(f"UPDATE {TABLE} SET seq = seq + 1000 WHERE seq > 5")
    raw(f"UPDATE {TABLE} SET seq = seq - 999 WHERE seq > 1000")
    forged = AuditEvent.objects.get(seq=1)
    forged.pk = None
    forged.seq, forged.prev_hash = 6, tamperable[4].hash
    forged.hash = chain_hash(forged.prev_hash, leaf_hash(forged.index_json, forged.detail_json))
    forged.mac = event_mac(forged.index_json, forged.detail_json)  # even with the MAC key
    forged.save(force_insert=True)
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == 7
    assert "prev_hash" in result.problem


def test_tamper_reordered_rows_are_named(tamperable: list[AuditEvent]) -> None:
    raw(f"UPDATE {TABLE} SET seq = -1 WHERE seq = 3")
    raw(f"UPDATE {TABLE} SET seq = 3 WHERE seq = 8")
    raw(f"UPDATE {TABLE} SET seq = 8 WHERE seq = -1")
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == 3


def test_tamper_truncated_tail_is_named(tamperable: list[AuditEvent]) -> None:
    raw(f"DELETE FROM {TABLE} WHERE seq >= 8")
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == 8
    assert "truncated" in result.problem


def test_verify_command_prints_head_or_fails(capsys: pytest.CaptureFixture[str]) -> None:
    events = write_events(2)
    call_command("audit", "verify")
    out = capsys.readouterr().out
    assert "OK: 2 events verified" in out and events[1].hash in out
    triggers.drop(connection)
    raw(f"UPDATE {TABLE} SET actor_username = 'eve' WHERE seq = 2")
    with pytest.raises(CommandError, match="BROKEN at seq 2"):
        call_command("audit", "verify")


def test_verify_file_checks_an_exported_range(tmp_path: Any) -> None:
    events = write_events(4)
    from audit.export import export_rows

    rows = list(export_rows(AuditEvent.objects.filter(seq__gte=2)))  # starts mid-chain
    assert [r["seq"] for r in rows] == [e.seq for e in events[1:]]
    lines = [json.dumps(row) for row in rows]
    path = tmp_path / "export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    call_command("audit", "verify", "--file", str(path))
    tampered = json.loads(lines[1])
    tampered["detail_json"] = tampered["detail_json"].replace("because", "rewritten")
    tampered["reason"] = tampered["reason"].replace("because", "rewritten")
    lines[1] = json.dumps(tampered)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommandError, match="BROKEN at seq 3"):
        call_command("audit", "verify", "--file", str(path))


def test_record_and_record_many_hash_the_same_event_identically() -> None:
    """Both writers build events through one helper: the same event at the same place in the
    chain gets the same stored fields and hash, whichever wrote it."""
    write_events(1)
    now = timezone.now()
    actor = Actor(7, "tess\x00" + "x" * 200, "10.0.0.1")
    spec = EventSpec(
        action="test.bulk",
        target_type="thing",
        target_id=42,
        target_repr="é" * 400,
        channel_slug="orders",
        reason="nul \x00 here",
        after={"when": now, "v": "\x00"},
        outcome=Outcome.FAILED,
    )
    # Everything but the MAC, whose nonce differs per event by design.
    fields = [f.name for f in AuditEvent._meta.concrete_fields if f.name not in {"id", "mac"}]
    with mock.patch("audit.actions.timezone.now", return_value=now):
        with transaction.atomic():
            single = record(
                spec.action,
                actor=actor,
                target_type=spec.target_type,
                target_id=spec.target_id,
                target_repr=spec.target_repr,
                channel_slug=spec.channel_slug,
                reason=spec.reason,
                after=spec.after,
                outcome=spec.outcome,
            )
            by_record = AuditEvent.objects.filter(pk=single.pk).values(*fields).get()
            transaction.set_rollback(True)
        assert not AuditEvent.objects.filter(seq=2).exists()
        assert record_many([spec], actor=actor) == 1
    by_many = AuditEvent.objects.filter(seq=2).values(*fields).get()
    assert by_many == by_record
    assert single.hash == by_many["hash"]
    assert single.hash == chain_hash(
        single.prev_hash, leaf_hash(single.index_json, single.detail_json)
    )
    assert verify_chain().ok
