"""The board tells the truth: every scenario of the harness (``tests/truth/harness.py``) on
every broker it applies to, the brokers of one scenario side by side, with short stall windows
so the suite stays fast (docs/health.md, "Ground truth")."""

from __future__ import annotations

import pytest

from tests.conftest import broker_required
from tests.truth import harness

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


@pytest.fixture
def brokers_up() -> tuple[str, ...]:
    """The broker kinds to run: all of them; on a laptop without ActiveMQ (it needs
    tests/activemq/start.sh) the other three still run, in CI its absence fails."""
    import os

    import pika
    import redis

    from tests.truth import traffic

    try:
        pika.BlockingConnection(pika.URLParameters(traffic.RABBIT_URL)).close()
        redis.Redis.from_url(traffic.REDIS_URL).ping()
    except Exception as exc:
        broker_required("RabbitMQ / Redis", exc)
    from brokers.activemq import ActiveMQAdapter
    from brokers.base import BrokerError

    try:
        ActiveMQAdapter(traffic.ACTIVEMQ_URL, timeout=3.0).ping()
    except BrokerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"ActiveMQ is not reachable on loopback (tests/activemq/start.sh): {exc}")
        return ("rabbitmq", "redis", "nats")
    return ("rabbitmq", "redis", "nats", "activemq")


def _table(outcomes: list[harness.Outcome]) -> str:
    return "\n".join(
        f"{o.scenario} on {o.kind}: expected {o.expected}, observed {o.observed_summary}"
        + (f", detected in {o.detected_s:.1f} s" if o.detected_s is not None else "")
        + (f"; {o.problems}" if o.problems else "")
        for o in outcomes
    )


@pytest.mark.parametrize(
    "name",
    [pytest.param(s.name, marks=[pytest.mark.slow] if s.slow else []) for s in harness.SCENARIOS],
)
def test_board_agrees_with_the_broker(name: str, brokers_up: tuple[str, ...]) -> None:
    outcomes = harness.run_scenarios(harness.scenario(name), brokers_up)
    assert all(o.agrees for o in outcomes), _table(outcomes)
