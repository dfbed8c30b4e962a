"""Issue 23, "Checkpoints at scale": each signed checkpoint is also appended to a per-day
segment (``checkpoints-YYYYMMDD.jsonl``) so readers open one file a day; the files stay (the
unit sinks store) and fill the numbers no segment holds."""

# ruff: noqa: F811 - fixtures imported from test_anchoring

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from audit import verify_export
from audit.actions import verify_chain
from audit.checkpoints import filename, read_dir, segment_name, write_checkpoint
from tests.audit.test_anchoring import anchored, signing, write_events  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("checkpoints-*.jsonl"))


def files_read(directory: Path) -> list[tuple[dict[str, object], str]]:
    out = []
    for path in sorted(directory.glob("checkpoint-*.json")):
        data = json.loads(path.read_text())
        out.append((data["checkpoint"], data["signature"]))
    return out


def offline(directory: Path, capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    capsys.readouterr()
    call_command("audit", "export")
    export = directory.parent / "all.jsonl"
    export.write_text(capsys.readouterr().out)
    key = f"{directory.parent / 'key.pem'}.pub"
    return subprocess.run(
        [sys.executable, verify_export.__file__, str(export), "--checkpoints", str(directory)]
        + ["--public-key", key],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_segments_are_written_and_read_back_equal_to_the_files(anchored: Path) -> None:
    [segment] = segments(anchored)
    lines = [json.loads(x) for x in segment.read_text().splitlines()]
    assert [(x["checkpoint"], x["signature"]) for x in lines] == files_read(anchored)
    cps = read_dir(anchored)
    assert segment.name == segment_name(cps[0])
    assert [(c.body, c.signature) for c in cps] == files_read(anchored)
    assert [c.segment for c in cps] == [segment.name, segment.name]
    # Read from the segment alone (the files deleted), the checkpoints are the same.
    for path in anchored.glob("checkpoint-*.json"):
        path.unlink()
    assert [(c.body, c.signature) for c in read_dir(anchored)] == [
        (c.body, c.signature) for c in cps
    ]
    result = verify_chain(checkpoint_dir=anchored)
    assert result.ok and result.checkpoints_matched == 2, result.summary()


def test_older_files_without_segments_and_newer_segments_read_complete(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for segment in segments(anchored):
        segment.unlink()  # #1 and #2 were written before segments existed
    write_events(3)
    assert write_checkpoint() is not None
    (anchored / filename(3)).unlink()  # #3 only in its segment
    cps = read_dir(anchored)
    assert [c.number for c in cps] == [1, 2, 3]
    assert [bool(c.segment) for c in cps] == [False, False, True]
    result = verify_chain(checkpoint_dir=anchored)
    assert result.ok and result.checkpoints_matched == 3, result.summary()
    done = offline(anchored, capsys)
    assert done.returncode == 0 and "3 signed checkpoints matched" in done.stdout, done.stdout


def test_a_forged_segment_line_is_named_and_its_file_is_not_read(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [segment] = segments(anchored)
    lines = segment.read_text().splitlines()
    data = json.loads(lines[0])
    data["checkpoint"]["root_hash"] = "0" * 64
    segment.write_text("\n".join([json.dumps(data, separators=(",", ":")), lines[1]]) + "\n")
    # The intact file of #1 excuses nothing: the segment is what readers read.
    result = verify_chain(checkpoint_dir=anchored)
    assert not result.ok and result.bad_checkpoint == 1
    assert "signature does not verify" in result.problem
    with pytest.raises(CommandError, match="signature does not verify"):
        call_command("audit", "verify")
    done = offline(anchored, capsys)
    assert done.returncode == 1
    assert done.stdout.strip() == "BROKEN at checkpoint #1: signature does not verify"


def test_two_segments_disagreeing_about_a_number_are_named(anchored: Path) -> None:
    [segment] = segments(anchored)
    first = json.loads(segment.read_text().splitlines()[0])
    first["checkpoint"]["root_hash"] = "0" * 64
    other = anchored / "checkpoints-19990101.jsonl"
    other.write_text(json.dumps(first, separators=(",", ":")) + "\n")
    result = verify_chain(checkpoint_dir=anchored)
    assert not result.ok and result.bad_checkpoint == 1
    assert "checkpoint #1 differs between" in result.problem


def test_a_cut_short_last_line_is_tolerated_when_the_file_exists(
    anchored: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [segment] = segments(anchored)
    data = segment.read_bytes()
    segment.write_bytes(data[: len(data) - 40])  # a crash in the middle of appending #2
    cps = read_dir(anchored)
    assert [(c.number, bool(c.segment)) for c in cps] == [(1, True), (2, False)]
    assert verify_chain(checkpoint_dir=anchored).ok
    done = offline(anchored, capsys)
    assert done.returncode == 0 and "2 signed checkpoints matched" in done.stdout, done.stdout
    # The next append starts on a line of its own; the cut line stays skipped.
    write_events(2)
    assert write_checkpoint() is not None
    assert [c.number for c in read_dir(anchored)] == [1, 2, 3]
    assert json.loads(segment.read_text().splitlines()[-1])["checkpoint"]["number"] == 3
    assert verify_chain(checkpoint_dir=anchored).ok
    # Without the file as well, #2 is missing exactly as a deleted file is.
    (anchored / filename(2)).unlink()
    result = verify_chain(checkpoint_dir=anchored)
    assert not result.ok and result.bad_checkpoint == 2
    assert "checkpoint #2 is missing" in result.problem
