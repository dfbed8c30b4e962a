"""A proof export binds what the reader asked for (issue 23, item 7): ``verify_export.py``
with the expected filters, range start and minimum checkpoint (or a witness's state file)
refuses a proof that is genuine but answers another question — an added filter that withholds
the last match, a dropped prefix, an older checkpoint swapped in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.checkpoints import read_dir
from audit.export import proof_lines
from audit.models import AuditEvent
from tests.audit.test_offline_proofs import anchored, export, run  # noqa: F401

pytestmark = pytest.mark.django_db


def check(anchored: Path, text: str, *expect: str) -> tuple[int, str]:  # noqa: F811
    path = anchored / "proof.jsonl"
    path.write_text(text)
    done = run(str(path), "--public-key", f"{anchored / 'key.pem'}.pub", *expect)
    return done.returncode, done.stdout.strip()


def test_an_honest_proof_matches_what_was_asked(
    anchored: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = export(capsys, "--proof", "--actor", "user1")
    code, out = check(anchored, text, "--expect", "actor=user1", "--min-checkpoint", "2")
    assert code == 0 and out.startswith('OK: 3 events match {"actor":"user1"}'), out


def test_a_withheld_last_match_behind_an_added_filter_is_caught(
    anchored: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The exporter adds ``until`` = the last match's time: #6 is withheld, and the proof is
    genuine for the filters it states."""
    last = AuditEvent.objects.filter(actor_username="user1").order_by("seq").last()
    assert last is not None and last.seq == 6
    until = last.created_at.isoformat()
    text = export(capsys, "--proof", "--actor", "user1", "--until", until)
    code, out = check(anchored, text)
    assert code == 0 and out.startswith("OK: 2 events match"), out  # what it states is true
    code, out = check(anchored, text, "--expect", "actor=user1")
    assert code == 1 and out.startswith("MISMATCH: the proof is for the filters"), out
    assert '"until"' in out


def test_a_dropped_prefix_is_caught(
    anchored: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = export(capsys, "--proof", "--actor", "user1", "--from-seq", "3")
    code, out = check(anchored, text)
    assert code == 0 and "among #3–#8" in out, out
    code, out = check(anchored, text, "--expect", "actor=user1")
    assert code == 1 and out.startswith("MISMATCH: the proof starts at #3, not at"), out
    # A range the reader did ask for passes.
    code, out = check(anchored, text, "--expect", "actor=user1", "--from-seq", "3")
    assert code == 0, out


def test_an_older_checkpoint_swapped_in_is_caught(
    anchored: Path,  # noqa: F811
) -> None:
    """The proof ends at checkpoint #1 (3 events): every later match is silently cut."""
    older, newest = read_dir(anchored / "checkpoints")
    text = "".join(proof_lines({"actor": "user1"}, older, 1))
    code, out = check(anchored, text, "--expect", "actor=user1")
    assert code == 0, out  # the filters and range are right; only the checkpoint is old
    code, out = check(anchored, text, "--expect", "actor=user1", "--min-checkpoint", "2")
    assert code == 1 and "older than the expected #2" in out, out
    state = anchored / "witness.jsonl"
    head = {"checkpoint": newest.body, "signature": newest.signature}
    state.write_text(json.dumps(head) + "\n")
    code, out = check(anchored, text, "--witness", str(state))
    assert code == 1 and "older than the witnessed #2" in out, out
    honest = "".join(proof_lines({"actor": "user1"}, newest, 1))
    code, out = check(anchored, honest, "--witness", str(state), "--expect", "actor=user1")
    assert code == 0, out


def test_expectations_need_a_proof_export(
    anchored: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = export(capsys, "--actor", "user1")
    code, out = check(anchored, text, "--expect", "actor=user1")
    assert code == 1 and "need a proof export" in out
