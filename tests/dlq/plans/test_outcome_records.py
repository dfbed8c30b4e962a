"""One audit record per relay batch (issue 24): it lists every message's outcome, each item
points at it, and every reader that showed an entry's own outcome event still shows it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from audit import verify_export
from audit.actions import verify_chain
from audit.checkpoints import keygen, write_checkpoint
from audit.filters import AuditFilterForm
from audit.models import AuditEvent
from audit.sealer import seal
from brokers.base import PublishOutcome as Outcome
from dlq.models import DeadLetter, FailureGroup, ItemStatus, ReplayItem
from dlq.models.plans import OUTCOME_ACTION, OUTCOME_FIELDS, outcome_in
from dlq.plans import relay
from tests.conftest import client_for, make_channel
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import RecordingAdapter, plan_for

pytestmark = pytest.mark.django_db

publisher = replay_helpers.publisher  # the fixture

HOSTILE = '<script>alert(1)</script>\u202e NO_ROUTE "quoted"'


def _after(event: AuditEvent) -> dict[str, Any]:
    assert isinstance(event.after, dict)
    return event.after


def _entries(n: int) -> list[DeadLetter]:
    channel = make_channel()
    return store(channel, *[letter(headers={"order_id": i}) for i in range(n)])


def test_one_record_per_batch_lists_every_outcome(
    oncall: User, publisher: RecordingAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = _entries(5)
    plan = plan_for(entries, oncall)
    doomed = ReplayItem.objects.get(plan=plan, entry=entries[1])
    publisher.policy = lambda m, n: (
        Outcome(m.key, False, f"refused: {HOSTILE}", refused=True, permanent=True)
        if m.key == str(doomed.pk)
        else Outcome(m.key, True)
    )
    monkeypatch.setattr(relay, "FAST_BATCH_SIZE", 2)  # batches of 2, 2 and 1
    relay.run_plan(plan.pk)

    records = list(AuditEvent.objects.filter(action=OUTCOME_ACTION).order_by("id"))
    assert len(records) == 3  # one per batch, not one per message
    assert [len(_after(r)["messages"]) for r in records] == [2, 2, 1]
    assert {r.target_id for r in records} == {str(plan.pk)} and {r.plan_id for r in records} == {
        str(plan.pk)
    }
    assert [r.outcome for r in records] == ["failed", "success", "success"]
    assert _after(records[0])["replayed"] == 1 and _after(records[0])["failed"] == 1
    assert "1 failed for good" in records[0].reason and HOSTILE in records[0].reason
    for item in ReplayItem.objects.filter(plan=plan):
        record = next(r for r in records if r.pk == item.outcome_event_id)
        said = outcome_in(_after(record), item.entry_id)
        assert said == {
            "entry": item.entry_id,
            "item": item.pk,
            "replay_id": item.replay_id,
            "attempts": item.attempts,
            "outcome": "failed" if item.pk == doomed.pk else "replayed",
            "error": f"refused: {HOSTILE}" if item.pk == doomed.pk else "",
        }
        assert item.status == (ItemStatus.FAILED if item.pk == doomed.pk else ItemStatus.CONFIRMED)
    seal(wait=True)
    assert verify_chain().ok  # hashed, MACed and sealed like every other event


def test_a_batch_of_only_retries_writes_no_record(
    oncall: User, publisher: RecordingAdapter
) -> None:
    entries = _entries(2)
    plan = plan_for(entries, oncall)
    # Refused once, then confirmed: the first batch has no terminal outcome to record.
    publisher.policy = lambda m, n: Outcome(m.key, n > 1, "" if n > 1 else "nack", refused=True)
    relay.run_plan(plan.pk)
    records = list(AuditEvent.objects.filter(action=OUTCOME_ACTION))
    assert len(records) == 1 and _after(records[0])["replayed"] == 2
    assert [m[3] for m in _after(records[0])["messages"]] == [2, 2]  # the attempt that landed


def test_an_entrys_outcome_is_found_by_its_id_everywhere(
    oncall: User, compliance: User, publisher: RecordingAdapter
) -> None:
    entries = _entries(12)
    plan = plan_for(entries, oncall)
    relay.run_plan(plan.pk)
    seal(wait=True)
    entry = entries[3]
    [record] = AuditEvent.objects.filter(action=OUTCOME_ACTION)
    assert len(_after(record)["messages"]) == 12

    # The filters of the audit page, its exports and the API: by target id, with or without
    # the entry's target type, and combined with other filters.
    for data in (
        {"target_id": str(entry.pk)},
        {"target_id": str(entry.pk), "target_type": "dlq.deadletter"},
        {"target_id": str(entry.pk), "action": OUTCOME_ACTION},
    ):
        form = AuditFilterForm(data)
        assert form.is_valid()
        assert record in form.apply(AuditEvent.objects.all())
    form = AuditFilterForm({"target_id": str(entry.pk), "outcome": "failed"})
    assert form.is_valid() and not form.apply(AuditEvent.objects.all()).exists()
    lonely = store(make_channel(name="Other", slug="other", address="other"), letter())[0]
    form = AuditFilterForm({"target_id": str(lonely.pk)})
    assert form.is_valid() and record not in form.apply(AuditEvent.objects.all())

    # ``audit export --target-id``.
    out = io.StringIO()
    call_command("audit", "export", "--target-id", str(entry.pk), stdout=out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["action"] for line in lines if line["action"] == OUTCOME_ACTION] == [
        OUTCOME_ACTION
    ]

    # The API's log, filtered by the entry.
    api = client_for(compliance).get(f"/api/audit-events/?target_id={entry.pk}")
    assert api.status_code == 200
    assert OUTCOME_ACTION in api.content.decode()

    # The entry's page: its line of the record.
    page = client_for(oncall).get(f"/dead-letters/{entry.pk}/").content.decode()
    item = ReplayItem.objects.get(plan=plan, entry=entry)
    assert f"this entry: replayed, attempt 1, replay id {item.replay_id}" in page

    # The audit page shows the first messages of a long record and says how many more.
    audit_page = client_for(compliance).get(f"/audit/?plan={plan.pk}").content.decode()
    assert "2 more (the whole record: export or API)" in audit_page


def test_a_hostile_refusal_is_escaped_on_the_entry_page(
    oncall: User, publisher: RecordingAdapter
) -> None:
    [entry] = _entries(1)
    plan = plan_for([entry], oncall)
    publisher.policy = lambda m, n: Outcome(m.key, False, HOSTILE, refused=True, permanent=True)
    relay.run_plan(plan.pk)
    page = client_for(oncall).get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "this entry: failed, attempt 1" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_fields_name_the_columns_of_each_message() -> None:
    after: dict[str, Any] = {"fields": list(OUTCOME_FIELDS), "messages": [[7, 1, "1:1:1", 1,
                             "replayed", ""]]}  # fmt: skip
    assert outcome_in(after, 7) == dict(zip(OUTCOME_FIELDS, after["messages"][0], strict=True))
    assert outcome_in(after, 8) is None
    assert outcome_in({"messages": "no"}, 7) is None
    assert outcome_in({"fields": ["other"], "messages": [[7]]}, 7) is None
    assert replay_helpers.recorded_outcomes() == []


def test_the_groups_open_counts_follow_the_relay(
    oncall: User, publisher: RecordingAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay recounts the groups it read with each claimed message (no lookup by entry):
    two groups, one entry of each failed for good, the rest replayed."""
    channel = make_channel()
    first = store(channel, *[letter(reason="rejected") for _ in range(3)])
    second = store(channel, *[letter(reason="expired") for _ in range(3)])
    assert first[0].group_id != second[0].group_id
    plan = plan_for(first + second, oncall)
    doomed = {first[0].pk, second[2].pk}
    items = {i.pk: i.entry_id for i in ReplayItem.objects.filter(plan=plan)}
    publisher.policy = lambda m, n: (
        Outcome(m.key, False, "refused", refused=True, permanent=True)
        if items[int(m.key)] in doomed
        else Outcome(m.key, True)
    )
    monkeypatch.setattr(relay, "FAST_BATCH_SIZE", 4)
    relay.run_plan(plan.pk)
    for entry in (first[0], second[0]):
        group = FailureGroup.objects.get(pk=entry.group_id)
        assert group.open_count == 1  # the failed one: still to triage


def test_a_plans_proof_export_proves_every_messages_outcome(
    oncall: User,
    publisher: RecordingAdapter,
    tmp_path: Path,
    settings: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``audit export --proof --plan`` carries the batch records in full: the offline verifier
    accepts it, and a message's outcome changed in the export breaks it."""
    keygen(tmp_path / "key.pem")
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "key.pem")
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(tmp_path / "checkpoints")
    entries = _entries(4)
    plan = plan_for(entries, oncall)
    relay.run_plan(plan.pk)
    seal(wait=True)
    write_checkpoint()
    capsys.readouterr()
    call_command("audit", "export", "--proof", "--plan", str(plan.pk))
    lines = capsys.readouterr().out.splitlines()
    full = [json.loads(x) for x in lines[1:] if "withheld" not in json.loads(x)]
    [record] = [e for e in full if e["action"] == OUTCOME_ACTION]
    detail = json.loads(record["detail_json"])
    assert sorted(m[0] for m in detail["after"]["messages"]) == sorted(e.pk for e in entries)

    def verify(body: list[str]) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "plan.jsonl"
        path.write_text("\n".join(body) + "\n")
        return subprocess.run(
            [sys.executable, str(Path(verify_export.__file__)), str(path),
             "--public-key", f"{tmp_path / 'key.pem'}.pub"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = verify(lines)
    assert done.returncode == 0 and done.stdout.startswith("OK:"), done.stdout
    # One message's outcome rewritten in the export: "failed" instead of "replayed".
    at = next(n for n, x in enumerate(lines) if OUTCOME_ACTION in x and '"withheld"' not in x)
    forged = json.loads(lines[at])
    forged["detail_json"] = forged["detail_json"].replace('"replayed"', '"failed"', 1)
    done = verify([*lines[:at], json.dumps(forged), *lines[at + 1 :]])
    assert done.returncode == 1 and "BROKEN" in done.stdout, done.stdout
