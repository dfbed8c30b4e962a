"""``partitions`` lists the dead-letter table's partitions (PostgreSQL); ``--ensure`` creates
the ones the next ids need (the periodic ``dlq-partitions`` job does the same); ``--drop-expired``
drops the closed partitions whose every entry is past its channel's retention (the hourly
retention run does the same, with one audit event per partition)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from dlq.capture import partitions


class Command(BaseCommand):
    help = "List, create ahead (--ensure) or drop expired (--drop-expired) dead-letter partitions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--ensure", action="store_true", help="Create partitions ahead.")
        parser.add_argument(
            "--drop-expired", action="store_true", help="Drop partitions past retention."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not partitions.is_partitioned():
            raise CommandError("The dead-letter table is not partitioned (PostgreSQL only).")
        if options["ensure"]:
            for part in partitions.ensure_partitions():
                self.stdout.write(f"created {part.name} [{part.lower}, {part.upper})")
        if options["drop_expired"]:
            for summary in partitions.drop_expired_partitions(timezone.now()):
                self.stdout.write(f"dropped {summary['partition']}: {summary['rows']} entries")
        self.stdout.write(f"{'partition':28} {'ids':24} {'rows~':>10} {'MB':>8}  ingested")
        for line in partitions.describe():
            span = (
                f"{line['first_ingested_at']:%Y-%m-%d %H:%M} … "
                f"{line['last_ingested_at']:%Y-%m-%d %H:%M}"
                if line["first_ingested_at"]
                else "(empty)"
            )
            self.stdout.write(
                f"{line['name']:28} {line['ids']:24} {line['rows_estimate']:>10} "
                f"{line['bytes'] / 1e6:8.1f}  {span}"
            )
