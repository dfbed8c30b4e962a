"""Shared set-up of the hand-run benchmarks."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def bench_channels(
    name: str, count: int, extra: Callable[[int], dict[str, Any]] | None = None
) -> Any:
    """A Redis-kind broker ``name`` (its URL is never used: the benches replace the adapter)
    and ``count`` channels ``bench-0000``… with a DLQ and alert thresholds; ``extra(i)`` adds
    fields per channel. Returns the broker."""
    from channels_registry.models import Broker, Channel

    env = f"DLO_BROKER_BENCH_{name.upper().replace('-', '_')}_URL"
    os.environ[env] = "redis://bench.invalid:6379/0"
    broker = Broker.objects.create(name=name, kind="redis", url_env=env)
    Channel.objects.bulk_create(
        [
            Channel(
                broker=broker,
                name=f"Bench channel {i:04d}",
                slug=f"bench-{i:04d}",
                address=f"bench.{i:04d}",
                address_group="workers",
                owner_team=f"team-{i % 10}",
                semantic="at-least-once",
                dlq_address=f"bench.{i:04d}.dlq",
                alert_dlq_depth=0,
                **(extra(i) if extra else {}),
            )
            for i in range(count)
        ],
        batch_size=500,
    )
    return broker
