"""Issue 23, done as an attacker with the database superuser (and, where said, the host): a
format downgrade, a forged re-anchor, a rolled-back checkpoint history, a forged insert and an
event dated backwards. Each passed ``audit verify`` as OK before; each is BROKEN now, with a
message that says what happened."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from audit import triggers
from audit.actions import Actor, record, verify_chain
from audit.chain import GENESIS, canonical_time, chain_hash, compute_hash, leaf_hash
from audit.checkpoints import filename, keygen, read_dir, write_checkpoint
from audit.models import AuditEvent, AuditHead
from audit.sealer import seal

TABLE = "audit_auditevent"


@pytest.fixture(autouse=True)
def _postgresql() -> None:
    """The attacks are written in PostgreSQL's SQL (the production database)."""
    if connection.vendor != "postgresql":
        pytest.skip("the attacks are written for PostgreSQL")


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def write_events(n: int, actor: Actor | None = None) -> None:
    for i in range(n):
        record(
            "test.event",
            actor=actor or Actor(7, "bob", "10.0.0.1"),
            target_type="dlq.replayplan",
            target_id=str(40 + i),
            reason=f"because {i}",
            after={"v": i},
        )


@pytest.fixture
def signing(tmp_path: Path, settings: Any) -> Path:
    keygen(tmp_path / "key.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "key.pem")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(tmp_path / "checkpoints")
    settings.DLO_AUDIT_PUBLIC_KEYS = ""
    return tmp_path / "checkpoints"


def seal_by_hand(pk: int) -> int:
    """What the superuser does to get a row past the sealer: number it after the head, chain
    its hash and move the head (hash and Merkle edge), with the published algorithm."""
    from audit.chain import MerkleFrontier

    head = AuditHead.objects.get(pk=1)
    row = AuditEvent.objects.get(pk=pk)
    leaf = leaf_hash(row.index_json, row.detail_json)
    digest = chain_hash(head.hash, leaf)
    frontier = MerkleFrontier.loads(head.frontier)
    frontier.append(leaf)
    raw(
        f"UPDATE {TABLE} SET seq = %s, prev_hash = %s, hash = %s WHERE id = %s",
        [head.seq + 1, head.hash, digest, pk],
    )
    AuditHead.objects.filter(pk=1).update(seq=head.seq + 1, hash=digest, frontier=frontier.dumps())
    return head.seq + 1


def forged_texts(created_at: dt.datetime, actor: str = "alice") -> tuple[str, str]:
    """The canonical texts of a discard that ``actor`` never made."""
    index = {
        "action": "dlq.discard", "actor": actor, "channel": "", "created_at":
        canonical_time(created_at), "outcome": "success", "plan": "", "target_id": "9",
        "target_type": "dlq.deadletter",
    }  # fmt: skip
    detail = {
        "actor_id": 3, "after": None, "before": None, "changes": None, "reason": "cleanup",
        "source_ip": None, "target_repr": "entry 9",
    }  # fmt: skip
    dumps: dict[str, Any] = {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False}
    return json.dumps(index, **dumps), json.dumps(detail, **dumps)


# The same attacks ran on c7bd0b4, before the ``mac`` column existed (and passed there): the
# forger writes the columns the table has, and a MAC only where there is a key to make one.
HAS_MAC = importlib.util.find_spec("audit.mac") is not None
MAC_COLUMN = ", mac" if HAS_MAC else ""


def valid_mac(index_json: str, detail_json: str) -> str:
    """A MAC made with the application's key: what only an attacker with the host has."""
    if not HAS_MAC:
        return ""
    from audit.mac import event_mac

    return event_mac(index_json, detail_json)


def forged_row(*, created_at: dt.datetime, mac: str, actor: str = "alice") -> int:
    """An unsealed event inserted with SQL: claiming another actor, texts canonical."""
    index_json, detail_json = forged_texts(created_at, actor)
    params: list[Any] = [created_at, actor, index_json, detail_json] + ([mac] if HAS_MAC else [])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (created_at, actor_id, actor_username, action, target_type,"
            " target_id, target_repr, channel_slug, reason, outcome, plan_id, prev_hash,"
            f" hash_version, index_json, detail_json{MAC_COLUMN}) VALUES (%s, 3, %s,"
            " 'dlq.discard', 'dlq.deadletter', '9', 'entry 9', '', 'cleanup', 'success', '', '',"
            f" 2, %s, %s{', %s' if HAS_MAC else ''}) RETURNING id",
            params,
        )
        return int(cursor.fetchone()[0])


# -- 1. the format downgrade -----------------------------------------------------------------


@pytest.mark.django_db
def test_format_downgrade_is_broken(signing: Path) -> None:
    """Issue 23 #1: change reason, actor and plan of a format-2 event and call it format 1
    (whose columns the old verifier did not compare): the export filters then lie."""
    write_events(6)
    assert write_checkpoint() is not None
    triggers.drop(connection)
    raw(
        f"UPDATE {TABLE} SET reason = 'nothing', actor_username = 'mallory', plan_id = '',"
        " hash_version = 1 WHERE seq = 4"
    )
    result = verify_chain(checkpoint_dir=signing)
    assert not result.ok and result.first_bad_seq == 4, result.summary()
    assert "stored as format 1" in result.problem and "downgrade" in result.problem


@pytest.mark.django_db
def test_format_downgrade_with_texts_cleared_is_broken() -> None:
    """The other half: clear the texts too, so the row looks format 1 all through."""
    write_events(4)
    triggers.drop(connection)
    raw(f"UPDATE {TABLE} SET index_json = '', detail_json = '', hash_version = 1 WHERE seq = 2")
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == 2
    assert "never re-anchored" in result.problem


# -- 2. the forged re-anchor -----------------------------------------------------------------


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _upgraded_log() -> str:
    """A format-1 log of three events, upgraded by the migrations (re-anchor #4, MAC anchor #5)
    and extended by one event (#6); returns the head hash of the format-1 events."""
    before = [("audit", "0003_outcome_seq_index")]
    _migrate(before)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    old = executor.loader.project_state(before).apps
    event_model, head_model = (
        old.get_model("audit", "AuditEvent"),
        old.get_model("audit", "AuditHead"),
    )
    prev, now = GENESIS, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for seq in (1, 2, 3):
        fields = {
            "seq": seq, "created_at": now, "actor_id": None, "actor_username": "old",
            "source_ip": None, "action": "test.v1", "target_type": "", "target_id": "",
            "target_repr": "", "channel_slug": "", "reason": f"r{seq}", "before": None,
            "after": {"n": seq}, "changes": None, "outcome": "success", "prev_hash": prev,
        }  # fmt: skip
        digest = compute_hash({**fields, "created_at": canonical_time(now)})
        event_model.objects.create(**fields, hash=digest)
        prev = digest
    head_model.objects.update_or_create(pk=1, defaults={"seq": 3, "hash": prev})
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    seal()
    record("test.after", actor=Actor.system())
    return prev


@pytest.mark.django_db(transaction=True)
def test_forged_reanchor_excuses_nothing() -> None:
    """Issue 23 #2: edit format-1 event #2, then add a re-anchor row (lowest id, sealed at the
    tail by hand) that lists #2 among the events that failed at the re-anchor."""
    _upgraded_log()
    assert verify_chain().ok
    triggers.drop(connection)
    raw(f"UPDATE {TABLE} SET reason = 'rewritten' WHERE seq = 2")
    genuine = AuditEvent.objects.get(action="audit.reanchor")
    facts = json.loads(genuine.detail_json)
    facts["after"]["legacy_failures"] = [2]
    detail = json.dumps(facts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    raw(
        f"INSERT INTO {TABLE} (id, created_at, actor_id, actor_username, source_ip, action,"
        " target_type, target_id, target_repr, channel_slug, reason, before, after, changes,"
        f" outcome, plan_id, prev_hash, hash_version, index_json, detail_json{MAC_COLUMN})"
        " SELECT -1, created_at, actor_id, actor_username, source_ip, action, target_type,"
        " target_id, target_repr, channel_slug, reason, before, %s::jsonb, changes, outcome,"
        f" plan_id, '', 2, index_json, %s{', mac' if HAS_MAC else ''} FROM {TABLE}"
        " WHERE id = %s",
        [json.dumps(facts["after"]), detail, genuine.pk],
    )
    forged_seq = seal_by_hand(-1)
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == forged_seq, result.summary()
    assert "a second audit.reanchor event (the log's is #4)" in result.problem
    assert "forged" in result.problem


@pytest.mark.django_db
def test_reanchor_whose_commitments_do_not_match_is_broken() -> None:
    """The only re-anchor, but forged on a log that never had format-1 events: it claims
    three format-1 events and excuses #2, which the attacker turned into "format 1"."""
    write_events(5)
    triggers.drop(connection)
    raw(f"UPDATE {TABLE} SET index_json = '', detail_json = '', hash_version = 1 WHERE seq = 2")
    from audit.actions import _event_fields

    fields = _event_fields(
        now=dt.datetime.now(dt.UTC), actor=Actor(None, "migration", None),
        action="audit.reanchor", target_type="audit.chain", target_id="",
        target_repr="re-anchored 3 format-1 events", channel_slug="", reason="", before=None,
        after={"legacy_events": 3, "legacy_head_seq": 3, "legacy_head_hash": "0" * 64,
               "legacy_root": "", "legacy_failures": [2], "legacy_failure_count": 1},
        changes=None, outcome="success",
    )  # fmt: skip
    fields.pop("mac", None)
    forged = AuditEvent.objects.create(**fields)
    seq = seal_by_hand(forged.pk)
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == seq, result.summary()
    assert "is not where the re-anchor put it" in result.problem


# -- 3. the rolled-back checkpoint history ---------------------------------------------------


@pytest.mark.django_db
def test_every_checkpoint_deleted_and_counter_reset_is_broken(signing: Path) -> None:
    """Issue 23 #3: delete every checkpoint file and set the head's counter to 0."""
    write_events(3)
    assert write_checkpoint() is not None
    write_events(2)
    assert write_checkpoint() is not None
    for path in signing.glob("checkpoint*"):  # the files and the day segments
        path.unlink()
    AuditHead.objects.filter(pk=1).update(checkpoint_number=0, checkpoint_tree_size=0)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)  # the log is an hour old
    with mock.patch("django.utils.timezone.now", return_value=later):
        result = verify_chain(checkpoint_dir=signing)
    assert not result.ok, result.summary()
    assert "no signed checkpoint, although checkpoints are configured" in result.problem
    # A log younger than its first checkpoint interval is not accused.
    assert verify_chain(checkpoint_dir=signing).ok


@pytest.mark.django_db
def test_newest_checkpoints_deleted_below_the_logs_record_is_broken(signing: Path) -> None:
    """Delete the newest checkpoint file and set the counter back: the log itself recorded
    checkpoint #2 (the periodic job's ``audit.checkpoint`` event)."""
    from audit.tasks import write_audit_checkpoint_task

    write_events(3)
    assert write_audit_checkpoint_task() == 1
    write_events(2)
    assert write_audit_checkpoint_task() == 2
    assert write_audit_checkpoint_task() == 0  # its own record calls for no new checkpoint
    write_events(1)
    assert [cp.number for cp in read_dir(signing)] == [1, 2]
    assert verify_chain(checkpoint_dir=signing).ok
    (signing / filename(2)).unlink()
    for segment in signing.glob("checkpoints-*.jsonl"):  # and its line in the day segment
        kept = [x for x in segment.read_text().splitlines() if '"number":2,' not in x]
        segment.write_text("".join(f"{x}\n" for x in kept))
    assert [cp.number for cp in read_dir(signing)] == [1]
    AuditHead.objects.filter(pk=1).update(checkpoint_number=1)
    result = verify_chain(checkpoint_dir=signing)
    assert not result.ok, result.summary()
    assert "the audit log records signed checkpoint #2" in result.problem
    assert "ends at #1: checkpoint #2 was deleted from the sink" in result.problem


# -- 6. forged inserts -----------------------------------------------------------------------


@pytest.mark.django_db
def test_forged_insert_is_refused_by_the_sealer_and_alarmed() -> None:
    """Issue 23 #6: an unsealed event inserted with SQL, claiming another actor and dated a
    day before its neighbour: the sealer refuses it, records the alarm, the page says so."""
    from alerts.metrics import render_metrics
    from audit.status import log_status

    write_events(2)
    neighbour = AuditEvent.objects.get(seq=2).created_at
    forged = forged_row(created_at=neighbour - dt.timedelta(days=1), mac="ab" * 48)
    write_events(1)  # seals what is pending: the forged row is refused, not numbered
    assert AuditEvent.objects.get(pk=forged).seq is None
    alarm = AuditEvent.objects.get(action="audit.event_refused")
    assert alarm.seq is not None and alarm.target_id == str(forged)
    assert "no valid MAC" in alarm.reason
    assert verify_chain().ok  # the chain holds only what the application wrote
    status = log_status()
    assert any("refused" in p for p in status.problems)
    assert b"dlo_audit_refused_events 1.0" in render_metrics()
    write_events(1)  # refused once: no second alarm for the same row
    assert AuditEvent.objects.filter(action="audit.event_refused").count() == 1


@pytest.mark.django_db
def test_forged_insert_sealed_by_hand_is_broken() -> None:
    """The superuser gets the forged row into the chain himself: no valid MAC."""
    write_events(2)
    triggers.drop(connection)
    forged = forged_row(created_at=dt.datetime.now(dt.UTC), mac="")
    seq = seal_by_hand(forged)
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == seq, result.summary()
    assert "no valid MAC: it was not written by the application" in result.problem


@pytest.mark.django_db
def test_insert_trigger_refuses_rows_without_a_mac_or_already_sealed() -> None:
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError, match="MAC"), transaction.atomic():
        forged_row(created_at=dt.datetime.now(dt.UTC), mac="")
    with pytest.raises(DatabaseError, match="unsealed"), transaction.atomic():
        raw(
            f"INSERT INTO {TABLE} (seq, created_at, actor_username, action, target_type,"
            " target_id, target_repr, channel_slug, reason, outcome, plan_id, prev_hash,"
            " hash_version, index_json, detail_json, mac, hash) VALUES (99, now(), '', 'x', '',"
            " '', '', '', '', 'success', '', '', 2, '{}', '{}', %s, %s)",
            ["cd" * 48, "ef" * 32],
        )


# -- created_at in seq order -----------------------------------------------------------------


@pytest.mark.django_db
def test_event_dated_backwards_is_broken_even_with_a_valid_mac() -> None:
    """With the MAC key (the host), a forged event dated a day before its neighbour: the
    sealer refuses it, and sealed by hand it is BROKEN by its date."""
    write_events(2)
    neighbour = AuditEvent.objects.get(seq=2).created_at
    day_before = neighbour - dt.timedelta(days=1)
    pk = forged_row(created_at=day_before, mac=valid_mac(*forged_texts(day_before)))
    seal()
    refused = AuditEvent.objects.get(action="audit.event_refused")
    assert "dated 86400 s before an event already sealed" in refused.reason
    triggers.drop(connection)
    seq = seal_by_hand(pk)
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == seq, result.summary()
    assert f"event #{seq} is dated 86400 s before an earlier event (tolerance 300 s)" in (
        result.problem
    )


@pytest.mark.django_db
def test_a_copy_of_a_genuine_event_is_broken() -> None:
    """Replaying a genuine event (its MAC copied): the unique index refuses it; with the index
    dropped and the copy sealed by hand, ``audit verify`` names the copy."""
    write_events(3)
    triggers.drop(connection)
    raw("DROP INDEX audit_mac_unique")
    raw(
        f"INSERT INTO {TABLE} (created_at, actor_id, actor_username, source_ip, action,"
        " target_type, target_id, target_repr, channel_slug, reason, before, after, changes,"
        " outcome, plan_id, prev_hash, hash_version, index_json, detail_json, mac)"
        " SELECT created_at, actor_id, actor_username, source_ip, action, target_type,"
        " target_id, target_repr, channel_slug, reason, before, after, changes, outcome,"
        f" plan_id, '', 2, index_json, detail_json, mac FROM {TABLE} WHERE seq = 3"
    )
    copy = AuditEvent.objects.get(seq__isnull=True).pk
    seq = seal_by_hand(copy)
    result = verify_chain()
    assert not result.ok and result.first_bad_seq == seq, result.summary()
    assert "carries the same MAC as an earlier event" in result.problem


# -- 5. the window: a checkpoint interval --------------------------------------------------


def test_checkpoints_are_due_every_ten_seconds_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.conf import settings

    from config.periodic import PERIODIC_JOBS, _seconds

    assert PERIODIC_JOBS["audit-checkpoint"] == ("audit.tasks.write_audit_checkpoint_task", 10.0)
    assert settings.DLO_AUDIT_CHECKPOINT_INTERVAL_S == 10
    monkeypatch.setenv("DLO_AUDIT_CHECKPOINT_INTERVAL_S", "3")
    assert _seconds("DLO_AUDIT_CHECKPOINT_INTERVAL_S", 10.0) == 3.0
