"""``audit verify``, ``audit export``, ``audit keygen PATH`` and ``audit checkpoint``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import checkpoints
from audit.actions import Actor, do_record_export, do_verify_chain
from audit.chain import GENESIS, VerifyResult, verify_events
from audit.export import chunks, proof_filters, proof_lines
from audit.filters import FILTER_NAMES, AuditFilterForm
from audit.models import AuditEvent, AuditHead
from audit.sealer import seal


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    try:
        stream = sys.stdin if path == "-" else Path(path).open(encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror}") from None
    with stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise CommandError(f"{path}:{number}: not JSON ({exc.msg})") from None


def verify_hashes_only(events: Iterator[dict[str, Any]]) -> VerifyResult:
    """Each event's own hash, and seqs strictly increasing, without the links between events:
    what a filtered (non-contiguous) export can prove. Reuses ``verify_events`` per event."""
    count, last_seq, last_hash = 0, None, ""
    for event in events:
        seq = int(event["seq"])
        if last_seq is not None and seq <= last_seq:
            problem = f"event #{seq} is out of order or repeated (after #{last_seq})"
            return VerifyResult(False, count, last_seq, last_hash, seq, problem)
        one = verify_events([event], start_prev_hash=None, start_seq=None)
        if not one.ok:
            return VerifyResult(False, count, last_seq, last_hash, seq, one.problem)
        count, last_seq, last_hash = count + 1, seq, str(event["hash"])
    return VerifyResult(True, count, last_seq, last_hash)


class Command(BaseCommand):
    help = "Verify the audit trail's hash chain, or export it as JSON Lines or CSV."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)
        verify = sub.add_parser("verify", help="Walk the chain; exit 1 at the first bad event.")
        verify.add_argument("--file", help="Verify an exported .jsonl range offline instead.")
        verify.add_argument(
            "--checkpoints",
            metavar="DIR",
            help="Signed checkpoints to verify against (default: DLO_AUDIT_CHECKPOINT_DIR).",
        )
        verify.add_argument(
            "--public-key",
            action="append",
            metavar="KEY",
            help="A trusted public key (repeat for rotated keys; default: the signing key's "
            "and DLO_AUDIT_PUBLIC_KEYS).",
        )
        verify.add_argument(
            "--witness",
            metavar="STATE",
            help="A witness's state file (audit/witness.py): the database must extend the "
            "last head it saw.",
        )
        keygen = sub.add_parser("keygen", help="Write a new Ed25519 signing key to PATH.")
        keygen.add_argument("path")
        sub.add_parser("checkpoint", help="Seal pending events and write a checkpoint now.")
        verify.add_argument(
            "--hashes-only",
            action="store_true",
            help="With --file: check each event's own hash but not the links between events "
            "(for a filtered export, which has gaps by design).",
        )
        export = sub.add_parser(
            "export", help="Write the (filtered) trail to standard output, oldest first."
        )
        export.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
        export.add_argument("--since", help="From this time (inclusive; ISO 8601, UTC default).")
        export.add_argument("--until", help="Until this time (exclusive).")
        export.add_argument("--actor")
        export.add_argument("--action", help="An action, or a prefix ending with * (dlq.*).")
        export.add_argument("--target-type")
        export.add_argument("--target-id")
        export.add_argument("--channel")
        export.add_argument("--outcome")
        export.add_argument("--plan", help="A replay or discard plan id.")
        export.add_argument(
            "--proof",
            action="store_true",
            help="A proof export: complete for the filters up to the latest signed checkpoint "
            "(JSON Lines; verify with verify_export.py --public-key).",
        )
        export.add_argument("--from-seq", type=int, default=1, help="With --proof: range start.")

    def handle(self, *args: Any, **options: Any) -> None:
        command = options["subcommand"]
        if command == "export":
            self.export(options)
        elif command == "keygen":
            self.keygen(options["path"])
        elif command == "checkpoint":
            self.checkpoint()
        elif options.get("file"):
            self.verify_file(options["file"], hashes_only=options["hashes_only"])
        else:
            self.verify_database(
                options.get("checkpoints"), options.get("public_key"), options.get("witness")
            )

    def keygen(self, path: str) -> None:
        try:
            public = checkpoints.keygen(Path(path))
        except FileExistsError:
            raise CommandError(f"{path} exists: a signing key is never overwritten") from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from None
        self.stdout.write(
            f"Wrote the private key to {path} (keep it out of the database and backups of "
            f"it) and the public key to {path}.pub:\n{checkpoints.public_text(public)}\n"
            f"key id {checkpoints.key_id(public)}"
        )

    def checkpoint(self) -> None:
        seal(wait=True)
        try:
            written = checkpoints.write_recorded_checkpoint(force=True)
        except checkpoints.CheckpointError as exc:
            raise CommandError(str(exc)) from None
        if written is None:
            self.stdout.write("No events yet: nothing to checkpoint.")
            return
        self.stdout.write(
            f"Checkpoint #{written.number}: {written.tree_size} events, root "
            f"{written.body['root_hash']} -> {written.path}"
        )

    def verify_database(
        self, directory: str | None, keys: list[str] | None, witness_state: str | None = None
    ) -> None:
        verification = do_verify_chain(
            Actor.system("audit-verify-command"),
            checkpoint_dir=directory,
            public_keys=keys,
            witness_state=witness_state,
        )
        for note in filter(None, verification.notes.split("\n")):
            self.stderr.write(f"note: {note}")
        if verification.ok:
            anchored = (
                f"; matches signed checkpoint #{verification.checkpoints_matched}"
                if verification.checkpoints_matched
                else "; no signed checkpoint checked"
            ) + ("; extends the witness's last head" if witness_state else "")
            self.stdout.write(
                f"OK: {verification.events} events verified; head "
                f"#{verification.head_seq} {verification.head_hash}{anchored}"
            )
            return
        if verification.first_bad_seq is None:
            raise CommandError(verification.problem)
        raise CommandError(f"BROKEN at seq {verification.first_bad_seq}: {verification.problem}")

    def verify_file(self, path: str, *, hashes_only: bool) -> None:
        if hashes_only:
            result = verify_hashes_only(_jsonl(path))
            if result.ok:
                self.stdout.write(
                    f"OK: {result.events} events, each hash matches its contents; links "
                    f"between events not checked (--hashes-only); last #{result.head_seq}"
                )
                return
            raise CommandError(result.summary())
        # An exported range may start mid-chain: trust its first prev_hash and seq, then
        # require every following event to link to the one before it.
        first: dict[str, Any] = {}

        def events() -> Iterator[dict[str, Any]]:
            for event in _jsonl(path):
                first.setdefault("seq", event.get("seq"))
                first.setdefault("prev_hash", event.get("prev_hash"))
                yield event

        result = verify_events(events(), start_prev_hash=None, start_seq=None)
        if result.ok:
            self.stdout.write(result.summary())
            if first and int(first["seq"]) == 1:
                if first["prev_hash"] != GENESIS:
                    raise CommandError("BROKEN at seq 1: its prev_hash is not GENESIS")
                self.stdout.write(f"Range #1–#{result.head_seq}: from the start of the chain.")
            elif first:
                self.stdout.write(
                    f"Range #{first['seq']}–#{result.head_seq}. Taken on trust: the first "
                    f"prev_hash {first['prev_hash']} must be the hash of event "
                    f"#{int(first['seq']) - 1} (the last line of the export before this one)."
                )
            return
        if "is missing" in result.problem:
            # A gap is tampering in a contiguous export, and by design in a filtered one.
            raise CommandError(
                f"{result.summary()}. The file is not a contiguous range of the chain, so the "
                "links between its events cannot be checked. If it is a filtered export "
                "(actor, action, target, channel or outcome), run again with --hashes-only "
                "to check each event's own hash; to verify links, export with time filters only."
            )
        raise CommandError(result.summary())

    def export(self, options: dict[str, Any]) -> None:
        form = AuditFilterForm({name: options[name] for name in FILTER_NAMES if options.get(name)})
        if not form.is_valid():
            raise CommandError("Invalid filters: " + form.errors.as_text())
        fmt = options["format"]
        if options["proof"]:
            self.export_proof(form, options["from_seq"])
            return
        upto = do_record_export(
            Actor.system("audit-export-command"), fmt=fmt, filters=form.active()
        )
        events = form.apply(AuditEvent.objects.all()).filter(seq__lte=upto)
        lines = 0
        for piece in chunks(events, fmt):
            self.stdout.write(piece, ending="")
            lines += piece.count("\n")  # JSON Lines only: a CSV cell may hold a line break
        count = f"{lines} events" if fmt == "jsonl" else "the matching events"
        # The summary goes to stderr: stdout is the export itself.
        self.stderr.write(
            f"Exported {count} up to #{upto} as {fmt}"
            + ("" if form.is_contiguous() else " (filtered: verify with --hashes-only)")
        )

    def export_proof(self, form: AuditFilterForm, first_seq: int) -> None:
        seal(wait=True)
        try:
            checkpoints.write_checkpoint()
        except checkpoints.CheckpointError as exc:
            self.stderr.write(f"note: no new checkpoint ({exc}); using the latest one")
        directory = checkpoints.checkpoint_dir()
        head = AuditHead.objects.filter(pk=1).first()
        newest = (
            checkpoints.latest(directory, head.checkpoint_number if head else 0)
            if directory and directory.exists()
            else None
        )
        if newest is None:
            raise CommandError(
                "A proof export needs a signed checkpoint: set DLO_AUDIT_SIGNING_KEY and "
                "DLO_AUDIT_CHECKPOINT_DIR, then run `manage.py audit checkpoint`."
            )
        latest = newest
        if not 1 <= first_seq <= latest.tree_size:
            raise CommandError(f"--from-seq must be within #1–#{latest.tree_size}")
        filters = proof_filters(form.active())
        do_record_export(Actor.system("audit-export-command"), fmt="proof", filters=form.active())
        for line in proof_lines(filters, latest, first_seq):
            self.stdout.write(line, ending="")
        self.stderr.write(
            f"Proof export of #{first_seq}–#{latest.tree_size} for {filters or 'all events'}, "
            f"complete up to signed checkpoint #{latest.number}"
        )
