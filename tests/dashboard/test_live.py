"""The board's websocket: refused for anonymous, outsiders and foreign origins; a viewer gets the
same row partial the page renders after a poll commits, coalesced per client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.apps import apps as django_apps
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache

from channels_registry.actions import do_poll_broker
from channels_registry.models import BrokerKind
from dashboard.asgi import application
from dashboard.live import BOARD_GROUP
from dashboard.roles import sync_roles
from tests.conftest import broker_required, client_for, make_broker, make_channel, make_user

REDIS_URL = "redis://127.0.0.1:6379/0"
ORIGIN = (b"origin", b"http://testserver")
HOST = (b"host", b"testserver")


def _cookie(user: User) -> tuple[bytes, bytes]:
    client = client_for(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    return (b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode())


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async_to_sync(scenario)()


@pytest.fixture(autouse=True)
def _roles(transactional_db: Any) -> None:
    """A transactional test starts from a flushed database: recreate the role groups, and
    forget the digests of rows pushed by an earlier test."""
    sync_roles(django_apps)
    cache.clear()


@pytest.mark.django_db(transaction=True)
def test_anonymous_socket_is_refused() -> None:
    async def scenario() -> None:
        communicator = WebsocketCommunicator(application, "/ws/board/", headers=[ORIGIN, HOST])
        connected, code = await communicator.connect()
        assert (connected, code) == (False, 4401)

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_user_without_viewer_role_is_refused() -> None:
    outsider = make_user("olga")
    cookie = _cookie(outsider)

    async def scenario() -> None:
        communicator = WebsocketCommunicator(
            application, "/ws/board/", headers=[ORIGIN, HOST, cookie]
        )
        connected, code = await communicator.connect()
        assert (connected, code) == (False, 4403)

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_wrong_origin_is_refused_even_with_a_session() -> None:
    cookie = _cookie(make_user("vera", "viewer"))

    async def scenario() -> None:
        communicator = WebsocketCommunicator(
            application, "/ws/board/", headers=[(b"origin", b"https://evil.example"), cookie]
        )
        connected, _ = await communicator.connect()
        assert connected is False

    run(scenario)


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "accepted"),
    [
        (b"http://testserver:8000", b"testserver:8000", "ws", True),
        (b"http://TestServer:8000", b"testserver:8000", "ws", True),
        (b"https://testserver", b"testserver", "wss", True),
        # Another port, or another scheme, of the same allowed host is another site.
        (b"http://testserver:8001", b"testserver:8000", "ws", False),
        (b"http://testserver", b"testserver:8000", "ws", False),
        (b"http://testserver:8000", b"testserver:8000", "wss", False),
        (b"https://testserver:443", b"testserver", "ws", False),
        # A Host outside ALLOWED_HOSTS never vouches for its own origin.
        (b"http://evil.example", b"evil.example", "ws", False),
        (b"null", b"testserver", "ws", False),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_origin_must_be_this_sites_exact_scheme_host_and_port(
    origin: bytes, host: bytes, scheme: str, accepted: bool
) -> None:
    cookie = _cookie(make_user("vera", "viewer"))

    async def scenario() -> None:
        communicator = WebsocketCommunicator(
            application, "/ws/board/", headers=[(b"origin", origin), (b"host", host), cookie]
        )
        communicator.scope["scheme"] = scheme
        connected, _ = await communicator.connect()
        assert connected is accepted
        await communicator.disconnect()

    run(scenario)


@pytest.mark.broker
@pytest.mark.django_db(transaction=True)
def test_viewer_receives_the_row_partial_after_a_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        broker_required("Redis", exc)
    stream = "dlo-live-test-stream"
    client.delete(stream)
    for i in range(4):
        client.xadd(stream, {"n": i})
    client.xgroup_create(stream, "workers", id="0")
    monkeypatch.setenv("DLO_BROKER_TEST_REDIS_URL", REDIS_URL)
    broker = make_broker(name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REDIS_URL")
    channel = make_channel(broker, address=stream, address_group="workers", dlq_address="")
    other = make_channel(
        broker,
        slug="other",
        name="Other",
        address=stream,
        address_group="nobody",
        owner_team="search",
        dlq_address="",
    )
    cookie = _cookie(make_user("vera", "viewer"))

    async def scenario() -> None:
        communicator = WebsocketCommunicator(
            application, "/ws/board/?team=payments", headers=[ORIGIN, HOST, cookie]
        )
        connected, _ = await communicator.connect()
        assert connected
        outcome = await database_sync_to_async(do_poll_broker)(broker.pk)
        assert outcome.status == "ok" and set(outcome.changed) == {channel.pk, other.pk}
        html = await communicator.receive_from(timeout=5)
        assert html.lstrip().startswith(f'<tr id="ch-{channel.pk}"')
        assert 'hx-swap-oob="true"' in html
        # Backlog 4, rendered by the page's row partial.
        assert '<td class="n" data-label="Backlog">4</td>' in html
        assert f'id="ch-{other.pk}"' not in html  # filtered to the client's team
        await communicator.disconnect()

    try:
        run(scenario)
    finally:
        client.delete(stream)


@pytest.mark.django_db(transaction=True)
def test_updates_are_coalesced_to_the_latest_row_html() -> None:
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()

    def rows(version: str) -> dict[str, Any]:
        return {
            "type": "board.rows",
            "rows": [{"id": 1, "team": "", "broker": "b", "state": "ok", "html": version}],
        }

    async def scenario() -> None:
        communicator = WebsocketCommunicator(
            application, "/ws/board/", headers=[ORIGIN, HOST, cookie]
        )
        connected, _ = await communicator.connect()
        assert connected
        await layer.group_send(BOARD_GROUP, rows("v1"))
        assert await communicator.receive_from(timeout=3) == "v1"
        await layer.group_send(BOARD_GROUP, rows("v2"))
        await layer.group_send(BOARD_GROUP, rows("v3"))
        assert await communicator.receive_from(timeout=3) == "v3"  # v2 was replaced, not sent
        assert await communicator.receive_nothing(timeout=1.5)
        await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_row_is_pushed_only_when_its_html_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from channels_registry.health import HealthState
    from channels_registry.models import ChannelHealth
    from dashboard import live

    sent: list[dict[str, Any]] = []

    class Layer:
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            sent.append(message)

    monkeypatch.setattr(live, "get_channel_layer", Layer)
    channel = make_channel(make_broker())
    health = ChannelHealth.objects.create(
        channel=channel, state=HealthState.OK, severity=10, backlog=5
    )
    assert live.push_board_rows([channel.pk]) == 1
    assert live.push_board_rows([channel.pk]) == 0  # byte-identical: nothing sent
    assert len(sent) == 1 and sent[0]["rows"][0]["id"] == channel.pk
    health.backlog = 6
    health.save()
    assert live.push_board_rows([channel.pk]) == 1
    assert '<td class="n" data-label="Backlog">6</td>' in sent[1]["rows"][0]["html"]
