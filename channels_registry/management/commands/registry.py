"""``registry export`` / ``registry import FILE [--check]``: declarations as code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.actions import Actor
from channels_registry.declarations import (
    MAX_FILE_BYTES,
    DeclarationFileError,
    export_registry,
    import_registry,
)
from channels_registry.principles import describe


class Command(BaseCommand):
    help = "Export the channel registry as YAML, or import (upsert) a YAML declaration file."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("export", help="Write every broker and channel declaration to stdout.")
        imp = sub.add_parser("import", help="Validate and upsert a declaration file atomically.")
        imp.add_argument("file", help="YAML file, or - for standard input")
        imp.add_argument(
            "--check",
            action="store_true",
            help="Validate only; exit 1 on errors or error-severity findings.",
        )
        imp.add_argument(
            "--actor",
            default="",
            help="Username recorded in the audit trail (default: system actor 'registry-import').",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "export":
            self.stdout.write(export_registry(), ending="")
            return
        name = options["file"]
        try:
            if name == "-":
                raw = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
            else:
                with Path(name).open("rb") as handle:
                    raw = handle.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                raise CommandError(f"{name} is larger than {MAX_FILE_BYTES // 2**20} MiB.")
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {name}: {exc}") from None
        actor = Actor.system("registry-import")
        if options["actor"]:
            user = get_user_model().objects.filter(username=options["actor"]).first()
            if user is None:
                raise CommandError(f"no user named {options['actor']!r}")
            actor = Actor.for_user(user)
        try:
            report = import_registry(text, actor=actor, check_only=options["check"])
        except DeclarationFileError as exc:
            for problem in exc.problems:
                self.stderr.write(f"{name}:{problem.line}: {problem.message}")
            raise CommandError(
                f"{len(exc.problems)} problem(s) in {name}; nothing was imported."
            ) from None
        for slug, findings in report.findings.items():
            for f in map(describe, findings):
                self.stdout.write(
                    f"{slug}: {f['severity']} {f['principle']} ({f['principle_name']})"
                    f" {f['code']}: {f['message']}"
                )
        verb = "would import" if options["check"] else "imported"
        self.stdout.write(
            f"{verb}: {report.created} created, {report.updated} updated, "
            f"{report.unchanged} unchanged; {report.error_findings} error finding(s)."
        )
        if options["check"] and report.error_findings:
            raise CommandError("declaration checks found errors (see above).")
