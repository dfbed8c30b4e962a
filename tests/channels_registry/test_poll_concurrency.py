"""A hung broker (accepts TCP, never answers) beside a healthy one: the healthy broker's sample
is committed while the hung one is still waiting out its timeout, on both poll paths."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command

from channels_registry import polling, tasks
from channels_registry.health import HealthState
from channels_registry.models import BrokerKind, ChannelHealth, ChannelSample
from tests.conftest import broker_required, make_broker, make_channel

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.django_db]

REDIS_URL = os.environ.get("DLO_TEST_LAYER_REDIS_URL", "redis://127.0.0.1:6379/0")
NO_DLQ: dict[str, Any] = {"dlq_address": "", "poison_address": ""}


@pytest.fixture
def hung_endpoint() -> Iterator[str]:
    """A TCP listener that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=2)
    for conn in held:
        conn.close()
    server.close()


#: The hung broker's kind → (its URL at the hung endpoint, its channel's address fields).
HUNG: dict[str, tuple[str, dict[str, str]]] = {
    BrokerKind.REDIS: ("redis://{}/0", {"address": "hung", "address_group": "g"}),
    # STOMP: the TCP connection opens and CONNECTED never comes.
    BrokerKind.ACTIVEMQ: ("stomp://{}", {"address": "hung"}),
}


@pytest.fixture(params=sorted(HUNG))
def brokers(
    request: pytest.FixtureRequest,
    hung_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> Iterator[list[str]]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        broker_required("Redis", exc)
    settings.DLO_BROKER_TIMEOUT_S = 5.0  # the hung broker holds out this long
    stream = f"dlo-hung-{uuid.uuid4().hex[:8]}"
    client.xadd(stream, {"body": b"x"})
    client.xgroup_create(stream, "g", id="0")
    url, address = HUNG[request.param]
    monkeypatch.setenv("DLO_BROKER_TEST_HUNG_URL", url.format(hung_endpoint))
    monkeypatch.setenv("DLO_BROKER_TEST_HEALTHY_URL", REDIS_URL)
    # "a-hung" sorts first: a sequential poll would wait out its timeout before the other.
    hung = make_broker(name="a-hung", kind=request.param, url_env="DLO_BROKER_TEST_HUNG_URL")
    healthy = make_broker(
        name="b-healthy", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_HEALTHY_URL"
    )
    make_channel(hung, slug="hung", **address, **NO_DLQ)
    make_channel(healthy, slug="ok", address=stream, address_group="g", **NO_DLQ)
    yield [hung.name, healthy.name]
    client.delete(stream)
    client.close()


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """("returned", broker) when a broker call ends; ("stored", broker) when its poll is
    committed. Their order is the proof; no clock threshold is involved."""
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    call, finish = polling._call_broker, polling._finish

    def recorded_call(poll: Any) -> Any:
        result = call(poll)
        with lock:
            seen.append(("returned", poll.broker.name))
        return result

    def recorded_finish(poll: Any) -> Any:
        outcome = finish(poll)
        with lock:
            seen.append(("stored", poll.broker.name))
        return outcome

    monkeypatch.setattr(polling, "_call_broker", recorded_call)
    monkeypatch.setattr(polling, "_finish", recorded_finish)
    return seen


def _assert_healthy_first(events: list[tuple[str, str]]) -> None:
    assert ("returned", "a-hung") in events and ("stored", "b-healthy") in events
    assert events.index(("stored", "b-healthy")) < events.index(("returned", "a-hung"))
    hung = ChannelHealth.objects.get(channel__slug="hung")
    ok = ChannelHealth.objects.get(channel__slug="ok")
    assert hung.state == HealthState.STALE and ok.state != HealthState.STALE
    assert ChannelSample.objects.get(channel__slug="ok").backlog is not None


def test_poll_once_commits_the_healthy_broker_before_the_hung_one_times_out(
    brokers: list[str], events: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("poll", "--once")
    _assert_healthy_first(events)
    out = capsys.readouterr().out
    assert out.index("b-healthy: ok") < out.index("a-hung: failed")


def test_the_scheduler_task_polls_brokers_concurrently(
    brokers: list[str], events: list[tuple[str, str]]
) -> None:
    assert tasks.schedule_polls_task() == 2  # eager here: runs poll_brokers_task inline
    _assert_healthy_first(events)
