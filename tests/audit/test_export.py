"""Exports of the trail (CSV, JSON Lines), their offline verification, and the JSON API."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.http import StreamingHttpResponse
from django.test import AsyncClient, Client

from audit import verify_export
from audit.actions import Actor, record
from audit.chain import HASHED_FIELDS
from audit.export import COLUMNS
from audit.models import AuditEvent, Outcome
from dashboard.models import ApiToken
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "audit" / "verify_export.py"


def event(action: str = "test.event", **kwargs: Any) -> AuditEvent:
    kwargs.setdefault("actor", Actor(7, "tess", "10.0.0.1"))
    return record(action, **kwargs)


def body(response: Any) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode("utf-8")


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "export.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


# Permissions and auditing of the export itself


@pytest.mark.parametrize("role", ["viewer", "oncall"])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_refused_without_the_permission(
    role: str, fmt: str, request: pytest.FixtureRequest
) -> None:
    response = client_for(request.getfixturevalue(role)).get(f"/audit/export.{fmt}")
    assert response.status_code == 403
    assert AuditEvent.objects.filter(action="audit.export", outcome=Outcome.DENIED).count() == 1


def test_export_is_audited_with_its_filters_and_excludes_itself(compliance: User) -> None:
    event(channel_slug="orders")
    response = client_for(compliance).get("/audit/export.jsonl?channel=orders&actor=tess")
    rows = jsonl(body(response))
    recorded = AuditEvent.objects.get(action="audit.export")
    assert recorded.actor_username == "cora" and recorded.outcome == Outcome.SUCCESS
    assert recorded.after == {
        "format": "jsonl",
        "filters": {"actor": "tess", "channel": "orders"},
        "up_to_seq": 2,
    }
    assert [r["seq"] for r in rows] == [1]
    assert all(r["seq"] < recorded.seq for r in rows)


def test_invalid_export_filters_are_a_400(compliance: User) -> None:
    response = client_for(compliance).get("/audit/export.csv?since=soon")
    assert response.status_code == 400 and b"since" in response.content
    assert not AuditEvent.objects.filter(action="audit.export").exists()


# CSV


def test_csv_export_streams_every_column_oldest_first(compliance: User) -> None:
    first = event(reason="first", before={"a": 1}, after={"a": 2})
    second = event(reason='second, with "quotes"\nand a line break')
    response = client_for(compliance).get("/audit/export.csv")
    assert isinstance(response, StreamingHttpResponse)
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert re.fullmatch(r'attachment; filename="audit-\d{8}T\d{6}Z-\d+\.csv"',
                        response["Content-Disposition"])  # fmt: skip
    rows = list(csv.reader(io.StringIO(body(response))))
    assert tuple(rows[0]) == COLUMNS == (*HASHED_FIELDS, "hash")
    by_seq = {int(r[0]): dict(zip(COLUMNS, r, strict=True)) for r in rows[1:]}
    assert by_seq[first.seq]["hash"] == first.hash
    assert by_seq[first.seq]["changes"] == '{"a":[1,2]}'
    assert by_seq[second.seq]["reason"] == second.reason
    assert list(by_seq) == sorted(by_seq)


@pytest.mark.parametrize("prefix", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_neutralises_formula_prefixes(compliance: User, prefix: str) -> None:
    payload = f'{prefix}HYPERLINK("http://evil.test","x")'
    event(actor=Actor(None, f"{prefix}mallory"), reason=payload, target_repr=payload,
          after={"k": "v"}, target_id=f"{prefix}1")  # fmt: skip
    rows = list(csv.reader(io.StringIO(body(client_for(compliance).get("/audit/export.csv")))))
    row = dict(zip(COLUMNS, rows[1], strict=True))
    for column in ("reason", "target_repr", "actor_username", "target_id"):
        assert row[column].startswith("'" + prefix), (column, row[column])
    assert row["reason"] == "'" + payload
    assert row["after"] == '{"k":"v"}'  # harmless cells are left alone


# JSON Lines and offline verification


def test_jsonl_lines_carry_exactly_the_hashed_fields_and_hash(compliance: User) -> None:
    event(reason="ünïcode ✓", before={"x": None}, after={"x": [1, "<b>"]})
    response = client_for(compliance).get("/audit/export.jsonl")
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    rows = jsonl(body(response))
    extra = {"index_json", "detail_json", "plan_id"}  # format 2: the texts that were hashed
    assert rows and all(set(r) == {*HASHED_FIELDS, "hash", *extra} for r in rows)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", rows[0]["created_at"])


def test_jsonl_export_round_trips_through_audit_verify_file(
    compliance: User, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(5):
        event(target_id=str(i), reason=f"r{i}", before={"v": i}, after={"v": i + 1})
    text = body(client_for(compliance).get("/audit/export.jsonl"))
    path = write(tmp_path, text)
    call_command("audit", "verify", "--file", str(path))
    out = capsys.readouterr().out
    rows = jsonl(text)
    assert f"OK: {len(rows)} events verified" in out and rows[-1]["hash"] in out
    assert "Range #1–#" in out and "from the start of the chain" in out
    rows[2]["reason"] = "rewritten"
    write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CommandError, match=f"BROKEN at seq {rows[2]['seq']}"):
        call_command("audit", "verify", "--file", str(path))


def test_filtered_export_is_reported_as_non_contiguous_and_hashes_only_verifies_it(
    compliance: User, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(6):
        event(actor=Actor(i % 2, f"user{i % 2}"))
    text = body(client_for(compliance).get("/audit/export.jsonl?actor=user1"))
    assert [r["seq"] for r in jsonl(text)] == [2, 4, 6]
    path = write(tmp_path, text)
    with pytest.raises(CommandError, match="not a contiguous range.*--hashes-only"):
        call_command("audit", "verify", "--file", str(path))
    call_command("audit", "verify", "--file", str(path), "--hashes-only")
    assert "OK: 3 events, each hash matches" in capsys.readouterr().out
    rows = jsonl(text)
    rows[1]["actor_username"] = "eve"
    write(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CommandError, match="BROKEN at seq 4: the readable fields differ"):
        call_command("audit", "verify", "--file", str(path), "--hashes-only")
    write(tmp_path, "".join(json.dumps(r) + "\n" for r in [rows[0], rows[0]]))
    with pytest.raises(CommandError, match="out of order or repeated"):
        call_command("audit", "verify", "--file", str(path), "--hashes-only")


def test_time_filtered_export_is_a_contiguous_verifiable_range(
    compliance: User, tmp_path: Path
) -> None:
    events = [event() for _ in range(4)]
    since = events[1].created_at.isoformat()
    until = events[3].created_at.isoformat()
    client = client_for(compliance)
    text = body(client.get("/audit/export.jsonl", {"since": since, "until": until}))
    assert [r["seq"] for r in jsonl(text)] == [2, 3]
    out = io.StringIO()
    call_command("audit", "verify", "--file", str(write(tmp_path, text)), stdout=out)
    assert f"Taken on trust: the first prev_hash {events[0].hash} must be the hash of event #1" in (
        out.getvalue()
    )


# The standalone, standard-library verifier


def run_script(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), str(path), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_standalone_verifier_hashes_exactly_like_the_chain() -> None:
    assert verify_export.FIELDS == HASHED_FIELDS
    assert "import django" not in SCRIPT.read_text() and "from django" not in SCRIPT.read_text()


def test_standalone_verifier_checks_an_export(compliance: User, tmp_path: Path) -> None:
    for i in range(4):
        event(reason=f"ü{i}", after={"n": i})
    text = body(client_for(compliance).get("/audit/export.jsonl"))
    path = write(tmp_path, text)
    ok = run_script(path)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: "), ok.stdout + ok.stderr
    rows = jsonl(text)
    rows[1]["reason"] = "forged"
    write(tmp_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    bad = run_script(path)
    assert bad.returncode == 1 and bad.stdout.startswith(f"BROKEN at #{rows[1]['seq']}")
    del rows[1]
    write(tmp_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    gap = run_script(path)
    assert gap.returncode == 1 and "missing" in gap.stdout
    assert run_script(path, "--hashes-only").returncode == 0


def test_docs_show_the_standalone_verifier_verbatim() -> None:
    docs = (ROOT / "docs" / "audit.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", docs, flags=re.DOTALL)
    assert SCRIPT.read_text() in blocks


# The management command


def test_export_command_writes_jsonl_that_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [event() for _ in range(3)]
    out, err = io.StringIO(), io.StringIO()
    call_command("audit", "export", "--format", "jsonl", stdout=out, stderr=err)
    rows = jsonl(out.getvalue())
    assert [r["seq"] for r in rows] == [e.seq for e in events]
    assert "Exported 3 events up to #3 as jsonl" in err.getvalue()
    recorded = AuditEvent.objects.get(action="audit.export")
    assert recorded.actor_username == "audit-export-command"
    call_command("audit", "verify", "--file", str(write(tmp_path, out.getvalue())))


def test_export_command_filters_and_csv() -> None:
    events = [event() for _ in range(3)]
    out, err = io.StringIO(), io.StringIO()
    call_command("audit", "export", "--format", "csv", "--since",
                 events[1].created_at.isoformat(), stdout=out, stderr=err)  # fmt: skip
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    assert [int(r[0]) for r in rows[1:]] == [2, 3]
    with pytest.raises(CommandError, match="Invalid filters"):
        call_command("audit", "export", "--outcome", "maybe", stdout=io.StringIO())


# Streaming under ASGI (daphne): an asynchronous iterator, or Django would buffer it all


def test_export_streams_asynchronously_under_asgi(compliance: User) -> None:
    for _ in range(3):
        event()
    client = AsyncClient()
    client.force_login(compliance)

    async def fetch() -> tuple[bool, bytes]:
        response = await client.get("/audit/export.jsonl")
        chunks = [chunk async for chunk in response.streaming_content]
        return response.is_async, b"".join(chunks)

    is_async, content = async_to_sync(fetch)()
    assert is_async
    assert [r["seq"] for r in jsonl(content.decode())][:3] == [1, 2, 3]


# The JSON API


def test_api_requires_a_token_or_session() -> None:
    response = Client().get("/api/audit-events/")
    assert response.status_code == 401
    bad = Client().get("/api/audit-events/", HTTP_AUTHORIZATION="Bearer nope")
    assert bad.status_code == 401


def test_api_refuses_a_viewer_token_and_records_it(viewer: User) -> None:
    _, raw = ApiToken.issue(viewer, "t")
    response = Client().get("/api/audit-events/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 403 and "error" in response.json()
    assert AuditEvent.objects.get(action="audit.view").outcome == Outcome.DENIED


def test_api_filters_and_pages_with_next(compliance: User) -> None:
    written = [event(channel_slug="orders").seq for _ in range(7)]
    event(channel_slug="billing")
    _, raw = ApiToken.issue(compliance, "t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    url: str | None = "/api/audit-events/?channel=orders&limit=3"
    seen: list[int] = []
    pages = 0
    while url:
        data = client.get(url).json()
        pages += 1
        seen += [r["seq"] for r in data["results"]]
        assert all(set(r) == {*HASHED_FIELDS, "hash"} for r in data["results"])
        url = data["next"]
        if url:
            assert url.startswith("http://testserver/api/audit-events/?")
            assert "channel=orders" in url and "limit=3" in url
    assert pages == 3 and seen == sorted(written, reverse=True)


def test_api_rejects_bad_filters(compliance: User) -> None:
    _, raw = ApiToken.issue(compliance, "t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.get("/api/audit-events/?before=x&limit=100000")
    assert response.status_code == 400
    assert set(response.json()["fields"]) == {"before", "limit"}


def test_verify_file_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="No such file"):
        call_command("audit", "verify", "--file", str(tmp_path / "none.jsonl"))


def test_api_lists_only_sealed_events_so_seq_and_hash_are_never_null(
    compliance: User, settings: Any
) -> None:
    """Issue #27 item 8: unsealed events came back with ``seq``/``hash`` null where the schema
    promises an integer and a string (Schemathesis ST108)."""
    from audit import sealer

    settings.DLO_AUDIT_SEALER = "off"
    event("test.sealed")
    sealer.seal()
    fresh = event("test.fresh")
    assert fresh.seq is None
    _, raw = ApiToken.issue(compliance, "t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    results = client.get("/api/audit-events/").json()["results"]
    assert [r["action"] for r in results] == ["test.sealed"]
    assert all(isinstance(r["seq"], int) and isinstance(r["hash"], str) for r in results)
    sealer.seal()
    results = client.get("/api/audit-events/").json()["results"]
    assert [r["action"] for r in results] == ["test.fresh", "test.sealed"]


def test_api_answers_an_empty_time_range_with_an_empty_page(compliance: User) -> None:
    """``since == until`` (an empty half-open range) was a 400; so was ``since > until``,
    which the schema cannot forbid."""
    event()
    _, raw = ApiToken.issue(compliance, "t")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for since, until in [("2030-01-01T00:00:00Z", "2030-01-01T00:00:00Z"),
                         ("2030-01-02", "2030-01-01")]:  # fmt: skip
        response = client.get("/api/audit-events/", {"since": since, "until": until})
        assert response.status_code == 200
        assert response.json() == {"results": [], "next": None}
    # The page still flags an inverted range as a slip, but takes an empty one.
    page = client_for(compliance).get("/audit/", {"since": "2030-01-01", "until": "2030-01-01"})
    assert "must not be later" not in page.content.decode()
