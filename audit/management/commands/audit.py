"""``audit verify [--file export.jsonl]``: walk the hash chain and name the first bad event."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.actions import Actor, do_verify_chain
from audit.chain import verify_events


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    stream = sys.stdin if path == "-" else Path(path).open(encoding="utf-8")  # noqa: SIM115
    with stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise CommandError(f"{path}:{number}: not JSON ({exc.msg})") from None


class Command(BaseCommand):
    help = "Verify the audit trail's hash chain (the database, or an exported JSON Lines file)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser("verify", help="Walk the chain; exit 1 at the first bad event.")
        verify.add_argument("--file", help="Verify an exported .jsonl range offline instead.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("file"):
            # An exported range may start mid-chain: trust its first prev_hash and seq.
            result = verify_events(_jsonl(options["file"]), start_prev_hash=None, start_seq=None)
        else:
            verification = do_verify_chain(Actor.system("audit-verify-command"))
            result_ok, first_bad = verification.ok, verification.first_bad_seq
            if result_ok:
                self.stdout.write(
                    f"OK: {verification.events} events verified; head "
                    f"#{verification.head_seq} {verification.head_hash}"
                )
                return
            raise CommandError(f"BROKEN at seq {first_bad}: {verification.problem}")
        if result.ok:
            self.stdout.write(result.summary())
            return
        raise CommandError(result.summary())
