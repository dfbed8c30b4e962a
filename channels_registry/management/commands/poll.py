"""``poll --once``: poll every enabled broker now and print one summary line per broker."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from channels_registry.models import Broker
from channels_registry.polling import PollOutcome, PollScheduler, poll_brokers
from channels_registry.service import exists_unless_away, run_service, stop_on_signals


class Command(BaseCommand):
    help = "Poll the enabled brokers (--once: each one now, then exit; else: forever, as due)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Poll every broker once, exit.")
        parser.add_argument("--broker", help="Only this broker (by name).")

    def handle(self, *args: Any, **options: Any) -> None:
        brokers = Broker.objects.filter(enabled=True).order_by("name")
        if options["broker"]:
            brokers = brokers.filter(name=options["broker"])
        if not exists_unless_away(brokers, once=options["once"]):
            named = f" named {options['broker']!r}" if options["broker"] else " is declared"
            self.stdout.write(f"No enabled broker{named}: nothing to poll.")
            return
        if not options["once"]:
            self._forever(options["broker"])
            return
        started = time.monotonic()
        # Concurrently: each line is printed as its broker is stored, healthy ones first.
        outcomes = poll_brokers(
            [b.pk for b in brokers],
            force=True,
            on_outcome=lambda o: self.stdout.write(self._line(o)),
        )
        failed = [o for o in outcomes if o.status == "failed"]
        self.stdout.write(
            f"total: {len(outcomes)} broker(s), {sum(o.channels for o in outcomes)} channel(s),"
            f" {time.monotonic() - started:.2f} s, {len(failed)} failed"
        )
        if len(failed) == len(outcomes):
            raise CommandError("every broker failed to answer")

    def _line(self, o: PollOutcome) -> str:
        trips = "" if o.round_trips is None else f", {o.round_trips} round trip(s)"
        if o.broker_s is not None:
            trips += f" in {o.broker_s * 1000:.0f} ms"
        errors = f", {len(o.errors)} error(s): " + "; ".join(o.errors) if o.errors else ""
        return (
            f"{o.broker}: {o.status}, {o.channels} channel(s), {o.duration_s * 1000:.0f} ms"
            f"{trips}{errors}"
        )

    def _forever(self, name: str | None) -> None:
        """Poll brokers as they fall due until SIGTERM/SIGINT; brokers back off on their own
        (``due_brokers``), database outages are ridden out by ``run_service``."""

        def write(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        # Each broker on its own due time: a hung broker never holds a healthy one's poll.
        scheduler = PollScheduler(name=name)

        def one_step() -> float:
            return scheduler.step(self._write_line)

        with stop_on_signals() as stop:
            write("poll: polling brokers as they fall due until SIGTERM/SIGINT")
            try:
                run_service("poll", one_step, write=write, stop=stop)
            finally:
                scheduler.close()

    def _write_line(self, outcome: PollOutcome) -> None:
        self.stdout.write(self._line(outcome))
        self.stdout.flush()
