from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from channels_registry.models import Channel
from dlq.actions import channels_to_ingest, do_ingest_channel
from dlq.ingest import IngestResult


class Command(BaseCommand):
    help = "Drain dead letters from every channel's DLQ/poison address into the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Drain once and exit.")
        parser.add_argument("--channel", help="Only this channel (slug).")
        parser.add_argument(
            "--max-batches", type=int, default=10_000, help="Batches per channel (bounded)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["once"]:
            raise CommandError("Use --once (periodic ingest runs from the scheduler).")
        if options["channel"]:
            found = Channel.objects.filter(slug=options["channel"]).values_list("pk", flat=True)
            if not found:
                raise CommandError(f"No channel {options['channel']!r}.")
            ids = list(found)
        else:
            ids = channels_to_ingest()
        total = IngestResult("all")
        for channel_id in ids:
            result = do_ingest_channel(channel_id, max_batches=options["max_batches"])
            total.add(result)
            for error in result.errors:
                self.stderr.write(f"{result.channel}: {error}")
        self.stdout.write(
            f"ingest: {len(ids)} channels, {total.fetched} fetched, {total.inserted} new, "
            f"{total.duplicates} duplicates, {len(total.errors)} errors"
        )
        if total.errors:
            raise SystemExit(1)
