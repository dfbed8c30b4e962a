"""``demo``: demo channels on the reachable brokers, with traffic that exercises every path."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.actions import Actor
from dashboard.demo import compare, runner, topology


class Command(BaseCommand):
    help = "Declare demo channels on the reachable brokers and run reference traffic on them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seconds", type=float, default=600.0, help="Run this long (0: until Ctrl-C)."
        )
        parser.add_argument(
            "--rate", type=float, default=20.0, help="Messages per second per broker."
        )
        parser.add_argument("--prefix", default="demo", help="Name prefix of everything created.")
        parser.add_argument("--seed", type=int, default=None, help="Seed of the message mix.")
        parser.add_argument(
            "--dedup-max", type=int, default=5000, help="Size bound of each dedup store."
        )
        parser.add_argument(
            "--timeout", type=float, default=2.0, help="Timeout of every broker call (s)."
        )
        parser.add_argument(
            "--reset", action="store_true", help="Delete the demo queues/streams first."
        )
        parser.add_argument(
            "--no-ops",
            action="store_true",
            help="Do not poll/ingest here (leave it to a running web process or Celery).",
        )
        parser.add_argument("--report", help="Also write the summary as JSON to this file.")

    def handle(self, *args: Any, **options: Any) -> None:
        seconds, rate = float(options["seconds"]), float(options["rate"])
        if seconds < 0 or not 0 < rate <= 1000:
            raise CommandError("--seconds must be ≥ 0 and --rate in (0, 1000].")
        if options["dedup_max"] < 1:
            raise CommandError("--dedup-max must be at least 1.")
        timeout = float(options["timeout"])
        # pika logs every connection at INFO; the demo opens many. Warnings still show.
        logging.getLogger("pika").setLevel(logging.WARNING)
        try:
            names_of: dict[str, topology.Names] = {
                k: topology.names_for(options["prefix"], k) for k in topology.KINDS
            }
        except ValueError as exc:
            raise CommandError(str(exc)) from None

        # 1. Detect.
        self.stdout.write("Looking for brokers on loopback…")
        found = topology.detect(timeout)
        for item in found:
            self.stdout.write(f"  {item.describe()}")
        reachable = [f for f in found if f.reachable]
        if not reachable:
            raise CommandError(
                "No broker is reachable. Start RabbitMQ, Redis, NATS or ActiveMQ (docker compose"
                " up), or point DEMO_RABBITMQ_URL / DEMO_REDIS_URL / DEMO_NATS_URL /"
                " DEMO_ACTIVEMQ_URL at one."
            )

        # 2. (The demo brokers store their loopback URLs, so every process can poll them.)

        # 3. Topology, then declarations (audited, idempotent).
        actor = Actor.system("demo")
        declared = []
        for item in reachable:
            names = names_of[item.kind]
            try:
                if options["reset"]:
                    topology.teardown_topology(item, names, timeout)
                topology.create_topology(item, names, timeout)
            except topology.TopologyError as exc:
                raise CommandError(str(exc)) from None
            result = topology.declare(item, names, actor)
            declared.append((item, names, result))
            changes = ", ".join(result.changed) or "already declared, unchanged"
            findings = result.channel.error_count + result.channel.warning_count
            self.stdout.write(f"  {names.slug}: {changes}; {findings} declaration finding(s)")
        self.stdout.write(
            "Watch it with `make run` in another terminal (same database): its scheduler"
            " polls the demo brokers too."
        )

        # 4. Run.
        seed = options["seed"] if options["seed"] is not None else int(time.time())
        started = time.monotonic()
        pace = runner.Pace.for_run(rate, seconds)
        runs = [
            runner.BrokerRun(
                item,
                names,
                result.channel,
                pace=pace,
                started=started,
                seed=seed + index,
                timeout=timeout,
                dedup_max=options["dedup_max"],
            )
            for index, (item, names, result) in enumerate(declared)
        ]
        ops = runner.Ops(
            [r.broker.pk for _, _, r in declared], [r.channel.pk for _, _, r in declared]
        )
        stop = threading.Event()
        length = f"{seconds:.0f} s" if seconds else "until Ctrl-C"
        self.stdout.write(
            f"Running {length} at {rate:g} msg/s per broker (seed {seed}); consumers slow for"
            f" {pace.slow_s:.0f} s, then catching up. Ctrl-C stops cleanly."
        )
        with _stop_on_signals(stop):
            for run in runs:
                run.start(stop)
            self._main_loop(stop, started, seconds, ops, options["no_ops"])
            stop.set()
            stuck = [name for run in runs for name in run.join(timeout * 3 + 5)]
        if stuck:
            self.stderr.write(f"Threads still running after their timeout: {', '.join(stuck)}")
        if not options["no_ops"]:
            ops.run_once()  # where the run ended, on the board and in triage

        # 5. Summary, then the board beside the brokers (after the last poll + ingest).
        elapsed = time.monotonic() - started
        comparisons = [
            compare.compare_until_agreed(result.channel, poll=not options["no_ops"])
            for _, _, result in declared
        ]
        self._summary(runs, declared, ops, elapsed, options["report"], comparisons)

    def _main_loop(
        self, stop: threading.Event, started: float, seconds: float, ops: runner.Ops, no_ops: bool
    ) -> None:
        """Poll (then evaluate alerts) and ingest as they fall due, until stopped or out of
        time; every wait is bounded."""
        next_poll, next_ingest = started, started + runner.INGEST_INTERVAL_S / 2
        while not stop.is_set():
            now = time.monotonic()
            if seconds and now - started >= seconds:
                return
            if not no_ops and now >= next_poll:
                ops.poll()
                ops.evaluate_alerts()
                next_poll = max(next_poll + runner.POLL_INTERVAL_S, time.monotonic() + 1.0)
            elif not no_ops and now >= next_ingest:
                ops.ingest()
                next_ingest = max(next_ingest + runner.INGEST_INTERVAL_S, time.monotonic() + 1.0)
            due = min(next_poll, next_ingest) if not no_ops else now + 1.0
            remaining = started + seconds - time.monotonic() if seconds else 1.0
            stop.wait(max(0.05, min(1.0, due - time.monotonic(), remaining)))

    def _summary(
        self,
        runs: list[runner.BrokerRun],
        declared: list[Any],
        ops: runner.Ops,
        elapsed: float,
        report_path: str | None,
        comparisons: list[compare.ChannelComparison],
    ) -> None:
        reports = [run.report() for run in runs]
        for report, (_, _, result) in zip(reports, declared, strict=True):
            report["ingested"] = runner.ingested_counts(result.channel)
        header = (
            f"{'broker':<16}{'produced':>9}{'processed':>10}{'dupes':>7}{'retried':>8}"
            f"{'dead-lettered':>14}{'poison':>7}{'errors':>7}  dedup max/bound  ingested"
        )
        lines = [f"Summary after {elapsed:.1f} s:", header]
        for run, r in zip(runs, reports, strict=True):
            ingested = ", ".join(f"{k} {v}" for k, v in sorted(r["ingested"].items())) or "none"
            lines.append(
                f"{run.label:<16}{r['produced']:>9}{r['processed']:>10}{r['duplicates']:>7}"
                f"{r['retried']:>8}{r['dead_lettered']:>14}{r['poison']:>7}{r['errors']:>7}"
                f"  {r['dedup_high_water']:>5}/{r['dedup_bound']:<9}  {ingested}"
            )
            if r["last_error"]:
                lines.append(f"  last error: {r['last_error']}")
        if ops.errors:
            lines.append(f"poll/ingest errors (last): {ops.errors[-1]}")
        lines.extend(compare.render(comparisons))
        self.stdout.write("\n".join(lines))
        if report_path:
            with open(report_path, "w", encoding="utf-8") as fh:
                json.dump(
                    {
                        "elapsed_s": elapsed,
                        "brokers": reports,
                        "board_vs_broker": [c.as_dict() for c in comparisons],
                    },
                    fh,
                    indent=2,
                )


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C / SIGTERM set ``stop`` (a clean stop); a second Ctrl-C interrupts at once.
    Handlers can only be installed from the main thread; elsewhere the caller stops us."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
