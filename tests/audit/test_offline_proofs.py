"""What a third party can check without our code: the standard-library verifier's Ed25519
(against ``cryptography``), checkpoints, exports from #1 against signed roots, and proof
exports that show a filtered export is complete up to a signed checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command

from audit import verify_export
from audit.actions import Actor, EventSpec, record, record_many
from audit.chain import MerkleFrontier, root_from_range, subtree_hashes_before
from audit.checkpoints import keygen, raw_public, write_checkpoint

pytestmark = pytest.mark.django_db

SCRIPT = Path(verify_export.__file__)


def test_stdlib_ed25519_agrees_with_cryptography() -> None:
    for size in (0, 1, 31, 64, 1000):
        key = Ed25519PrivateKey.generate()
        public = raw_public(key.public_key())
        message = os.urandom(size)
        signature = key.sign(message)
        assert verify_export.ed25519_verify(public, message, signature)
        assert not verify_export.ed25519_verify(public, message + b"x", signature)
        bad = bytearray(signature)
        bad[size % 64] ^= 1
        assert not verify_export.ed25519_verify(public, message, bytes(bad))
        other = raw_public(Ed25519PrivateKey.generate().public_key())
        assert not verify_export.ed25519_verify(other, message, signature)


def test_rfc8032_test_vector_1() -> None:
    public = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    signature = bytes.fromhex(
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )
    assert verify_export.ed25519_verify(public, b"", signature)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 17])
def test_range_proofs_rebuild_the_root(size: int) -> None:
    leaves = [bytes([i]) * 32 for i in range(size)]
    tree = MerkleFrontier()
    for leaf in leaves:
        tree.append(leaf)
    for first in range(size + 1):
        proof = subtree_hashes_before(leaves[:first], first, size)
        root = root_from_range([bytes.fromhex(h) for h in proof], first, leaves[first:], size)
        assert root.hex() == tree.root()
        stdlib = verify_export.root_from_range(
            [bytes.fromhex(h) for h in proof], first, leaves[first:], size
        )
        assert stdlib.hex() == tree.root()


@pytest.fixture
def anchored(tmp_path: Path, settings: Any) -> Path:
    keygen(tmp_path / "key.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "key.pem")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(tmp_path / "checkpoints")
    for i in range(6):
        record(
            "test.event",
            actor=Actor(i % 2, f"user{i % 2}"),
            channel_slug="orders" if i % 3 else "billing",
            target_type="thing",
            target_id=i,
            after={"v": i, "f": 1.0e16},
        )
        if i == 2:
            write_checkpoint()
    record_many(
        [EventSpec("dlq.replay.request", "dlq.deadletter", n, after={"plan": 42}) for n in (7, 8)],
        actor=Actor(5, "olive"),
    )
    write_checkpoint()
    return tmp_path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def export(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    call_command("audit", "export", *args)
    return capsys.readouterr().out


def test_full_export_verifies_against_signed_checkpoints(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = anchored / "all.jsonl"
    path.write_text(export(capsys))
    key = f"{anchored / 'key.pem'}.pub"
    done = run(str(path), "--checkpoints", str(anchored / "checkpoints"), "--public-key", key)
    assert done.returncode == 0, done.stdout
    assert "2 signed checkpoints matched" in done.stdout
    # A checkpoint forged in the directory stops the offline verifier by number: in the day
    # segment the verifier reads, and in the file of a directory from before segments.
    [segment] = (anchored / "checkpoints").glob("checkpoints-*.jsonl")
    lines = segment.read_text().splitlines()
    forged = json.loads(lines[0])
    forged["checkpoint"]["root_hash"] = "0" * 64
    segment.write_text("\n".join([json.dumps(forged), *lines[1:]]) + "\n")
    done = run(str(path), "--checkpoints", str(anchored / "checkpoints"), "--public-key", key)
    assert done.returncode == 1
    assert done.stdout.strip() == "BROKEN at checkpoint #1: signature does not verify"
    segment.unlink()  # the files alone (a directory from before day segments)
    cp = anchored / "checkpoints" / "checkpoint-000000000001.json"
    data = json.loads(cp.read_text())
    data["checkpoint"]["root_hash"] = "0" * 64
    cp.write_text(json.dumps(data))
    done = run(str(path), "--checkpoints", str(anchored / "checkpoints"), "--public-key", key)
    assert done.returncode == 1
    assert done.stdout.strip() == "BROKEN at checkpoint #1: signature does not verify"


def test_proof_export_proves_a_filtered_export_complete(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = export(capsys, "--proof", "--actor", "user1")
    lines = text.splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "dlo-audit-proof/1" and header["checkpoint"]["tree_size"] == 8
    full = [json.loads(x) for x in lines[1:] if "withheld" not in json.loads(x)]
    assert [e["seq"] for e in full] == [2, 4, 6]
    key = f"{anchored / 'key.pem'}.pub"
    path = anchored / "user1.jsonl"

    def check(body: list[str]) -> str:
        path.write_text("\n".join(body) + "\n")
        done = run(str(path), "--public-key", key, "--checkpoints", str(anchored / "checkpoints"))
        return done.stdout.strip()

    assert check(lines).startswith('OK: 3 events match {"actor":"user1"} among #1–#8')
    # Leaving out a matching event.
    assert check([ln for ln in lines if '"seq":4,' not in ln]).startswith("BROKEN at #4")
    # Withholding a matching event (its index shows it matches).
    four = json.loads(lines[4])
    detail_sha256 = verify_export.sha256(four["detail_json"].encode()).hex()
    withheld = {"seq": 4, "withheld": True, "index_json": four["index_json"]}
    withheld["detail_sha256"] = detail_sha256
    forged = [*lines[:4], json.dumps(withheld), *lines[5:]]
    assert check(forged) == "BROKEN at #4: matches the filters but was withheld"
    # Claiming a non-member's index is someone else's.
    three = json.loads(lines[3])
    three["index_json"] = three["index_json"].replace("user0", "user2")
    assert check([*lines[:3], json.dumps(three), *lines[4:]]).startswith("BROKEN at checkpoint #2")


def test_proof_export_by_plan_from_a_later_seq(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = export(capsys, "--proof", "--plan", "42", "--from-seq", "5")
    path = anchored / "plan.jsonl"
    path.write_text(text)
    done = run(str(path), "--public-key", f"{anchored / 'key.pem'}.pub")
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith('OK: 2 events match {"plan":"42"} among #5–#8')
