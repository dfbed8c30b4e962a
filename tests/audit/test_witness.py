"""Consistency proofs and the witness (issue 23): the log's tree heads, served over the API,
checked by ``audit/witness.py`` against every head it saw before — so a holder of the signing
key who rewrites, cuts, rolls back or forks the log is caught, and ``audit verify --witness``
refuses a database that does not extend the witnessed head."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from audit import tree, triggers, witness
from audit.chain import MerkleFrontier, canonical_json, node_hash
from audit.checkpoints import filename, load_private_key, read_dir, write_checkpoint
from audit.models import AuditCosignature, AuditEvent, AuditHead, AuditTreeNode
from dashboard.models import ApiToken
from tests.audit.test_anchoring import raw, recompute_from, write_events
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
TABLE = "audit_auditevent"


# -- a naive RFC 9162 Merkle tree, to check the stored tree and the proofs against -----------


def mth(leaves: list[bytes]) -> bytes:
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return node_hash(mth(leaves[:k]), mth(leaves[k:]))


def naive_proof(m: int, leaves: list[bytes], whole: bool = True) -> list[bytes]:
    """RFC 9162 §2.1.4.1 as written (SUBPROOF)."""
    n = len(leaves)
    if m == n:
        return [] if whole else [mth(leaves)]
    k = 1
    while k * 2 < n:
        k *= 2
    if m <= k:
        return naive_proof(m, leaves[:k], whole) + [mth(leaves[k:])]
    return naive_proof(m - k, leaves[k:], False) + [mth(leaves[:k])]


def fake_leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(b"\x00" + i.to_bytes(4, "big")).digest() for i in range(n)]


@pytest.mark.parametrize("n", [*range(1, 40), 63, 64, 65, 100, 127, 128, 129, 1000])
def test_consistency_proofs_match_a_naive_merkle_tree(n: int) -> None:
    leaves = fake_leaves(n)
    sizes = range(1, n + 1) if n < 130 else random.Random(n).sample(range(1, n + 1), 60)
    for m in sizes:
        ranges = tree.proof_ranges(m, n)
        proof = [mth(leaves[lo:hi]) for lo, hi in ranges]
        assert proof == naive_proof(m, leaves), (m, n)
        for lo, hi in ranges:  # each proof node is a fold of complete subtrees
            parts = [mth(leaves[i << lv : (i + 1) << lv]) for lv, i in tree.subtrees(lo, hi)]
            assert tree.fold(parts) == mth(leaves[lo:hi])
        assert tree.verify_consistency(m, n, mth(leaves[:m]), mth(leaves), proof)
        assert witness.verify_consistency(m, n, mth(leaves[:m]), mth(leaves), proof)
        if m < n:  # another first tree, a tampered proof: refused
            other = mth([*leaves[: m - 1], hashlib.sha256(b"x").digest()])
            assert not tree.verify_consistency(m, n, other, mth(leaves), proof)
            assert not witness.verify_consistency(m, n, other, mth(leaves), proof)
            if proof:
                bad = [*proof[:-1], hashlib.sha256(proof[-1]).digest()]
                assert not witness.verify_consistency(m, n, mth(leaves[:m]), mth(leaves), bad)


@pytest.fixture
def signing(tmp_path: Path, settings: Any) -> Path:
    from audit.checkpoints import keygen

    keygen(tmp_path / "key.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "key.pem")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(tmp_path / "checkpoints")
    settings.DLO_AUDIT_PUBLIC_KEYS = ""
    return tmp_path


def test_the_stored_tree_gives_naive_proofs_for_every_pair_of_sizes(signing: Path) -> None:
    write_events(37)
    assert write_checkpoint() is not None
    leaves = [bytes(h) for h in AuditTreeNode.objects.filter(level=0).order_by("index")
              .values_list("hash", flat=True)]  # fmt: skip
    assert len(leaves) == 37
    # n leaves and n - popcount(n) complete inner subtrees (the frontier's are unfinished)
    assert AuditTreeNode.objects.count() == 37 + 37 - bin(37).count("1")
    assert mth(leaves).hex() == read_dir(signing / "checkpoints")[-1].body["root_hash"]
    for n in range(1, 38):
        assert tree.root_at(n) == mth(leaves[:n])
        for m in range(1, n + 1):
            assert tree.consistency_proof(m, n) == naive_proof(m, leaves[:n]), (m, n)


def test_a_proof_reads_logarithmically_many_nodes(signing: Path) -> None:
    write_events(300)
    assert write_checkpoint() is not None
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        proof = tree.consistency_proof(137, 300)
    assert len(queries) == 1 and len(proof) <= 2 * 9


# -- the witness against the API -------------------------------------------------------------


class ClientLog:
    """``witness.Log`` over Django's test client (the real views, no socket)."""

    def __init__(self, token: str) -> None:
        self.client, self.token = Client(), token

    def get(self, path: str) -> Any:
        response = self.client.get(path, HTTP_AUTHORIZATION=f"Bearer {self.token}")
        if response.status_code != 200:
            raise witness.CannotCheck(f"{path}: HTTP {response.status_code}")
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.post(
            path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {self.token}"
        )
        if response.status_code != 201:
            raise witness.CannotCheck(f"{path}: HTTP {response.status_code} {response.content!r}")
        return response.json()


@pytest.fixture
def log(signing: Path) -> ClientLog:
    user = make_user("wendy", "audit_witness")
    return ClientLog(ApiToken.issue(user, "witness")[1])


@pytest.fixture
def pinned(signing: Path) -> tuple[str, bytes]:
    from audit import verify_export

    return verify_export.read_public_key(f"{signing / 'key.pem'}.pub")


def witnessed(log: ClientLog, pinned: tuple[str, bytes], state: Path) -> str:
    return witness.poll(log, pinned, str(state))


@pytest.fixture
def seen(signing: Path, log: ClientLog, pinned: tuple[str, bytes]) -> Path:
    """Events #1–#5, checkpoint #1, #6–#10, checkpoint #2, witnessed at both; then the
    attacker (the database superuser, holding the signing key) takes over."""
    state = signing / "state.jsonl"
    write_events(5)
    write_checkpoint()
    assert "first head" in witnessed(log, pinned, state)
    write_events(5)
    write_checkpoint()
    assert "extends #1, 5 events" in witnessed(log, pinned, state)
    triggers.drop(connection)
    return state


def sign_as_the_log(signing: Path, body: dict[str, Any]) -> None:
    """The key holder writes a checkpoint file of its choosing."""
    key = load_private_key(str(signing / "key.pem"))
    signature = base64.b64encode(key.sign(canonical_json(body).encode())).decode()
    path = signing / "checkpoints" / filename(body["number"])
    path.write_text(json.dumps({"checkpoint": body, "signature": signature}))
    AuditHead.objects.filter(pk=1).update(checkpoint_number=body["number"])


def rebuild_tree() -> None:
    """The attacker makes the stored subtrees match the rewritten events."""
    AuditTreeNode.objects.all().delete()
    head = AuditHead.objects.get(pk=1)
    tree.extend(head.seq, MerkleFrontier.loads(head.frontier).root())


def rewrite_event_3(signing: Path) -> None:
    raw(
        f"UPDATE {TABLE} SET detail_json = replace(detail_json, 'because 2', 'because x'), "
        "reason = 'because x' WHERE seq = 3"
    )
    recompute_from(3)
    rebuild_tree()


def test_the_witness_follows_a_growing_log_and_cosigns(
    signing: Path, log: ClientLog, pinned: tuple[str, bytes], compliance: Any
) -> None:
    state = signing / "state.jsonl"
    write_events(3)
    write_checkpoint()
    seed = witness.read_private_seed(_witness_key(signing))
    assert "first head" in witness.poll(log, pinned, str(state), seed, "compliance-box")
    for _ in range(3):
        write_events(7)
        write_checkpoint()
        summary = witness.poll(log, pinned, str(state), seed, "compliance-box")
        assert summary.endswith("; cosigned"), summary
    heads = [json.loads(line)["checkpoint"] for line in state.read_text().splitlines()]
    assert [(h["number"], h["tree_size"]) for h in heads] == [(1, 3), (2, 10), (3, 17), (4, 24)]
    latest = AuditCosignature.objects.first()
    assert latest is not None and (latest.witness, latest.tree_size) == ("compliance-box", 24)
    # A poll with nothing new cosigns the same checkpoint again: its row's time moves on, and
    # the log does not grow (a cosignature is a receipt, not an audited action).
    witness.poll(log, pinned, str(state), seed, "compliance-box")
    assert AuditCosignature.objects.count() == 4 and AuditHead.objects.get(pk=1).seq == 24
    # The audit page shows the latest witnessed head.
    page = Client()
    page.force_login(compliance)
    body = page.get("/audit/").content.decode()
    assert "Last witnessed" in body and "compliance-box" in body and "#4" in body


def _witness_key(signing: Path) -> str:
    from audit.checkpoints import keygen

    keygen(signing / "witness.pem")
    return str(signing / "witness.pem")


def test_a_key_holders_rewrite_is_caught_by_the_consistency_proof(
    signing: Path, seen: Path, log: ClientLog, pinned: tuple[str, bytes]
) -> None:
    """Event #3 rewritten, every hash, the subtrees and a new checkpoint re-made and signed
    with the real key, even linked to the checkpoint the witness saw: inconsistent."""
    old = read_dir(signing / "checkpoints")[-1]
    rewrite_event_3(signing)
    write_events(3)
    head = AuditHead.objects.get(pk=1)
    rebuild_tree()
    root = MerkleFrontier.loads(head.frontier).root()
    body = {**old.body, "number": 3, "tree_size": head.seq, "prev_checkpoint": old.digest(),
            "root_hash": root, "head_hash": head.hash}  # fmt: skip
    sign_as_the_log(signing, body)
    with pytest.raises(witness.Inconsistent, match="does not extend the tree of 10 events"):
        witnessed(log, pinned, seen)
    assert len(seen.read_text().splitlines()) == 2  # the state keeps the last good head


def drop_checkpoints(directory: Path, first: int) -> None:
    """What a host attacker deletes to roll the history back to before ``first``: the files
    and their lines in the day segments."""
    for path in directory.glob("checkpoint-*.json"):
        if int(path.stem.removeprefix("checkpoint-")) >= first:
            path.unlink()
    for segment in directory.glob("checkpoints-*.jsonl"):
        kept = [
            line
            for line in segment.read_text().splitlines()
            if int(json.loads(line)["checkpoint"]["number"]) < first
        ]
        segment.write_text("".join(f"{line}\n" for line in kept))


def test_a_key_holders_rewrite_resigned_from_scratch_is_caught(
    signing: Path, seen: Path, log: ClientLog, pinned: tuple[str, bytes], settings: Any
) -> None:
    """The same rewrite with the whole checkpoint history re-signed: ``audit verify`` alone
    says OK (the key holder controls everything it checks); the witness does not, and
    ``audit verify --witness`` names it."""
    rewrite_event_3(signing)
    drop_checkpoints(signing / "checkpoints", 1)
    AuditHead.objects.filter(pk=1).update(checkpoint_number=0, checkpoint_tree_size=0)
    write_checkpoint(force=True)
    write_checkpoint(force=True)
    call_command("audit", "verify")  # OK: the database and its re-signed checkpoints agree
    with pytest.raises(witness.Inconsistent, match="fork: checkpoint #2 differs"):
        witnessed(log, pinned, seen)
    write_events(2)
    write_checkpoint()
    with pytest.raises(witness.Inconsistent, match="does not follow the checkpoint #2"):
        witnessed(log, pinned, seen)
    with pytest.raises(CommandError, match="does not extend the head the witness saw"):
        call_command("audit", "verify", "--witness", str(seen))


def test_a_rollback_is_caught(
    signing: Path, seen: Path, log: ClientLog, pinned: tuple[str, bytes]
) -> None:
    """The newest checkpoint file deleted and the head's counter set back."""
    drop_checkpoints(signing / "checkpoints", 2)
    AuditHead.objects.filter(pk=1).update(checkpoint_number=1)
    with pytest.raises(witness.Inconsistent, match="rollback: the log shows checkpoint #1"):
        witnessed(log, pinned, seen)


def test_a_cut_is_caught_and_so_is_its_regrowth(
    signing: Path, seen: Path, log: ClientLog, pinned: tuple[str, bytes]
) -> None:
    """Events #8–#10 deleted, the head, subtrees and checkpoint #2 made to match, then
    re-signed; later the log regrows past the cut with other events."""
    raw(f"DELETE FROM {TABLE} WHERE seq >= 8")
    recompute_from(10**9)
    rebuild_tree()
    drop_checkpoints(signing / "checkpoints", 2)
    AuditHead.objects.filter(pk=1).update(checkpoint_number=1)
    write_checkpoint()
    with pytest.raises(witness.Inconsistent, match="rollback: .* 7 events, but this witness"):
        witnessed(log, pinned, seen)
    with pytest.raises(CommandError, match=r"events #8–#10 were cut"):
        call_command("audit", "verify", "--witness", str(seen))
    write_events(5)
    write_checkpoint()  # #3 of 12 events: larger than the witnessed 10
    with pytest.raises(witness.Inconsistent, match="inconsistent|does not follow"):
        witnessed(log, pinned, seen)


def test_a_fork_at_the_same_size_is_caught(
    signing: Path, seen: Path, log: ClientLog, pinned: tuple[str, bytes]
) -> None:
    """Two checkpoints of the same size with different roots, both validly signed."""
    old = read_dir(signing / "checkpoints")[-1]
    sign_as_the_log(signing, {**old.body, "number": 3, "prev_checkpoint": old.digest(),
                              "root_hash": "ab" * 32})  # fmt: skip
    with pytest.raises(witness.Inconsistent, match="fork: the log shows another tree of 10"):
        witnessed(log, pinned, seen)


def test_a_replaced_signing_key_is_caught(
    signing: Path, seen: Path, log: ClientLog, pinned: tuple[str, bytes], settings: Any
) -> None:
    from audit.checkpoints import keygen

    keygen(signing / "other.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(signing / "other.pem")
    write_events(1)
    write_checkpoint()
    with pytest.raises(witness.Inconsistent, match="not signed by the pinned key"):
        witnessed(log, pinned, seen)


def test_verify_command_with_a_witness_passes_on_an_honest_log(
    signing: Path, seen: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_events(2)
    call_command("audit", "verify", "--witness", str(seen))
    assert "extends the witness's last head" in capsys.readouterr().out


# -- the API ----------------------------------------------------------------------------------


def test_the_api_needs_compliance_or_a_witness_token(signing: Path, viewer: Any) -> None:
    write_events(3)
    write_checkpoint()
    client = Client()
    client.force_login(viewer)
    assert client.get("/api/audit/checkpoints/latest/").status_code == 403
    assert AuditEvent.objects.filter(action="audit.witness", outcome="denied").exists()
    token = ApiToken.issue(make_user("wes", "audit_witness"), "w")[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    latest = client.get("/api/audit/checkpoints/latest/", **auth)
    assert latest.status_code == 200 and latest.json()["checkpoint"]["tree_size"] == 3
    proof = client.get("/api/audit/consistency/?first=1&second=3", **auth).json()
    assert len(proof["proof"]) == 2
    for bad in ("first=3&second=1", "first=1&second=4", "first=x&second=2", "second=2"):
        response = client.get(f"/api/audit/consistency/?{bad}", **auth)
        assert response.status_code == 400, bad
    schema = client.get("/api/schema/?format=json", **auth).json()
    assert {"/api/audit/checkpoints/latest/", "/api/audit/consistency/",
            "/api/audit/cosignatures/"} <= set(schema["paths"])  # fmt: skip


def test_a_cosignature_of_another_tree_is_refused(
    signing: Path, log: ClientLog, pinned: tuple[str, bytes]
) -> None:
    write_events(3)
    write_checkpoint()
    seed = witness.read_private_seed(_witness_key(signing))
    cp = log.get("/api/audit/checkpoints/latest/")["checkpoint"]
    with pytest.raises(witness.CannotCheck, match="409"):
        witness.cosign(log, {**cp, "root_hash": "cd" * 32}, seed, "w")
    assert not AuditCosignature.objects.exists()


# -- the script itself, over HTTP --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_witness_script_over_http(signing: Path, live_server: Any) -> None:
    token = ApiToken.issue(make_user("wade", "audit_witness"), "w")[1]
    write_events(4)
    write_checkpoint()
    state = signing / "state.jsonl"

    def run() -> subprocess.CompletedProcess[str]:
        args = ["--url", live_server.url, "--token", token, "--state", str(state),
                "--public-key", f"{signing / 'key.pem'}.pub"]  # fmt: skip
        return subprocess.run(  # noqa: S603
            [sys.executable, str(ROOT / "audit" / "witness.py"), *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    first = run()
    assert first.returncode == 0 and first.stdout.startswith("OK: checkpoint #1"), first
    write_events(4)
    write_checkpoint()
    assert run().returncode == 0
    drop_checkpoints(signing / "checkpoints", 2)
    AuditHead.objects.filter(pk=1).update(checkpoint_number=1)
    rolled = run()
    assert rolled.returncode == 1
    assert rolled.stderr.startswith("INCONSISTENT: rollback"), rolled.stderr


# -- at scale: O(1) per checkpoint (item 8) ---------------------------------------------------


def test_writing_and_showing_checkpoints_never_lists_the_directory(
    signing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_events(2)
    write_checkpoint()

    def no_listing(self: Path, pattern: str) -> Any:
        raise AssertionError(f"listed {self} for {pattern}")

    monkeypatch.setattr(Path, "glob", no_listing)
    from audit.status import log_status

    for _ in range(3):
        write_events(1)
        assert write_checkpoint() is not None
    status = log_status()
    assert status.checkpoint is not None and status.checkpoint.number == 4
    assert status.matches is True


def test_verifying_many_checkpoints_checks_one_signature_per_key(
    signing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audit import verify as verify_module
    from audit.actions import verify_chain
    from audit.checkpoints import trusted_keys

    for _ in range(20):
        write_events(1)
        write_checkpoint()
    calls: list[int] = []

    class Counting:
        def __init__(self, key: Any) -> None:
            self.key = key

        def verify(self, signature: bytes, data: bytes) -> None:
            calls.append(1)
            self.key.verify(signature, data)

    def counted(extra: Any = None) -> Any:
        return {kid: Counting(key) for kid, key in trusted_keys(extra).items()}

    monkeypatch.setattr(verify_module, "trusted_keys", counted)
    result = verify_chain(checkpoint_dir=signing / "checkpoints")
    assert result.ok and result.checkpoints_matched == 20, result.summary()
    assert len(calls) == 1  # the newest: every earlier body is linked to it by hash


def test_no_checkpoint_yet_is_a_json_404(signing: Path, log: ClientLog) -> None:
    write_events(2)
    response = log.client.get(
        "/api/audit/checkpoints/latest/", HTTP_AUTHORIZATION=f"Bearer {log.token}"
    )
    assert response.status_code == 404 and "no signed checkpoint" in response.json()["error"]
