"""``ingest --once`` drains every channel once; ``ingest`` keeps draining until SIGTERM/SIGINT,
riding out database and broker outages (``channels_registry.service``)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from channels_registry.models import Channel
from channels_registry.service import Backoff, exists_unless_away, run_service, stop_on_signals
from dlq.capture.ingest import IngestResult, channels_to_ingest, do_ingest_channel

IDLE_WAIT_S = 2.0  # between rounds when nothing was waiting
ROUND_BATCHES = 20  # batches per channel per round, so a busy channel never starves the rest
MAX_BACKOFF_S = 60.0


class Command(BaseCommand):
    help = "Drain dead letters from every channel's DLQ/poison address into the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Drain once and exit.")
        parser.add_argument("--channel", help="Only this channel (slug).")
        parser.add_argument(
            "--max-batches", type=int, default=10_000, help="Batches per channel (bounded)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["channel"]
        channels = Channel.objects.filter(slug=slug)
        if slug and not exists_unless_away(channels, once=options["once"]):
            raise CommandError(f"No channel {slug!r}.")
        if not options["once"]:
            self._forever(slug)
            return
        ids = self._channel_ids(slug)
        total = IngestResult("all")
        for channel_id in ids:
            result = do_ingest_channel(channel_id, max_batches=options["max_batches"])
            total.add(result)
            for error in result.errors:
                self.stderr.write(f"{result.channel}: {error}")
        waiting = f", {total.stalled} waiting unfetched" if total.stalled else ""
        if total.deferred:
            waiting += f", {total.deferred} NATS advisories waiting for their copy"
        self.stdout.write(
            f"ingest: {len(ids)} channels, {total.fetched} fetched, {total.inserted} new, "
            f"{total.duplicates} duplicates, {len(total.errors)} errors{waiting}"
        )
        if total.errors:
            raise SystemExit(1)

    @staticmethod
    def _channel_ids(slug: str | None) -> list[int]:
        if slug:
            return list(Channel.objects.filter(slug=slug).values_list("pk", flat=True))
        return channels_to_ingest()

    def _forever(self, slug: str | None) -> None:
        """One round drains each due channel (bounded); a channel whose broker failed waits
        out its own backoff, and one line says when it fails and when it is back."""
        backoffs: dict[int, Backoff] = {}
        not_before: dict[int, float] = {}

        def write(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        def one_round() -> float:
            busy = False
            for channel_id in self._channel_ids(slug):
                if stop.is_set():
                    break
                if not_before.get(channel_id, 0.0) > time.monotonic():
                    continue
                result = do_ingest_channel(channel_id, max_batches=ROUND_BATCHES)
                backoff = backoffs.setdefault(channel_id, Backoff(MAX_BACKOFF_S))
                if result.errors:
                    delay = backoff.next_delay()
                    not_before[channel_id] = time.monotonic() + delay
                    write(
                        f"ingest {result.channel}: broker unavailable ({result.errors[0]}); "
                        f"retrying in {delay:.0f} s"
                    )
                    continue
                if backoff.failures:
                    write(f"ingest {result.channel}: broker ok again")
                backoff.reset()
                not_before.pop(channel_id, None)
                if result.fetched:
                    write(
                        f"ingest {result.channel}: {result.fetched} fetched, "
                        f"{result.inserted} new, {result.duplicates} duplicates"
                    )
                if result.stalled:
                    write(
                        f"ingest {result.channel}: nothing fetched while the broker says "
                        f"{result.stalled} dead letters are waiting"
                    )
                busy = busy or result.batches >= ROUND_BATCHES
            return 0.0 if busy else IDLE_WAIT_S

        with stop_on_signals() as stop:
            write("ingest: draining until SIGTERM/SIGINT")
            run_service("ingest", one_round, write=write, stop=stop, max_backoff_s=MAX_BACKOFF_S)
