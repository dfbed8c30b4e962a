"""Journey 1, first leg — the on-call engineer keeps the board open; a channel's backlog grows
on the real broker with no consumer, a poll runs, and its row turns STOPPED without a reload."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from channels_registry.polling import do_poll_broker
from tests.conftest import PASSWORD, make_broker, make_channel
from tests.e2e.conftest import browser_user, off_loop

pytestmark = [pytest.mark.browser, pytest.mark.broker, pytest.mark.django_db(transaction=True)]


def live_channel(queue: str) -> Any:
    """An oncall user, a broker on the test's RabbitMQ and a channel on ``queue``, polled once."""
    browser_user("otto", "oncall")
    broker = make_broker(name="live-rabbit", url_env="DLO_BROKER_E2E_RABBITMQ_URL")
    channel = make_channel(
        broker,
        name="Live orders",
        slug="live-orders",
        address=queue,
        dlq_address="",
        poison_address="",
        dlq_strategies=[],
        alert_dlq_depth=None,
    )
    off_loop(do_poll_broker, broker.pk, force=True)
    return channel


def test_board_row_turns_stopped_live(journey: Any, rabbit: tuple[Any, str]) -> None:
    amqp, queue = rabbit
    channel = live_channel(queue)
    broker = channel.broker

    tab = journey("oncall-live")
    tab.sign_in("otto", PASSWORD)
    tab.go("/channels/")  # signing in landed on the board: leave it before counting sockets
    sockets: list[Any] = []
    tab.page.on("websocket", lambda ws: sockets.append(ws) if "/ws/board/" in ws.url else None)
    tab.go("/")
    row = tab.page.locator(f"#ch-{channel.pk}")
    assert "STOPPED" not in row.inner_text().upper()
    tab.wait_until(lambda: tab.page.evaluate("document.getElementById('board').__dloOpen"))
    # An idle socket must stay open: redis-py 8's default 5 s socket timeout used to make the
    # Redis channel layer drop every board socket that had nothing to say for 5 s.
    tab.page.wait_for_timeout(500)
    before = len(sockets)
    live = [ws for ws in sockets if not ws.is_closed()]
    tab.page.wait_for_timeout(6500)
    assert len(live) == 1 and not live[0].is_closed(), "the idle board socket was dropped"
    assert len(sockets) == before, "the board had to reconnect"

    for i in range(25):
        amqp.basic_publish("", queue, f'{{"n": {i}}}'.encode())
    off_loop(do_poll_broker, broker.pk, force=True)

    # No reload: the websocket pushes the row partial and htmx swaps it in place.
    expect(row).to_contain_text("STOPPED", ignore_case=True, timeout=10_000)
    assert "25" in row.inner_text()
    # Screen readers hear the change once, batched in the polite live region (issue 15.11).
    announce = tab.page.locator("#board-announce")
    assert announce.get_attribute("aria-live") == "polite"
    expect(announce).to_contain_text("Live orders is now Stopped", timeout=15_000)
    tab.shot("board-stopped")
    tab.check_clean()


def test_board_says_when_live_updates_are_lost_and_falls_back_to_polling(
    journey: Any, rabbit: tuple[Any, str]
) -> None:
    amqp, queue = rabbit
    channel = live_channel(queue)
    broker = channel.broker

    tab = journey("oncall-socket-lost")
    tab.sign_in("otto", PASSWORD)
    tab.go("/channels/")
    routes: list[Any] = []

    def connect(route: Any) -> None:
        # The first socket goes through; once the test drops it, every reconnect is refused.
        if routes:
            route.close(code=1011, reason="refused by the test")
            return
        routes.append(route)
        route.connect_to_server()

    tab.page.route_web_socket("**/ws/board/**", connect)
    tab.go("/")
    tab.wait_until(lambda: tab.page.evaluate("document.getElementById('board').__dloOpen"))
    banner = tab.page.locator("#live-lost")
    assert banner.is_hidden()

    routes[0].close(code=1011, reason="server went away")
    expect(banner).to_be_visible(timeout=10_000)
    expect(banner).to_contain_text("refreshing every 15 s")
    tab.shot("socket-lost")

    # The fallback: the next refresh (every 15 s) shows what a poll changed meanwhile.
    for i in range(9):
        amqp.basic_publish("", queue, f'{{"n": {i}}}'.encode())
    off_loop(do_poll_broker, broker.pk, force=True)
    row = tab.page.locator(f"#ch-{channel.pk}")
    expect(row).to_contain_text("STOPPED", ignore_case=True, timeout=25_000)
    tab.check_clean()
