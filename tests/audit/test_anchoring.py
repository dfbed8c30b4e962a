"""Signed checkpoints anchor the log outside the database: every tamper case, done the way an
attacker with the database's superuser would (triggers dropped, hashes re-computed with the
published algorithm), is named by ``audit verify`` — by seq, or by checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from audit import triggers
from audit.actions import Actor, record, verify_chain
from audit.chain import GENESIS, MerkleFrontier, canonical_json, chain_hash, leaf_hash
from audit.checkpoints import (
    CheckpointError,
    filename,
    key_id,
    keygen,
    read_dir,
    write_checkpoint,
)
from audit.mac import event_mac
from audit.models import AuditEvent, AuditHead

pytestmark = pytest.mark.django_db

TABLE = "audit_auditevent"


def raw(sql: str, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])


def write_events(n: int) -> None:
    for i in range(n):
        record(
            "test.event",
            actor=Actor(7, "tess", "10.0.0.1"),
            target_type="thing",
            target_id=str(i),
            reason=f"because {i}",
            before={"v": i},
            after={"v": i + 1, "big": 1.0e16},
        )


@pytest.fixture
def signing(tmp_path: Path, settings: Any) -> Path:
    keygen(tmp_path / "key.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "key.pem")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(tmp_path / "checkpoints")
    settings.DLO_AUDIT_PUBLIC_KEYS = ""
    return tmp_path / "checkpoints"


@pytest.fixture
def anchored(signing: Path) -> Path:
    """Events #1–#5, checkpoint #1, events #6–#10, checkpoint #2; then the triggers dropped
    (the attacker is the database's superuser; the test's transaction restores them)."""
    write_events(5)
    assert write_checkpoint() is not None
    write_events(5)
    assert write_checkpoint() is not None
    triggers.drop(connection)
    return signing


def verify(directory: Path | None) -> Any:
    return verify_chain(checkpoint_dir=directory)


def recompute_from(seq: int) -> None:
    """What an attacker with the host (the MAC key too) does after editing history: re-chain
    every later hash with the published algorithm, re-MAC the events, and move the head (hash
    and Merkle edge) to match."""
    events = list(AuditEvent.objects.filter(seq__isnull=False).order_by("seq"))
    prev, frontier = GENESIS, MerkleFrontier()
    for event in events:
        leaf = leaf_hash(event.index_json, event.detail_json)
        if event.seq >= seq:
            new = chain_hash(prev, leaf)
            mac = event_mac(event.index_json, event.detail_json)
            raw(
                f"UPDATE {TABLE} SET prev_hash = %s, hash = %s, mac = %s WHERE id = %s",
                [prev, new, mac, event.pk],
            )
            event.hash = new
        prev = event.hash or ""
        frontier.append(leaf)
    AuditHead.objects.filter(pk=1).update(seq=events[-1].seq, hash=prev, frontier=frontier.dumps())


# -- the happy path --------------------------------------------------------------------------


def test_checkpoints_are_signed_chained_and_match(anchored: Path) -> None:
    cps = read_dir(anchored)
    assert [(c.number, c.tree_size) for c in cps] == [(1, 5), (2, 10)]
    assert cps[0].body["prev_checkpoint"] == GENESIS
    assert cps[1].body["prev_checkpoint"] == cps[0].digest()
    result = verify(anchored)
    assert result.ok and result.checkpoints_matched == 2, result.summary()


def test_verify_command_uses_the_configured_directory(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("audit", "verify")
    assert "matches signed checkpoint #2" in capsys.readouterr().out


# -- tampering with events -------------------------------------------------------------------


def test_modified_display_column_is_named(anchored: Path) -> None:
    raw(f"UPDATE {TABLE} SET reason = 'nothing to see' WHERE seq = 4")
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 4
    assert "searchable columns differ" in result.problem


def test_modified_filter_column_is_named(anchored: Path) -> None:
    """Hiding an event from a filtered export by changing its actor column."""
    raw(f"UPDATE {TABLE} SET actor_username = 'someone-else' WHERE seq = 3")
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 3


def test_modified_hashed_text_is_named(anchored: Path) -> None:
    raw(
        f"UPDATE {TABLE} SET detail_json = replace(detail_json, 'because 3', 'because x') "
        "WHERE seq = 4"
    )
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 4
    assert "stored hash does not match the event's contents" in result.problem


def test_deleted_event_is_named(anchored: Path) -> None:
    raw(f"DELETE FROM {TABLE} WHERE seq = 6")
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 6
    assert "#6 is missing" in result.problem


def test_reordered_events_are_named(anchored: Path) -> None:
    raw(f"UPDATE {TABLE} SET seq = -1 WHERE seq = 3")
    raw(f"UPDATE {TABLE} SET seq = 3 WHERE seq = 8")
    raw(f"UPDATE {TABLE} SET seq = 8 WHERE seq = -1")
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 3


def test_truncated_tail_with_head_left_is_named(anchored: Path) -> None:
    raw(f"DELETE FROM {TABLE} WHERE seq >= 8")
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 8


def test_truncated_tail_with_head_moved_is_named_by_the_checkpoint(anchored: Path) -> None:
    raw(f"DELETE FROM {TABLE} WHERE seq >= 8")
    recompute_from(10**9)  # nothing re-chained: only the head (and its Merkle edge) moved back
    assert verify(None).ok  # inside the database alone, this is invisible
    result = verify(anchored)
    assert not result.ok and result.first_bad_seq == 8 and result.bad_checkpoint == 2
    assert "events #8–#10 were deleted" in result.problem


def test_deleted_head_row_is_a_clear_message(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    AuditHead.objects.all().delete()
    result = verify(anchored)
    assert not result.ok and "head row (audit_audithead) is missing" in result.problem
    assert "matching signed checkpoint #2" in result.problem
    with pytest.raises(CommandError, match="head row .* is missing"):
        call_command("audit", "verify")  # a clear error, no IntegrityError


def test_rechained_history_is_named_by_the_checkpoint(anchored: Path) -> None:
    """The superuser edits event #7's hashed text and re-computes every hash after it with
    the published algorithm: the chain is perfect, the signed checkpoint #2 is not."""
    raw(
        f"UPDATE {TABLE} SET detail_json = replace(detail_json, 'because 1', 'because x'), "
        "reason = 'because x' WHERE seq = 7"
    )
    recompute_from(7)
    assert verify(None).ok
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 2 and result.first_bad_seq is None
    assert "events #6–#10 were rewritten" in result.problem
    assert "checkpoint #1 still matches" in result.problem
    assert result.summary().startswith("BROKEN at checkpoint #2:")


def test_rechained_history_with_recomputed_copies_is_still_named(anchored: Path) -> None:
    raw(
        f"UPDATE {TABLE} SET actor_username = 'mallory', "
        "index_json = replace(index_json, %s, %s) WHERE seq = 2",
        ['"actor":"tess"', '"actor":"mallory"'],
    )
    recompute_from(2)
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 1
    assert "events #1–#5 were rewritten" in result.problem


# -- tampering with checkpoints --------------------------------------------------------------
# A directory written before day segments existed (files only); with segments, see
# tests/audit/test_checkpoint_segments.py.


def files_only(directory: Path) -> Path:
    for segment in directory.glob("checkpoints-*.jsonl"):
        segment.unlink()
    return directory


def test_forged_checkpoint_is_named(anchored: Path) -> None:
    files_only(anchored)
    path = anchored / filename(1)
    data = json.loads(path.read_text())
    data["checkpoint"]["tree_size"] = 4
    path.write_text(json.dumps(data))
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 1
    assert "signature does not verify" in result.problem


def test_checkpoint_signed_by_an_attackers_key_is_named(anchored: Path) -> None:
    files_only(anchored)
    path = anchored / filename(2)
    data = json.loads(path.read_text())
    mallory = Ed25519PrivateKey.generate()
    data["checkpoint"]["key_id"] = key_id(mallory.public_key())
    signed = canonical_json(data["checkpoint"]).encode()
    import base64

    data["signature"] = base64.b64encode(mallory.sign(signed)).decode()
    path.write_text(json.dumps(data))
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 2
    assert "not a trusted public key" in result.problem


def test_reordered_checkpoints_are_named(anchored: Path) -> None:
    files_only(anchored)
    one, two = anchored / filename(1), anchored / filename(2)
    text_one, text_two = one.read_text(), two.read_text()
    one.write_text(text_two)
    two.write_text(text_one)
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 1
    assert "reordered" in result.problem


def test_deleted_checkpoint_is_named(anchored: Path) -> None:
    files_only(anchored)
    (anchored / filename(1)).unlink()
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 1
    assert "checkpoint #1 is missing" in result.problem


def test_deleted_latest_checkpoint_is_named(anchored: Path) -> None:
    files_only(anchored)
    (anchored / filename(2)).unlink()
    result = verify(anchored)
    assert not result.ok and result.bad_checkpoint == 2
    assert "database records checkpoints up to #2" in result.problem


# -- sinks and keys --------------------------------------------------------------------------


def test_a_sink_that_is_down_keeps_recording_and_says_so(
    signing: Path, settings: Any, tmp_path: Path
) -> None:
    from alerts.metrics import render_metrics
    from audit.status import log_status

    write_events(2)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the sink should be")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(blocker / "checkpoints")
    with pytest.raises(CheckpointError, match="checkpoint sink"):
        write_checkpoint()
    write_events(1)  # recording goes on
    assert AuditEvent.objects.filter(seq=3).exists()
    head = AuditHead.objects.get(pk=1)
    assert "checkpoint sink" in head.checkpoint_error
    status = log_status()
    assert not status.checkpoint_ok
    assert any("Checkpoints are failing" in p for p in status.problems)
    assert b"dlo_audit_checkpoint_ok 0.0" in render_metrics()
    # The sink comes back: the next checkpoint covers everything recorded meanwhile.
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(signing)
    written = write_checkpoint()
    assert written is not None and written.tree_size == 3
    assert AuditHead.objects.get(pk=1).checkpoint_error == ""
    assert b"dlo_audit_checkpoint_ok 1.0" in render_metrics()


def test_a_missing_key_keeps_recording_and_says_so(signing: Path, settings: Any) -> None:
    settings.DLO_AUDIT_SIGNING_KEY = str(signing / "no-such.key")
    write_events(1)
    with pytest.raises(CheckpointError, match="no-such.key"):
        write_checkpoint()
    assert AuditEvent.objects.filter(seq=1).exists()
    assert "no-such.key" in AuditHead.objects.get(pk=1).checkpoint_error


def test_key_rotation_keeps_old_checkpoints_verifiable(
    signing: Path, settings: Any, tmp_path: Path
) -> None:
    old_key = settings.DLO_AUDIT_SIGNING_KEY
    write_events(3)
    write_checkpoint()
    keygen(tmp_path / "new.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "new.pem")
    write_events(2)
    write_checkpoint()
    cps = read_dir(signing)
    assert cps[0].body["key_id"] != cps[1].body["key_id"]
    result = verify(signing)  # only the new key is trusted
    assert not result.ok and result.bad_checkpoint == 1 and "not a trusted" in result.problem
    settings.DLO_AUDIT_PUBLIC_KEYS = f"{old_key}.pub"
    assert verify(signing).ok
    result = verify_chain(
        checkpoint_dir=signing, public_keys=[f"{old_key}.pub", str(tmp_path / "new.pem.pub")]
    )
    assert result.ok and result.checkpoints_matched == 2


def test_keygen_and_checkpoint_commands(
    tmp_path: Path, settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("audit", "keygen", str(tmp_path / "k.pem"))
    out = capsys.readouterr().out
    assert "ed25519 " in out and (tmp_path / "k.pem.pub").exists()
    assert (tmp_path / "k.pem").stat().st_mode & 0o077 == 0
    with pytest.raises(CommandError, match="never overwritten"):
        call_command("audit", "keygen", str(tmp_path / "k.pem"))
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "k.pem")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(tmp_path / "cp")
    write_events(2)
    call_command("audit", "checkpoint")
    assert "Checkpoint #1: 2 events" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "cp")


@pytest.mark.django_db(transaction=True)
def test_a_finished_burst_is_anchored_at_once(signing: Path, settings: Any) -> None:
    """``request_checkpoint()`` (called when a replay or discard plan finishes): sealed and
    signed right after the commit, not at the next minute."""
    import time

    from django.db import transaction

    from audit.sealer import request_checkpoint

    settings.DLO_AUDIT_SEALER = "thread"
    with transaction.atomic():
        write_events(3)
        request_checkpoint()
        assert not signing.exists()  # nothing before the commit
    deadline = time.monotonic() + 30
    while not (signing.exists() and read_dir(signing)):
        assert time.monotonic() < deadline, "no checkpoint within 30 s of the commit"
        time.sleep(0.05)
    assert read_dir(signing)[0].tree_size == 3
    while AuditEvent.objects.filter(seq__isnull=True).exists():  # let the thread go idle
        time.sleep(0.05)
