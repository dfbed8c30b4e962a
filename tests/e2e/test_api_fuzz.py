"""Schemathesis against the live API (daphne on the test database, PostgreSQL in CI), once with
a viewer's token and once with an on-call's: every phase (examples, coverage, fuzzing, stateful
via the links it infers), positive and negative data, and every check that applies, plus ours:
a viewer's write never succeeds. The budget is fixed and the seed too, so a run is bounded and
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

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
MAX_EXAMPLES = 40
SEED = 20261201
# positive_data_acceptance expects every schema-valid request to succeed, but a valid filter
# can still name a plan status that no plan has (fine) or an entry id that is not there (404,
# documented): the other checks cover what the issue asks (no 500, conformance, no viewer
# write, negative data rejected).
EXCLUDED_CHECKS = "positive_data_acceptance"


def _seed_data() -> dict[str, str]:
    channel = make_channel()
    store(channel, *[letter() for _ in range(5)])
    tokens = {}
    for role, name in (("viewer", "vera"), ("oncall", "otto")):
        tokens[role] = ApiToken.issue(make_user(name, role), "fuzz")[1]
    return tokens


def _fuzz(server: str, role: str, token: str) -> dict[str, Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    report = ARTIFACTS / f"schemathesis-{role}.json"
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{server}/api/schema/?format=json",
        "--header", f"Authorization: Bearer {token}",
        "--checks", "all", "--exclude-checks", EXCLUDED_CHECKS,
        "--mode", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
        "--generation-database", "none", "--workers", "1", "--request-timeout", "20",
        "--report", "json", "--report-json-path", str(report), "--no-color",
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.fuzz_checks", "DLO_FUZZ_ROLE": role}
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    return dict(json.loads(report.read_text()))


@pytest.mark.parametrize("role", ["viewer", "oncall"])
def test_schemathesis_finds_nothing(asgi_server: str, role: str) -> None:
    tokens = _seed_data()
    _fuzz(asgi_server, role, tokens[role])
