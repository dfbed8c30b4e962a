"""The board's websocket: refused for anonymous, outsiders and foreign origins; a viewer gets the
same row partial the page renders after a poll commits, coalesced per client; at incident scale
(issue 29) frames stay bounded, a slow client gets the latest rows, a failed send is told."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import uuid
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
from config.asgi import application
from dashboard.board import consumers
from dashboard.board.live import BOARD_GROUP, FRAME_BYTES
from dashboard.board.versions import row_digest, version_of
from dashboard.roles import sync_roles
from tests.conftest import (
    broker_required,
    client_for,
    make_broker,
    make_channel,
    make_user,
    unique_name,
)

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
    stream = unique_name("dlo-live-test-stream")
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


def _rows(html: dict[int, str], sampled: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "type": "board.rows",
        "batch": uuid.uuid4().hex,
        "rows": [
            {"id": pk, "team": "", "broker": "b", "state": "ok", "html": h}
            for pk, h in html.items()
        ],
    }
    if sampled:
        message["sampled"] = sampled
    return message


def _tr(pk: int, version: int, size: int = 100) -> str:
    return f'<tr id="ch-{pk}" hx-swap-oob="true"><td>v{version} {"x" * size}</td></tr>'


async def _board(cookie: tuple[bytes, bytes], path: str = "/ws/board/") -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, cookie])
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.mark.django_db(transaction=True)
def test_a_slow_client_gets_the_latest_rows_not_a_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that has not acknowledged gets nothing more; when it does, each row once, as it
    is now (rows changed 30 times meanwhile are not 30 queued frames)."""
    monkeypatch.setattr(consumers, "WINDOW_BYTES", 300)
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()

    async def scenario() -> None:
        communicator = await _board(cookie)
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 0)}))
        assert await communicator.receive_from(timeout=3) == _tr(1, 0)
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        assert await communicator.receive_from(timeout=3) == _tr(1, 1)
        # Two frames unacknowledged fill the window: the client has fallen behind.
        for version in range(2, 32):
            await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, version), 2: _tr(2, version)}))
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.send_to(text_data="ack")
        await communicator.send_to(text_data="ack")
        received = await communicator.receive_from(timeout=3)
        if received.count("<tr ") < 2:
            await communicator.send_to(text_data="ack")
            received += await communicator.receive_from(timeout=3)
        assert received == _tr(1, 31) + _tr(2, 31)  # the latest, each once
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_an_update_larger_than_a_frame_arrives_complete_in_bounded_frames() -> None:
    """1,200 rows of ~1 KB (over a megabyte, daphne's limit for one frame): every row arrives,
    once and in order, in frames of at most FRAME_BYTES, as the page acknowledges them."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    rows = {pk: _tr(pk, 1, size=1000) for pk in range(1, 1201)}
    assert sum(map(len, rows.values())) > 4 * FRAME_BYTES

    async def scenario() -> None:
        communicator = await _board(cookie)
        await layer.group_send(BOARD_GROUP, _rows(rows))
        frames = []
        while sum(f.count("<tr ") for f in frames) < len(rows):
            frames.append(await communicator.receive_from(timeout=3))
            await communicator.send_to(text_data="ack")
        assert await communicator.receive_nothing(timeout=0.5)
        assert len(frames) > 4 and all(len(f.encode()) <= FRAME_BYTES for f in frames)
        assert "".join(frames) == "".join(rows.values())
        await communicator.disconnect()

    run(scenario)


def _refusing_row_frames(app: Any) -> Any:
    """The ASGI application behind a server that refuses to send row frames (as daphne
    refused frames over its payload limit), while small notices still go through."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def refusing(message: dict[str, Any]) -> None:
            if message.get("type") == "websocket.send" and "<tr " in message.get("text", ""):
                raise RuntimeError("tried to send a message exceeding the payload limit")
            await send(message)

        await app(scope, receive, refusing)

    return wrapped


async def _told_stopped_and_closed(communicator: WebsocketCommunicator) -> None:
    """The page heard live updates stopped, then its socket closed with CLOSE_SEND_FAILED."""
    told = json.loads(await communicator.receive_from(timeout=3))
    assert told == {"stopped": {"reason": "a live update could not be sent"}}
    closed = await communicator.receive_output(timeout=3)
    assert closed == {"type": "websocket.close", "code": consumers.CLOSE_SEND_FAILED}


@pytest.mark.django_db(transaction=True)
def test_a_failed_send_is_told_to_the_page_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    app = _refusing_row_frames(application)

    async def scenario() -> None:
        clients = []
        for _ in range(2):
            communicator = WebsocketCommunicator(app, "/ws/board/", headers=[ORIGIN, HOST, cookie])
            assert (await communicator.connect())[0]
            clients.append(communicator)
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        for communicator in clients:
            await _told_stopped_and_closed(communicator)
        await asyncio.sleep(consumers.FAILURE_LOG_WINDOW_S + 0.3)
        # Nothing more goes to a stopped client.
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 2)}))
        for communicator in clients:
            assert await communicator.receive_nothing(timeout=0.3)
            await communicator.wait()

    with caplog.at_level(logging.ERROR, logger="dashboard.board.consumers"):
        run(scenario)
    failed = [r for r in caplog.records if "send failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    assert "for 2 client(s)" in failed[0].getMessage()
    assert "payload limit" in failed[0].getMessage()


def _membership(monkeypatch: pytest.MonkeyPatch, layer: Any) -> dict[str, list[str]]:
    """Record the layer's group joins and leaves for the board group."""
    calls: dict[str, list[str]] = {"add": [], "discard": []}
    for verb in calls:
        real = getattr(layer, f"group_{verb}")

        async def recorded(group: str, channel: str, real: Any = real, verb: str = verb) -> None:
            if group == BOARD_GROUP:
                calls[verb].append(channel)
            await real(group, channel)

        monkeypatch.setattr(layer, f"group_{verb}", recorded)
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_processs_pages_share_one_member_of_the_board_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three pages: one group member (one layer message per push, whatever the number of
    pages), every page gets the push; the member leaves with the last page, and the next page
    joins again."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    calls = _membership(monkeypatch, layer)
    delivered = []
    real_send = layer.send

    async def counted_send(channel: str, message: dict[str, Any]) -> None:
        if message.get("type") == "board.rows":
            delivered.append(channel)
        await real_send(channel, message)

    monkeypatch.setattr(layer, "send", counted_send)

    async def scenario() -> None:
        pages = [await _board(cookie) for _ in range(3)]
        assert len(calls["add"]) == 1
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        for page in pages:
            assert await page.receive_from(timeout=3) == _tr(1, 1)
        if type(layer).__name__ == "InMemoryChannelLayer":  # its group_send calls send
            # One layer message for the three pages (an earlier test's loop may have left
            # a member of its own behind: not this process's pages).
            assert [c for c in delivered if c in calls["add"]] == calls["add"]
        for page in pages[:2]:
            await page.disconnect()
        assert calls["discard"] == []
        await pages[2].disconnect()
        assert calls["discard"] == calls["add"]
        again = await _board(cookie)
        assert len(calls["add"]) == 2 and calls["add"][1] != calls["add"][0]
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 2)}))
        assert await again.receive_from(timeout=3) == _tr(1, 2)
        await again.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_failing_channel_layer_is_told_to_every_page_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The process's member cannot receive (Redis gone): each page hears live updates
    stopped and its socket closes (the page reloads its rows and reconnects); one log line
    names how many pages; a page connecting later joins the group anew."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    calls = _membership(monkeypatch, layer)
    real_receive = layer.receive
    broken = asyncio.Event()

    async def receive(channel: str) -> dict[str, Any]:
        message = await real_receive(channel)
        if broken.is_set():
            raise ConnectionError("Connection closed by server.")
        return message

    monkeypatch.setattr(layer, "receive", receive)

    async def scenario() -> None:
        pages = [await _board(cookie) for _ in range(2)]
        broken.set()
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        for page in pages:
            await _told_stopped_and_closed(page)
            await page.wait()
        broken.clear()
        again = await _board(cookie)
        assert len(calls["add"]) == 2
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 2)}))
        assert await again.receive_from(timeout=3) == _tr(1, 2)
        await again.disconnect()

    with caplog.at_level(logging.ERROR, logger="dashboard.board.consumers"):
        run(scenario)
    failed = [r.getMessage() for r in caplog.records if "channel layer failed" in r.getMessage()]
    assert len(failed) == 1 and "2 client(s)" in failed[0], failed
    assert "ConnectionError" in failed[0]


@pytest.mark.django_db(transaction=True)
def test_the_processs_group_membership_is_renewed_while_nothing_is_pushed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """channels_redis forgets a member after its group_expiry however long the socket lives:
    the process's member joins again every GROUP_REFRESH_S, and a push still arrives."""
    monkeypatch.setattr(consumers, "GROUP_REFRESH_S", 0.1)
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    calls = _membership(monkeypatch, layer)

    async def scenario() -> None:
        page = await _board(cookie)
        await asyncio.sleep(0.45)
        assert len(calls["add"]) >= 3 and len(set(calls["add"])) == 1
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        assert await page.receive_from(timeout=3) == _tr(1, 1)
        await page.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_brokers_sample_time_rides_in_the_frame_of_its_rows() -> None:
    """One message per poll: the sample time follows the rows as an inert HTML comment; with
    no rows before it, it is a JSON notice of its own."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    at = "2026-01-02T03:04:05+00:00"

    async def scenario() -> None:
        communicator = await _board(cookie)
        sampled = {"broker_id": 7, "broker": "b", "at": at}
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}, sampled))
        frame = await communicator.receive_from(timeout=3)
        told = json.dumps({"sampled": {"broker": 7, "at": at}}, separators=(",", ":"))
        assert frame == _tr(1, 1) + f"<!--dlo {told}-->"
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.send_to(text_data="ack")
        await layer.group_send(BOARD_GROUP, _rows({}, {**sampled, "at": at.replace("05", "09")}))
        notice = json.loads(await communicator.receive_from(timeout=3))
        assert notice == {"sampled": {"broker": 7, "at": at.replace("05", "09")}}
        await communicator.disconnect()

    run(scenario)


def _big_rows(n: int) -> dict[int, str]:
    """``n`` rows of 200 KiB: two do not fit one frame, so each is a frame of its own."""
    rows = {pk: _tr(pk, 1, size=200 * 1024) for pk in range(1, n + 1)}
    assert all(FRAME_BYTES / 2 < len(r) <= FRAME_BYTES for r in rows.values())
    return rows


@pytest.mark.django_db(transaction=True)
def test_a_client_that_does_not_ack_gets_up_to_the_window_and_no_more() -> None:
    """Several frames go before the first acknowledgement (not one round trip per frame), up
    to WINDOW_BYTES and no further; ``ack N`` reopens the window by N frames."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    rows = _big_rows(12)
    size = len(rows[1])
    fit = consumers.WINDOW_BYTES // size
    assert 1 < fit < 10

    async def scenario() -> None:
        communicator = await _board(cookie)
        await layer.group_send(BOARD_GROUP, _rows(rows))
        frames = [await communicator.receive_from(timeout=3) for _ in range(fit)]
        assert await communicator.receive_nothing(timeout=0.5)  # the window is full
        await communicator.send_to(text_data="ack 2")
        frames += [await communicator.receive_from(timeout=3) for _ in range(2)]
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.send_to(text_data=f"ack {fit}")
        while len(frames) < len(rows):
            frames.append(await communicator.receive_from(timeout=3))
        assert frames == list(rows.values())  # each row once, in order
        await communicator.send_to(text_data="ack nonsense")  # ignored, nothing breaks
        await communicator.send_to(text_data=f"ack {len(rows)}")
        assert await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_frames_past_the_first_come_from_the_processs_shared_allowance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Clients that stop reading hold one frame each plus the process's EXTRA_WINDOW_BYTES,
    whatever their number: with the allowance spent, a client gets one frame at a time; it is
    given back when clients acknowledge or leave."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    rows = _big_rows(3)
    monkeypatch.setattr(consumers, "EXTRA_WINDOW_BYTES", len(rows[1]))  # < 2 frames' extra
    assert consumers.EXTRA.used == 0

    async def scenario() -> None:
        first, second = await _board(cookie), await _board(cookie)
        await layer.group_send(BOARD_GROUP, _rows(rows))
        # The first client to flush takes the allowance (two frames); the other gets one.
        got = {}
        for name, communicator in (("first", first), ("second", second)):
            got[name] = [await communicator.receive_from(timeout=3)]
            while not await communicator.receive_nothing(timeout=0.5):
                got[name].append(await communicator.receive_from(timeout=3))
        assert sorted(len(frames) for frames in got.values()) == [1, 2]
        assert consumers.EXTRA.used == 2 * len(rows[1]) - FRAME_BYTES
        behind = first if len(got["first"]) == 1 else second
        await (second if behind is first else first).disconnect()  # gives its share back
        assert consumers.EXTRA.used == 0
        await behind.send_to(text_data="ack")
        assert await behind.receive_from(timeout=3) == rows[2]
        assert await behind.receive_from(timeout=3) == rows[3]
        await behind.disconnect()
        assert consumers.EXTRA.used == 0

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_board_messages_skip_channels_database_hop(monkeypatch: pytest.MonkeyPatch) -> None:
    """channels runs ``close_old_connections`` in its one thread-sensitive thread before every
    handler; a poll's rows for a thousand clients (and their acknowledgements) queued there.
    The board consumer, which uses the database only through ``database_sync_to_async``, skips
    it."""
    import channels.consumer

    hops = []
    real = channels.consumer.aclose_old_connections

    async def counted() -> None:
        hops.append(1)
        await real()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()

    async def scenario() -> None:
        communicator = await _board(cookie)
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        assert await communicator.receive_from(timeout=3) == _tr(1, 1)
        await communicator.send_to(text_data="ack")
        await layer.group_send(BOARD_GROUP, _rows({1: _tr(1, 2)}))
        assert await communicator.receive_from(timeout=3) == _tr(1, 2)
        await communicator.disconnect()

    run(scenario)
    assert hops == []


@pytest.mark.django_db(transaction=True)
def test_a_row_is_pushed_only_when_its_html_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from channels_registry.health import HealthState
    from channels_registry.models import ChannelHealth
    from dashboard.board import live

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


@pytest.mark.django_db(transaction=True)
def test_a_row_is_not_pushed_for_the_clock_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A later sample time and a sparkline redrawn for a later hour, with the same values, do
    not push the row; the broker's sample time goes once, as ``sampled``."""
    from channels_registry.health import HealthState
    from channels_registry.models import ChannelHealth
    from dashboard.board import live

    sent: list[dict[str, Any]] = []

    class Layer:
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            sent.append(message)

    monkeypatch.setattr(live, "get_channel_layer", Layer)
    channel = make_channel(make_broker())
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    minute = now.replace(second=0).timestamp()
    health = ChannelHealth.objects.create(
        channel=channel,
        state=HealthState.OK,
        severity=10,
        backlog=5,
        last_sample_at=now,
        spark=[[minute - 120, 5], [minute - 60, 5]],
    )
    assert live.push_board_rows([channel.pk]) == 1
    health.last_sample_at = now + dt.timedelta(seconds=63)
    health.spark = [[minute - 120, 5], [minute - 60, 5], [minute, 5]]
    health.save()
    later = health.last_sample_at
    assert live.push_board_rows([channel.pk], (channel.broker.pk, channel.broker.name, later)) == 0
    assert sent[-1]["rows"] == []
    assert sent[-1]["sampled"] == {
        "broker_id": channel.broker.pk,
        "broker": channel.broker.name,
        "at": later.isoformat(),
    }
    health.spark = [[minute - 120, 5], [minute - 60, 5], [minute, 9]]  # the values moved
    health.save()
    assert live.push_board_rows([channel.pk]) == 1


def test_a_poll_marks_a_row_changed_by_its_values_not_by_the_minute() -> None:
    """A new sparkline point each minute with the same backlog is not a change of the row (it
    pushed every row of the board once a minute); a new value is."""
    from channels_registry.models import ChannelHealth
    from channels_registry.polling import _display_key

    before = ChannelHealth(state="ok", backlog=5, spark=[[60, 5], [120, 5]])
    later = ChannelHealth(state="ok", backlog=5, spark=[[60, 5], [120, 5], [180, 5]])
    moved = ChannelHealth(state="ok", backlog=5, spark=[[60, 5], [120, 5], [180, 9]])
    assert _display_key(later) == _display_key(before)
    assert _display_key(moved) != _display_key(before)


@pytest.mark.django_db(transaction=True)
def test_a_message_of_an_older_pusher_without_a_batch_id_still_arrives() -> None:
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()

    async def scenario() -> None:
        communicator = await _board(cookie)
        message = _rows({1: _tr(1, 1)})
        del message["batch"]
        await layer.group_send(BOARD_GROUP, message)
        assert await communicator.receive_from(timeout=3) == _tr(1, 1)
        await communicator.disconnect()

    run(scenario)


def _board_row(pk: int, backlog: int) -> str:
    """A row shaped as ``dashboard.board.rows.row_html`` renders it (a name that needed
    escaping), with its version."""
    head = f'\n<tr id="ch-{pk}" class="row-ok"'
    body = (
        f'<td data-label="Channel"><a href="/channels/c{pk}/">C &lt;img&gt; {pk}</a></td>\n'
        '<td data-label="State"><span class="state state-ok">OK</span></td>\n'
        f'<td class="n" data-label="Backlog">{backlog}</td>\n'
        "</tr>\n"
    )
    return f'{head} data-v="{row_digest(head + ">" + body)}" hx-swap-oob="true">\n{body}'


def _patch(pk: int, backlog: int, start: int | None = None) -> str:
    before = _board_row(pk, backlog - 1 if start is None else start)
    v0, v1 = version_of(before), version_of(_board_row(pk, backlog))
    return f'<!--dlo {{"patch":[{pk},{{"2":"{backlog}"}},"{v0}","{v1}"]}}-->'


@pytest.mark.django_db(transaction=True)
def test_a_row_goes_as_a_patch_to_a_page_that_checks_versions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29: a row whose numbers moved goes as a patch of those cells, naming the version
    it starts from, to a page that checks it (``?patch=2``), also to one that connected after
    that version (its row came over HTTP, with the version in it); whole to a client that fell
    behind while the version the patch starts from came and went, and whole to a page of an
    older release (``?patch=1`` applied patches without checking)."""
    monkeypatch.setattr(consumers, "WINDOW_BYTES", 50)  # one patch in flight fills it
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    pk = 9001

    async def push(backlog: int) -> None:
        await layer.group_send(BOARD_GROUP, _rows({pk: _board_row(pk, backlog)}))

    async def received(communicator: WebsocketCommunicator, ack: bool = True) -> str:
        frame = await communicator.receive_from(timeout=3)
        if ack:
            await communicator.send_to(text_data="ack")
        return str(frame)

    async def scenario() -> None:
        early = await _board(cookie, "/ws/board/?patch=2")
        older = await _board(cookie, "/ws/board/?patch=1")  # an older release's page
        await push(1)
        assert await received(early) == _board_row(pk, 1)
        assert await received(older) == _board_row(pk, 1)
        late = await _board(cookie, "/ws/board/?patch=2")  # connects after version 1
        await push(2)
        assert await received(early) == _patch(pk, 2)
        assert await received(late) == _patch(pk, 2)  # its page holds version 1 from HTTP
        assert await received(older) == _board_row(pk, 2)
        await push(3)
        assert await received(late) == _patch(pk, 3)  # it was sent version 2
        assert await received(early, ack=False) == _patch(pk, 3)
        await push(4)  # early is behind (nothing acknowledged): version 4 is not sent to it
        assert await received(late) == _patch(pk, 4)
        assert await early.receive_nothing(timeout=0.3)
        await push(5)
        assert await received(late) == _patch(pk, 5)
        await early.send_to(text_data="ack")
        assert await received(early) == _board_row(pk, 5)  # it never had version 4
        assert await received(older) == _board_row(pk, 3)  # sent before 4 came: one in flight
        assert await received(older) == _board_row(pk, 5)  # then its latest, whole
        for communicator in (early, late, older):
            assert await communicator.receive_nothing(timeout=0.3)
            await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_server_process_started_after_a_version_still_sends_the_pushers_patch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29: the pusher computes the patch from the version it pushed last and sends it
    with the row, so a process whose mirror never held that version (started after it, as
    after a deploy) sends the patch, not the whole row, to a page that checks versions."""
    monkeypatch.setattr(consumers.BoardConsumer, "mirror", consumers.BoardMirror())
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    pk = 9002
    message = _rows({pk: _board_row(pk, 8)})
    message["rows"][0]["patch"] = _patch(pk, 8, start=7)

    async def scenario() -> None:
        checking = await _board(cookie, "/ws/board/?patch=2")
        older = await _board(cookie, "/ws/board/?patch=1")
        await layer.group_send(BOARD_GROUP, message)
        assert await checking.receive_from(timeout=3) == _patch(pk, 8, start=7)
        assert await older.receive_from(timeout=3) == _board_row(pk, 8)
        for communicator in (checking, older):
            await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_a_page_whose_row_is_another_version_gets_it_whole_when_it_asks() -> None:
    """Issue 29: the page found its row at another version than a patch starts from and asks
    for it (``rows N,M``): it gets this process's latest version whole, in bounded frames;
    rows it may not see and junk are ignored; a row the process does not hold makes the page
    reload its rows; a page that takes no patches cannot ask."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    message = _rows({9003: _board_row(9003, 1), 9004: _board_row(9004, 1)})
    message["rows"][0]["team"], message["rows"][1]["team"] = "payments", "search"
    later = _rows({9003: _board_row(9003, 2)})
    later["rows"][0]["team"] = "payments"

    async def scenario() -> None:
        page = await _board(cookie, "/ws/board/?patch=2&team=payments")
        older = await _board(cookie, "/ws/board/?patch=1")
        await layer.group_send(BOARD_GROUP, message)
        assert await page.receive_from(timeout=3) == _board_row(9003, 1)  # 9004: not its team
        await page.send_to(text_data="ack")
        assert await older.receive_from(timeout=3) == _board_row(9003, 1) + _board_row(9004, 1)
        await older.send_to(text_data="ack")
        await layer.group_send(BOARD_GROUP, later)
        assert await page.receive_from(timeout=3) == _patch(9003, 2)
        await page.send_to(text_data="ack")
        await older.receive_from(timeout=3)
        await older.send_to(text_data="ack")
        await page.send_to(text_data="rows 9003,9004,x,-1,9003")
        assert await page.receive_from(timeout=3) == _board_row(9003, 2)
        assert await page.receive_nothing(timeout=0.3)
        await page.send_to(text_data="ack")
        # A row this process does not hold (evicted, or never pushed through it): the page
        # reloads its rows over HTTP rather than keep a row nobody will send.
        await page.send_to(text_data="rows 12345")
        told = json.loads(await page.receive_from(timeout=3))
        assert told == {"reload": {"reason": "a row asked for is not held"}}
        await page.send_to(text_data="ack")
        await older.send_to(text_data="rows 9003")
        assert await older.receive_nothing(timeout=0.3)
        for communicator in (page, older):
            await communicator.disconnect()

    run(scenario)


def test_a_page_leaving_while_another_is_being_accepted_keeps_the_processs_member() -> None:
    """The process counts a page from the moment it starts joining (before it is accepted), so
    the last accepted page leaving then does not take the group away from the page being
    accepted: a push still reaches it."""
    flushed: list[str] = []

    class Page:
        def __init__(self, name: str) -> None:
            self.name = name

        async def flush(self) -> None:
            flushed.append(self.name)

    async def scenario() -> None:
        fan = consumers.Fanout(consumers.BoardMirror())
        leaving, arriving = Page("leaving"), Page("arriving")
        await fan.join(leaving)  # type: ignore[arg-type]
        await fan.join(arriving)  # type: ignore[arg-type]  # still being accepted
        await fan.leave(leaving)  # type: ignore[arg-type]
        assert fan.task is not None and not fan.task.done()
        await get_channel_layer().group_send(BOARD_GROUP, _rows({1: _tr(1, 1)}))
        for _ in range(50):
            if flushed:
                break
            await asyncio.sleep(0.02)
        assert flushed == ["arriving"]
        await fan.leave(arriving)  # type: ignore[arg-type]
        assert fan.task is None

    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_the_fan_out_hands_pages_their_frames_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past FANOUT_YIELD_BYTES framed, the fan-out yields to the event loop, so the first pages'
    frames are out (written, freed) while the next pages' are framed, not all held until the
    last is built. A page that leaves meanwhile is skipped; every other page gets the rows."""
    cookie = _cookie(make_user("vera", "viewer"))
    layer = get_channel_layer()
    rows = {pk: _tr(pk, 1, size=500) for pk in range(1, 5)}
    size = len("".join(rows.values()))
    monkeypatch.setattr(consumers, "FANOUT_YIELD_BYTES", size)  # a yield after each page

    async def scenario() -> None:
        pages = [await _board(cookie) for _ in range(5)]
        seen: list[int] = []  # pages holding their frame, at each turn of the loop

        async def watch() -> None:
            for _ in range(2000):  # bounded: the fan-out takes a few turns
                served = sum(not page.output_queue.empty() for page in pages[:4])
                seen.append(served)
                if served == 1 and len(pages) == 5:
                    await pages.pop().disconnect()  # leaves while the fan-out yields
                if served == 4:
                    return
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        await layer.group_send(BOARD_GROUP, _rows(rows))
        await asyncio.wait_for(watcher, 5)
        assert any(0 < served < 4 for served in seen), seen  # some out before the last built
        for page in pages:
            assert await page.receive_from(timeout=3) == "".join(rows.values())
            await page.disconnect()

    run(scenario)
