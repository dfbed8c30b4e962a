"""Schemathesis against the live API (daphne on the test database, PostgreSQL in CI), once with
a viewer's token and once with an on-call's (plus a compliance token on the audit trail, the
one operation both of those are refused): every phase (examples, coverage, fuzzing, stateful
via the links it infers), positive and negative data, and every check Schemathesis has, none
excluded (positive data acceptance too: every request the schema allows must be taken), plus
ours: a viewer's write never succeeds. The budget is fixed and the seed too, so a run is bounded and
repeatable; the JSON report of each run lands in ``artifacts/``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dashboard.models import ApiToken
from tests.conftest import make_channel, make_user
from tests.dlq.conftest import letter, store

# Bounded by the example budget; the timeout is for a loaded machine (and deeper runs by hand).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
# The CI budget; a deeper run by hand: DLO_FUZZ_MAX_EXAMPLES=200 pytest tests/e2e/test_api_fuzz.py
MAX_EXAMPLES = int(os.environ.get("DLO_FUZZ_MAX_EXAMPLES", "25"))
SEED = 20261201


USERS = {"viewer": "vera", "oncall": "otto", "compliance": "cora"}


def _seed_data(role: str) -> str:
    """Entries to list and to act on, and the role's token."""
    channel = make_channel()
    store(channel, *[letter() for _ in range(5)])
    return ApiToken.issue(make_user(USERS[role], role), "fuzz")[1]


def _fuzz(server: str, role: str, token: str, *extra: str) -> dict[str, Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    report = ARTIFACTS / f"schemathesis-{role}.json"
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{server}/api/schema/?format=json",
        "--header", f"Authorization: Bearer {token}",
        "--checks", "all",
        "--mode", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
        "--generation-database", "none", "--workers", "1", "--request-timeout", "20",
        "--report", "json", "--report-json-path", str(report), "--no-color", *extra,
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.fuzz_checks", "DLO_FUZZ_ROLE": role}
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=840, check=False
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    return dict(json.loads(report.read_text()))


def _accepted(report: dict[str, Any], operation: str) -> int:
    rates = report["valid_rates"].get(operation, {})
    return sum(phase.get("accepted", 0) for phase in rates.values())


@pytest.mark.parametrize("role", ["viewer", "oncall"])
def test_schemathesis_finds_nothing(asgi_server: str, role: str) -> None:
    report = _fuzz(asgi_server, role, _seed_data(role))
    assert report["complete"] and report["failures"] == [] and report["errors"] == []
    # 5, plus the log's checkpoints, consistency proofs and cosignatures (issue 23)
    assert report["operations"]["tested"] == report["operations"]["total"] == 8
    assert report["test_cases"]["generated"] >= 100 * MAX_EXAMPLES // 25
    assert all(phase["status"] == "success" for phase in report["phases"].values()
               if phase["status"] != "skip")  # fmt: skip
    creates = _accepted(report, "POST /api/replay-plans/")
    # The viewer's writes were all refused; the on-call's got through, so the write path ran.
    assert creates == 0 if role == "viewer" else creates > 0


def test_schemathesis_on_the_audit_trail_with_a_compliance_token(asgi_server: str) -> None:
    token = _seed_data("compliance")
    report = _fuzz(asgi_server, "compliance", token, "--include-path", "/api/audit-events/")
    assert report["complete"] and report["failures"] == [] and report["errors"] == []
    assert report["operations"]["tested"] == 1
    assert _accepted(report, "GET /api/audit-events/") > 0
