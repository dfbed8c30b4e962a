"""Journey 1, first leg — the on-call engineer keeps the board open; a channel's backlog grows
on the real broker with no consumer, a poll runs, and its row turns STOPPED without a reload.
Live updates keep the keyboard's place (focus, the j/k row) and say when they stop."""

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


def watched_board(tab: Any) -> tuple[Any, list[str], list[str]]:
    """Otto signed in on the board with its socket open, and the text frames the board's
    sockets receive and send from before it opened."""
    tab.sign_in("otto", PASSWORD)
    tab.go("/channels/")  # signing in landed on the board: leave it before watching sockets
    received, sent = board_frames(tab)
    tab.go("/")
    tab.wait_until(lambda: tab.page.evaluate("document.getElementById('board').__dloOpen"))
    return tab, received, sent


def board_frames(tab: Any) -> tuple[list[str], list[str]]:
    """The text frames the page's board sockets receive and send, from now on."""
    received: list[str] = []
    sent: list[str] = []

    def watch(ws: Any) -> None:
        if "/ws/board/" in ws.url:
            ws.on("framereceived", lambda p: received.append(p if isinstance(p, str) else ""))
            ws.on("framesent", lambda p: sent.append(p if isinstance(p, str) else ""))

    tab.page.on("websocket", watch)
    return received, sent


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


def _focus(tab: Any) -> dict[str, Any]:
    """Where the keyboard focus is: its tag and the id of the board row holding it."""
    return dict(
        tab.page.evaluate(
            "() => { const a = document.activeElement; const tr = a && a.closest('tr');"
            " return {tag: a ? a.tagName : null, row: tr ? tr.id : null}; }"
        )
    )


def test_focus_and_the_j_k_row_survive_three_live_updates(
    journey: Any, rabbit: tuple[Any, str]
) -> None:
    """Issue 26.3: a pushed row replaces the one the keyboard is on; focus stays on its link
    (not <body>), the j/k row stays marked, the page does not scroll."""
    amqp, queue = rabbit
    channel = live_channel(queue)
    other = make_channel(
        channel.broker, name="Another queue", slug="another", address=f"{queue}.dlq", dlq_address=""
    )
    off_loop(do_poll_broker, channel.broker.pk, force=True)

    tab = journey("oncall-live-focus")
    tab.sign_in("otto", PASSWORD)
    tab.go("/")
    tab.wait_until(lambda: tab.page.evaluate("document.getElementById('board').__dloOpen"))
    rows = tab.page.locator("#board-rows > tr[id^='ch-']")
    ids = [rows.nth(i).get_attribute("id") for i in range(rows.count())]
    assert set(ids) == {f"ch-{channel.pk}", f"ch-{other.pk}"}
    # j walks the rows to the live channel's row; its link takes the focus.
    tab.page.keyboard.press("j")
    if ids[0] != f"ch-{channel.pk}":
        tab.page.keyboard.press("j")
    row = tab.page.locator(f"#ch-{channel.pk}")
    assert _focus(tab) == {"tag": "A", "row": f"ch-{channel.pk}"}
    assert "is-current" in (row.get_attribute("class") or "")
    scroll = tab.page.evaluate("() => [window.scrollX, window.scrollY]")

    published = 0
    for n in (3, 5, 7):
        for i in range(n):
            amqp.basic_publish("", queue, f'{{"n": {published + i}}}'.encode())
        published += n
        off_loop(do_poll_broker, channel.broker.pk, force=True)
        expect(row.locator("td[data-label='Backlog']")).to_have_text(str(published), timeout=10_000)
        assert _focus(tab) == {"tag": "A", "row": f"ch-{channel.pk}"}, f"after {published}"
        assert "is-current" in (row.get_attribute("class") or "")
    assert tab.page.evaluate("() => [window.scrollX, window.scrollY]") == scroll
    # k moves on from the kept row (the selection was not reset by the updates).
    tab.page.keyboard.press("k" if ids[0] != f"ch-{channel.pk}" else "j")
    assert _focus(tab)["row"] == f"ch-{other.pk}"
    tab.check_clean()


def test_the_page_says_when_live_updates_stop_and_reloads_its_rows(
    journey: Any, rabbit: tuple[Any, str]
) -> None:
    """Issue 29: the server could not send an update and said so (``stopped``, then close
    4500): the page shows it and reloads its rows at once, then keeps refreshing."""
    from dashboard.board.consumers import CLOSE_SEND_FAILED
    from dashboard.board.mirror import notice

    _, queue = rabbit
    live_channel(queue)
    tab = journey("oncall-live-stopped")
    tab.sign_in("otto", PASSWORD)
    tab.go("/channels/")
    routes: list[Any] = []

    def connect(route: Any) -> None:
        if routes:  # the reloaded board's socket: refused, so the banner stays
            route.close(code=1011, reason="refused by the test")
            return
        routes.append(route)
        route.connect_to_server()

    tab.page.route_web_socket("**/ws/board/**", connect)
    tab.go("/")
    tab.wait_until(lambda: tab.page.evaluate("document.getElementById('board').__dloOpen"))
    banner = tab.page.locator("#live-lost")
    assert banner.is_hidden()
    reloads: list[str] = []
    tab.page.on(
        "request",
        lambda r: (
            reloads.append(r.url) if r.headers.get("hx-request") and "/ws/" not in r.url else None
        ),
    )
    routes[0].send(notice("stopped", reason="a live update could not be sent"))
    routes[0].close(code=CLOSE_SEND_FAILED, reason="send failed")
    expect(banner).to_be_visible(timeout=10_000)
    expect(banner).to_contain_text("Live updates stopped (a live update could not be sent)")
    expect(banner).to_contain_text("Rows reloaded")
    tab.wait_until(lambda: len(reloads) >= 1)
    tab.shot("live-stopped")
    tab.check_clean()


def test_a_sample_time_in_a_frame_of_rows_moves_the_age_and_the_page_acks_once(
    journey: Any, rabbit: tuple[Any, str]
) -> None:
    """Issue 29: a poll's sample time rides after its rows as ``<!--dlo {...}-->``; the page
    moves its broker's "last sample" times from it, and acknowledges the message ("ack N")."""
    from dashboard.board.mirror import folded, notice

    _, queue = rabbit
    channel = live_channel(queue)
    tab = journey("oncall-live-folded")
    tab.sign_in("otto", PASSWORD)
    tab.go("/channels/")
    routes: list[Any] = []
    from_page: list[str] = []

    def connect(route: Any) -> None:
        server = route.connect_to_server()
        route.on_message(lambda m: (from_page.append(m), server.send(m)))
        routes.append(route)

    tab.page.route_web_socket("**/ws/board/**", connect)
    tab.go("/")
    tab.wait_until(lambda: tab.page.evaluate("document.getElementById('board').__dloOpen"))
    at = "2031-05-06T07:08:09+00:00"
    sampled = notice("sampled", broker=channel.broker.pk, at=at)
    row = tab.page.evaluate(  # the row as it is, pushed again (as a poll pushes rows)
        "id => { const r = document.getElementById(id).cloneNode(true);"
        " r.setAttribute('hx-swap-oob', 'true'); return r.outerHTML; }",
        f"ch-{channel.pk}",
    )
    routes[0].send(row + folded(sampled))
    when = tab.page.locator(f"#ch-{channel.pk} time[data-age]")
    expect(when).to_have_attribute("datetime", at, timeout=10_000)
    tab.wait_until(lambda: "ack 1" in from_page)
    tab.check_clean()


def test_a_row_patch_sets_the_cells_and_a_hostile_name_stays_text(
    journey: Any, rabbit: tuple[Any, str]
) -> None:
    """Issue 29: once the page holds a row pushed over its socket, a poll that moves only its
    numbers (and evidence) sends a patch of those cells, not the row; the page sets them, and
    the channel's hostile name, which a patch never carries, stays text."""
    amqp, queue = rabbit
    browser_user("otto", "oncall")
    broker = make_broker(name="live-rabbit", url_env="DLO_BROKER_E2E_RABBITMQ_URL")
    hostile = 'Live <img src=x onerror="window.__pwned=1"> "\'& <!--dlo {}-->'
    channel = make_channel(
        broker,
        name=hostile,
        slug="live-hostile",
        address=queue,
        dlq_address="",
        poison_address="",
        dlq_strategies=[],
        alert_dlq_depth=None,
    )
    off_loop(do_poll_broker, broker.pk, force=True)
    tab, frames, _ = watched_board(journey("oncall-live-patch"))
    row = tab.page.locator(f"#ch-{channel.pk}")
    backlog = row.locator("td[data-label='Backlog']")
    published = 0
    for n in (4, 3):  # the first poll sends the row whole (its state changes), the next a patch
        for i in range(n):
            amqp.basic_publish("", queue, f'{{"n": {published + i}}}'.encode())
        published += n
        off_loop(do_poll_broker, broker.pk, force=True)
        expect(backlog).to_have_text(str(published), timeout=10_000)
    patches = [f for f in frames if f'<!--dlo {{"patch":[{channel.pk},' in f]
    assert patches and all("<tr" not in f for f in patches), frames
    assert f'data-label="Backlog">{published}</td>' not in "".join(patches)
    expect(row.locator("td[data-label='Channel'] a")).to_have_text(hostile)
    assert row.locator("img").count() == 0
    assert tab.page.evaluate("() => window.__pwned === undefined")
    assert tab.page.locator(f"#board-rows > tr#ch-{channel.pk}").count() == 1
    tab.check_clean()


def test_a_row_loaded_over_http_is_patched_and_one_at_another_version_is_asked_for(
    journey: Any, rabbit: tuple[Any, str]
) -> None:
    """Issue 29: the page's rows carry their version (``data-v``), so the first poll after the
    page loaded, moving only numbers, goes as a patch the page applies; a row at another
    version than the patch starts from (here, changed by hand) is asked for (``rows N``) and
    comes whole, with the right numbers."""
    amqp, queue = rabbit
    channel = live_channel(queue)
    for i in range(4):
        amqp.basic_publish("", queue, f'{{"n": {i}}}'.encode())
    off_loop(do_poll_broker, channel.broker.pk, force=True)  # a new state: the row settles
    tab, received, sent = watched_board(journey("oncall-live-versions"))
    row = tab.page.locator(f"#ch-{channel.pk}")
    backlog = row.locator("td[data-label='Backlog']")
    expect(backlog).to_have_text("4")
    loaded = row.get_attribute("data-v")
    assert loaded and len(loaded) == 16

    for i in range(3):
        amqp.basic_publish("", queue, f'{{"n": {4 + i}}}'.encode())
    off_loop(do_poll_broker, channel.broker.pk, force=True)
    expect(backlog).to_have_text("7", timeout=10_000)
    patch = f'<!--dlo {{"patch":[{channel.pk},'
    assert any(patch in f and f'"{loaded}"' in f for f in received), received
    assert all("<tr" not in f for f in received if patch in f)
    assert row.get_attribute("data-v") not in (None, loaded)
    assert not [f for f in sent if f.startswith("rows")]

    row.evaluate("tr => tr.setAttribute('data-v', 'not-this-version')")
    for i in range(2):
        amqp.basic_publish("", queue, f'{{"n": {7 + i}}}'.encode())
    off_loop(do_poll_broker, channel.broker.pk, force=True)
    expect(backlog).to_have_text("9", timeout=10_000)
    assert f"rows {channel.pk}" in sent, sent
    assert any(f'<tr id="ch-{channel.pk}"' in f for f in received[-3:]), received[-3:]
    assert len(row.get_attribute("data-v") or "") == 16
    assert tab.page.locator(f"#board-rows > tr#ch-{channel.pk}").count() == 1
    tab.check_clean()


def test_d_on_the_entries_list_puts_focus_in_the_reason_box(journey: Any) -> None:
    """Issue 26.3: after ``d`` the discard preview's reason box has the focus (it was <body>,
    twelve Tabs away)."""
    from tests.e2e.screens import incident

    browser_user("otto", "oncall")
    incident()
    tab = journey("oncall-d-focus")
    tab.sign_in("otto", PASSWORD)
    tab.go("/dead-letters/list/")
    tab.page.keyboard.press("j")
    with tab.page.expect_navigation():
        tab.page.keyboard.press("d")
    assert "/dead-letters/discard/" in tab.page.url
    assert tab.page.evaluate("() => document.activeElement.name") == "action_reason"
    tab.check_clean()
