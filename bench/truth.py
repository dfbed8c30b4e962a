"""Ground truth (hand-run): ``DATABASE_URL=postgres://…/db python -m bench.truth``.

Runs every scenario of ``tests/truth/harness.py`` on every broker it applies to (RabbitMQ,
Redis streams, NATS JetStream on loopback), polled by the real poller, and prints a table
scenario × broker: the expected state, the states observed, the detection time after the fault
and its target, and ``truth agreement: N/M``. The declarations it creates (brokers, channels)
and the queues/streams are deleted afterwards.

Defaults are the product's: a 60 s stall window (``DLO_HEALTH_STALL_S``) and a 10 s poll, so a
full run takes about an hour; ``TRUTH_STALL_S`` and ``TRUTH_INTERVAL_S`` shorten both (the suite
uses 5-10 s and 1 s), ``TRUTH_ONLY=killed,hung`` and ``TRUTH_KINDS=nats`` pick a subset.

``TRUTH_SOAK_S=600`` runs the soak instead: the ``retries`` scenario (healthy traffic with
retries in the mix) held that long on every broker, alert rules evaluated after every poll;
any state but OK / catching up, or any alert fired, is a disagreement.
"""

from __future__ import annotations

import os
import sys
import time

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tests.truth import harness

    stall_env = os.environ.get("TRUTH_STALL_S")
    interval = float(os.environ.get("TRUTH_INTERVAL_S", "10"))
    only = {s for s in os.environ.get("TRUTH_ONLY", "").split(",") if s}
    kinds = {k for k in os.environ.get("TRUTH_KINDS", "").split(",") if k}
    print(
        f"stall window {stall_env or settings.DLO_HEALTH_STALL_S} s, poll every {interval:g} s;"
        f" load {os.getloadavg()[0]:.2f}"
    )
    header = (
        f"{'scenario':<14} {'broker':<9} {'expected':<20} {'observed':<36}"
        f" {'detected / target':>18}  ok"
    )
    print(header)
    print("-" * len(header))
    agreed = total = 0
    started = time.monotonic()
    stall = float(stall_env) if stall_env else float(settings.DLO_HEALTH_STALL_S)
    soak = float(os.environ.get("TRUTH_SOAK_S", "0"))
    if soak:
        only = {"retries"}
    for sc in harness.SCENARIOS:
        if only and sc.name not in only:
            continue
        wanted = tuple(k for k in sc.kinds if not kinds or k in kinds)
        try:  # the brokers of one scenario side by side, as in the suite
            outcomes = harness.run_scenarios(
                sc,
                wanted,
                interval_s=interval,
                stall_s=stall,
                hold_s=soak or None,
                alerts=bool(soak),
            )
        except Exception as exc:  # a broker down: say so in the table, go on
            print(f"{sc.name:<14} {','.join(wanted):<9} error: {str(exc)[:100]}")
            total += len(wanted)
            continue
        for outcome in outcomes:
            total += 1
            agreed += outcome.agrees
            detected = "—" if outcome.detected_s is None else f"{outcome.detected_s:.0f} s"
            target = "" if outcome.target_s is None else f" / {outcome.target_s:.0f} s"
            print(
                f"{sc.name:<14} {outcome.kind:<9} {outcome.expected:<20}"
                f" {outcome.observed_summary[:36]:<36} {detected + target:>18}"
                f"  {'yes' if outcome.agrees else 'NO'}"
            )
            for problem in outcome.problems[:3]:
                print(f"{'':<25}! {problem[:150]}")
        sys.stdout.flush()
    print(f"\ntruth agreement: {agreed}/{total}")
    print(f"({time.monotonic() - started:.0f} s; load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
