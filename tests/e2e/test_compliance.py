"""Journey 2 — compliance: sign in → the audit page → filter by a replay plan → export CSV and
JSON Lines → verify the exports offline with the standalone verifier (no Django)."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from audit.actions import Actor
from dlq.models import DeadLetter
from dlq.plans.actions import do_create_plan
from dlq.plans.preview import Selection
from tests.conftest import PASSWORD, make_channel, make_user
from tests.dlq.conftest import letter, store
from tests.e2e.conftest import browser_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VERIFIER = Path(__file__).resolve().parents[2] / "audit" / "verify_export.py"


def test_compliance_filters_exports_and_verifies_offline(journey: Any, tmp_path: Path) -> None:
    browser_user("cora", "compliance")
    otto = make_user("otto", "oncall")
    channel = make_channel()
    entries = store(
        channel, *(letter(b'{"order": %d, "cell": "=HYPERLINK(1)"}' % i) for i in range(3))
    )
    selection = Selection.from_params({"id": [str(e.pk) for e in entries]})
    plan, _ = do_create_plan(
        "replay",
        selection,
        DeadLetter.objects.all(),
        actor=Actor.for_user(otto),
        reason="=cmd|' /C calc'!A0 after the fix",
        request_key="journey-2",
    )

    tab = journey("compliance")
    page = tab.page
    tab.sign_in("cora", PASSWORD)
    tab.go("/audit/")
    page.fill("input[name=target_type]", "dlq.replayplan")
    page.fill("input[name=target_id]", str(plan.pk))
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(rf"target_id={plan.pk}\b"), timeout=10_000)
    expect(page.locator("main")).to_contain_text("dlq.replay.plan", timeout=10_000)
    tab.shot("filtered")

    # Exports of the filtered range (downloads, as a person would click them).
    with page.expect_download() as csv_download:
        page.get_by_role("link", name="CSV").click()
    csv_path = tmp_path / "plan.csv"
    csv_download.value.save_as(csv_path)
    with page.expect_download() as jsonl_download:
        page.get_by_role("link", name="JSON Lines").click()
    jsonl_path = tmp_path / "plan.jsonl"
    jsonl_download.value.save_as(jsonl_path)

    with csv_path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    # The plan's own events, newest first: its request (one per freeze chunk) and the plan.
    assert [r["action"] for r in rows] == ["dlq.replay.request", "dlq.replay.plan"]
    assert all(r["reason"].startswith("'=") for r in rows)  # formula neutralised
    assert len(jsonl_path.read_text().splitlines()) == 2

    # A filtered export is a subset: each event's own hash verifies offline.
    check = subprocess.run(
        [sys.executable, str(VERIFIER), str(jsonl_path), "--hashes-only"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr

    # The whole trail, contiguous, verifies with its chain links; a tampered copy does not.
    tab.go("/audit/")
    with page.expect_download() as all_download:
        page.get_by_role("link", name="JSON Lines").click()
    full = tmp_path / "all.jsonl"
    all_download.value.save_as(full)
    check = subprocess.run(
        [sys.executable, str(VERIFIER), str(full)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    lines = full.read_text().splitlines()
    lines[1] = lines[1].replace('"reason":"', '"reason":"edited ', 1)
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(lines) + "\n")
    check = subprocess.run(
        [sys.executable, str(VERIFIER), str(tampered)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode != 0
    tab.check_clean()
