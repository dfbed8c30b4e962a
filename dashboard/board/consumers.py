"""The board's websocket: pushes changed rows (HTML for htmx out-of-band swaps).

The ASGI stack checks the Origin (AllowedHostsOriginValidator) and loads the session user
(AuthMiddlewareStack); this consumer checks the permission itself and refuses the handshake
otherwise (4401 anonymous, 4403 without the viewer permission).

Delivery at incident scale (issue 29), when every row changes at once:

0. One member of the board's group per server process (``Fanout``), not one per page: it
   receives each push once from the channel layer, applies it to the mirror once and flushes
   every page of the process in turn. A page's socket has no channel on the layer of its own,
   so a push to a thousand pages is one layer message and one wake-up, not a thousand (and a
   thousand pages opening at once make one ``group_add``, not a thousand). If the layer fails,
   every page of the process is told live updates stopped (step 6); the next page to connect
   joins the group again.
1. Every pushed row goes into the process's ``BoardMirror`` (``dashboard.board.mirror``): the
   latest HTML of each row, in push order, each version numbered. One mirror per server
   process, shared by its clients, so a thousand clients cost one copy of the rows, not a
   thousand queues.
2. A client holds only a cursor: the number of the last version it was sent. Flushing sends
   the versions after it, in order, packed into frames of at most ``FRAME_BYTES``; a row
   changed twice before a client read it is sent once, as it is now (coalesced per row).
3. A window of unacknowledged bytes per client: the page acknowledges what it has handled
   (``ack N``: N more messages; a bare ``ack`` is one), in batches, and a client that falls
   behind (a phone, a slow link) gets nothing more until it does, then the latest rows. Every
   client may have one frame (``FRAME_BYTES``) in flight; up to ``WINDOW_BYTES`` when the
   process's shared allowance for the frames beyond the first (``EXTRA_WINDOW_BYTES``) has
   room, so a client is not held to one round trip per frame, yet a thousand clients that
   stop reading hold at most ``1,000 × FRAME_BYTES + EXTRA_WINDOW_BYTES`` between them. The
   server's memory is the mirror plus that bound, whatever the clients do.
   A broker's sample time rides in the frame of its rows, as an HTML comment after them
   (``<!--dlo {"sampled": …}-->``, inert to htmx; ``static/dlo/board.js`` reads it), so a
   poll costs each in-sync client one message and one acknowledgement, not two of each; a
   sample time with no rows before it is a JSON notice of its own.
4. A row whose ``<tr>``, channel cell, state and DLQ flags are as in its previous version
   goes as a patch: the cells whose meaning changed (the state's evidence line, numbers,
   sparkline, drain ETA, sample), each cell's inner HTML as the server rendered and escaped
   it, with the versions it goes from and to (``dashboard.board.versions``), in an inert
   comment ``<!--dlo {"patch": [id, {cell: html}, from, to]}-->``, ~95 bytes for a row of
   ~1 KB. The pusher computes it once per poll and sends it with the row (this mirror
   computes it only for a pusher of an older release). Every row the page holds, over HTTP
   or this socket, carries its version (``data-v``); the page applies a patch only to its
   starting version and asks for the rows it could not (``rows N,M,…``: sent whole, from this
   mirror, before anything else due). So a page gets patches from its first poll, whichever
   process rendered its rows. The server still sends the whole row to a client that fell
   behind while the version the patch starts from came and went (``PatchView``: it would
   only ask for it), and to a page that did not say it checks versions (``?patch=2``; an
   older release's page, ``?patch=1``, gets whole rows). A change of state, flags, name or
   team (what the page's attention and announcement rules read) always goes whole.
5. The fan-out hands the sockets their frames as it goes: after every ``FANOUT_YIELD_BYTES``
   framed, it yields to the event loop, so the server writes those pages' bytes out (and
   frees them) before it frames the next pages'. Framing every page before writing any held
   a thousand copies of a poll's frames at once (~100 MiB of fresh memory, paged in at each
   poll) and started the first page's bytes only after the last page's frame was built.
6. A send that fails is logged once for all the clients it hit (with their number); each is
   told when possible (a ``stopped`` notice, then the socket closes) and the page says "live
   updates stopped" and reloads its rows. A client whose cursor fell behind what the mirror
   keeps gets a ``reload`` notice: the page reloads its rows over HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
import weakref
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from dashboard.board.live import BOARD_GROUP, FRAME_BYTES
from dashboard.board.mirror import MIRROR, BoardMirror, PatchView, notice

log = logging.getLogger(__name__)

VIEW_PERMISSION = "channels_registry.view_channel"
#: Unacknowledged bytes in flight per client, at most: four full frames. Beyond the first
#: frame they come from the process's ``EXTRA_WINDOW_BYTES``.
WINDOW_BYTES = 4 * FRAME_BYTES
#: The bytes in flight beyond each client's first frame, shared by the process's clients: with
#: 1,000 clients that stopped reading, at most 256 MiB (a frame each) + 32 MiB in the server.
#: (128 MiB took the server's RSS to 550 MiB with 1,000 clients all reading a megabyte a
#: cycle, over the 512 MiB target: each frame in flight is copied into the send buffer.)
EXTRA_WINDOW_BYTES = 32 * 1024 * 1024
#: Acknowledgements the page may batch into one ``ack N`` (a bound on what one message acks).
ACK_MAX = 10_000
#: The process's group membership is renewed this often (channels_redis drops a member after
#: its ``group_expiry``, a day by default, however busy it is).
GROUP_REFRESH_S = 3600.0
#: The patch protocol a page names in its socket URL (``?patch=2``): it checks each patch's
#: starting version and asks for whole rows (``rows N,…``) where its row differs.
PATCH_PROTOCOL = "2"
#: Rows one ``rows`` request may name, and rows a client may be owed at once (beyond, the
#: page is told to reload its rows over HTTP).
ROWS_ASKED_MAX = 2000
OWED_MAX = 20_000
#: The fan-out yields to the event loop after framing this many bytes (step 5): a poll's
#: frames for ~40 pages when 1,000 rows changed (~96 KiB each), for ~450 when 100 did. Each
#: yield also lets the pages served so far acknowledge, which delays the rest: yielding
#: every MiB, 100 changed rows of 10,000 reached 1,000 pages at p50 0.10-0.12 s against
#: 0.08 s without yielding; every 4 MiB, 0.08-0.10 s, and 1,000 changed rows as fast as every
#: MiB (docs/performance.md, "Live board", sixth pass).
FANOUT_YIELD_BYTES = 4 * 1024 * 1024
#: Failed sends within this many seconds are logged as one line.
FAILURE_LOG_WINDOW_S = 1.0
#: Close code after a failed send (4000-4999: the application's own).
CLOSE_SEND_FAILED = 4500


class _FailureLog:
    """Failed sends, logged once per ``FAILURE_LOG_WINDOW_S`` with the clients they hit."""

    def __init__(self) -> None:
        self.clients = 0
        self.first = ""
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, exc: BaseException) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not None and self.loop is not loop:
            self.flush()  # counted under a loop that has gone (tests run one loop each)
        self.clients += 1
        if not self.first:
            self.first = f"{type(exc).__name__}: {exc}"[:300]
        if self.loop is None:
            self.loop = loop
            loop.call_later(FAILURE_LOG_WINDOW_S, self.flush)

    def flush(self) -> None:
        if self.clients:
            log.error(
                "live board: a send failed for %d client(s); they were told live updates "
                "stopped and reload their rows. First error: %s",
                self.clients,
                self.first,
            )
        self.clients, self.first, self.loop = 0, "", None


FAILURES = _FailureLog()


class _ExtraWindow:
    """The process's allowance for bytes in flight beyond each client's first frame."""

    def __init__(self) -> None:
        self.used = 0


EXTRA = _ExtraWindow()


class Fanout:
    """The process's one member of the board group (see the module, step 0): started by the
    first page to connect, stopped when the last one leaves. One per event loop (a server has
    one; tests run a loop each)."""

    def __init__(self, mirror: BoardMirror) -> None:
        self.mirror = mirror
        #: The pages to flush, in the order they connected (a dict as an ordered set).
        self.clients: dict[BoardConsumer, None] = {}
        self.lock = asyncio.Lock()
        self.layer: Any = None
        self.channel = ""
        self.task: asyncio.Task[None] | None = None
        #: Bytes handed to the pages' sockets so far (``BoardConsumer._send``): paces the
        #: fan-out (step 5).
        self.sent = 0

    async def join(self, client: BoardConsumer) -> None:
        """Count ``client`` among the pages, and be in the group before it is accepted (a push
        after that must reach it; it is flushed once it is ready)."""
        async with self.lock:
            self.clients[client] = None
            if self.task is not None and not self.task.done():
                return
            try:
                layer = get_channel_layer()
                channel = await layer.new_channel()
                await layer.group_add(BOARD_GROUP, channel)
            except BaseException:
                self.clients.pop(client, None)
                raise
            self.layer, self.channel = layer, channel
            self.task = asyncio.ensure_future(self._run())

    def discard(self, client: BoardConsumer) -> None:
        self.clients.pop(client, None)

    async def leave(self, client: BoardConsumer) -> None:
        """A page has gone; with the last one, the process leaves the group."""
        self.discard(client)
        async with self.lock:
            if self.clients or self.task is None:
                return
            task, self.task = self.task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            try:
                await self.layer.group_discard(BOARD_GROUP, self.channel)
            except Exception:  # the layer expires a member it could not drop (group_expiry)
                log.warning("live board: leaving the group failed", exc_info=True)

    async def _run(self) -> None:
        """Receive each push once and flush every page; renew the membership hourly. A layer
        that fails ends the loop: its pages are told (step 6) and the next page rejoins."""
        pending: asyncio.Future[Any] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(self.layer.receive(self.channel))
                done, _ = await asyncio.wait({pending}, timeout=GROUP_REFRESH_S)
                if not done:
                    await self.layer.group_add(BOARD_GROUP, self.channel)
                    continue
                message, pending = pending.result(), None
                if message.get("type") == "board.rows":
                    await self.deliver(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            clients = list(self.clients)
            log.error(
                "live board: the channel layer failed; %d client(s) were told live updates "
                "stopped and reload their rows. %s",
                len(clients),
                f"{type(exc).__name__}: {exc}"[:300],
            )
            for client in clients:
                await client.stop_quietly()
        finally:
            if pending is not None:
                pending.cancel()

    async def deliver(self, message: dict[str, Any]) -> None:
        """A push: into the mirror once, then every page flushed (a page's own failure is its
        own: ``BoardConsumer._send`` stops that page alone)."""
        # A pusher of an older release names no batch: the message is this process's own.
        self.mirror.apply(
            message.get("batch") or uuid.uuid4().hex, message["rows"], message.get("sampled")
        )
        paced = self.sent
        for client in list(self.clients):
            if client not in self.clients:  # gone while the fan-out yielded
                continue
            try:
                await client.flush()
            except Exception as exc:  # that page's, not the others': it is told and closed
                await client._stop(exc)
            if self.sent - paced >= FANOUT_YIELD_BYTES:  # let the server write them (step 5)
                await asyncio.sleep(0)
                paced = self.sent


_fanouts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Fanout] = weakref.WeakKeyDictionary()


def fanout(mirror: BoardMirror) -> Fanout:
    """This event loop's ``Fanout``."""
    loop = asyncio.get_running_loop()
    found = _fanouts.get(loop)
    if found is None:
        found = _fanouts[loop] = Fanout(mirror)
    return found


class BoardConsumer(AsyncWebsocketConsumer):
    mirror = MIRROR
    #: No channel on the layer of its own: the process's ``Fanout`` is the group's member and
    #: flushes this page (channels gives a consumer no layer when its alias names none).
    channel_layer_alias = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        """As channels' own, without its database hop before every message: channels 4.2+
        runs ``close_old_connections`` in the one thread-sensitive worker thread before each
        handler, so a poll's rows and acknowledgements for a thousand clients queued behind
        one thread (two hops per client per message). This consumer touches the database only
        through ``database_sync_to_async``, which closes old connections itself around the
        call."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await database_sync_to_async(user.has_perm)(VIEW_PERMISSION):
            await self.close(code=4403)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.filters = {k: query.get(k, [""])[0] for k in ("team", "broker")}
        self.in_flight: collections.deque[int] = collections.deque()
        self.in_flight_bytes = 0
        self.extra = 0  # this client's share of EXTRA (its bytes in flight past one frame)
        self.stopped = False
        self.flushing = asyncio.Lock()
        #: Rows the page asked for whole (its version differed from a patch's start).
        self.owed: dict[int, None] = {}
        self.ready = False  # flushed by the process's fan-out only once accepted
        # From here on every push reaches this page: its rows came over HTTP before.
        self.cursor = self.mirror.seq
        # Patches only to a page that checks their versions (``?patch=2``, ``templates/
        # dashboard/board.html``): a page of an older release (``?patch=1``, which applied a
        # patch without checking) reconnecting after a deploy gets whole rows.
        self.view = PatchView(self.cursor) if query.get("patch") == [PATCH_PROTOCOL] else None
        self.fanout = fanout(self.mirror)
        await self.fanout.join(self)
        try:
            await self.accept()
        except BaseException:
            await self.fanout.leave(self)
            raise
        self.ready = True
        await self.flush()  # what was pushed while it was being accepted

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "fanout"):
            return
        self.in_flight.clear()
        self._account(0)
        await self.fanout.leave(self)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page says ``ack N``: it has handled N more messages (``ack``: one); the window
        reopens by their bytes. Or ``rows N,M,…``: send these rows whole (a patch started from
        a version its row is not). Anything else is ignored."""
        if not text_data or not getattr(self, "ready", False):
            return
        word, _, count = text_data.partition(" ")
        if word == "rows" and self.view is not None:
            await self._asked(count)
            return
        if not self.in_flight:
            return
        if word != "ack" or (count and not (count.isdigit() and len(count) <= 5)):
            return
        for _ in range(min(int(count or 1), ACK_MAX, len(self.in_flight))):
            self.in_flight_bytes -= self.in_flight.popleft()
        self._account(self.in_flight_bytes)
        await self.flush()

    async def _asked(self, ids: str) -> None:
        """Owe the page these rows whole; too many owed, and its rows come over HTTP."""
        for part in ids.split(",", ROWS_ASKED_MAX)[:ROWS_ASKED_MAX]:
            if part.isdigit() and len(part) <= 12:
                self.owed[int(part)] = None
        if len(self.owed) > OWED_MAX:
            self.owed.clear()
            await self._reload("too many rows asked for")
            return
        await self.flush()

    async def _reload(self, reason: str) -> None:
        """Tell the page to reload its rows over HTTP: everything before now is in them."""
        self.cursor = self.mirror.seq
        if self.view is not None:
            self.view.rejoin(self.cursor)
        await self._send(notice("reload", reason=reason))

    def _owed_frames(self) -> tuple[list[tuple[str, list[int]]], bool]:
        """The rows owed, whole as this process last had them, in frames of at most
        ``FRAME_BYTES``, each with the ids it carries; and whether a row asked for is not held
        here (evicted, or never pushed through this process): the page must reload its rows.
        A row this client may not see is dropped from what is owed."""
        frames: list[tuple[str, list[int]]] = []
        parts: list[str] = []
        ids: list[int] = []
        size = 0
        missing = False
        team, broker = self.filters["team"], self.filters["broker"]
        for pk in list(self.owed):
            version = self.mirror.rows.get(pk)
            if version is None or not version.is_row or not version.shown(team, broker):
                missing = missing or version is None
                del self.owed[pk]
                continue
            n = len(version.payload)
            if parts and size + n > FRAME_BYTES:
                frames.append(("".join(parts), ids))
                parts, ids, size = [], [], 0
            parts.append(version.payload)
            ids.append(pk)
            size += n
        if parts:
            frames.append(("".join(parts), ids))
        return frames, missing

    def _account(self, in_flight: int) -> None:
        """Record ``in_flight`` bytes as this client's: its share of EXTRA follows."""
        extra = max(0, in_flight - min(FRAME_BYTES, WINDOW_BYTES))
        EXTRA.used += extra - self.extra
        self.extra = extra
        self.in_flight_bytes = in_flight

    def _fits(self, n: int) -> bool:
        """Whether a frame of ``n`` bytes may go now: always with nothing in flight; within one
        frame's bytes; or within the window while the process's allowance has room."""
        total = self.in_flight_bytes + n
        base = min(FRAME_BYTES, WINDOW_BYTES)
        if not self.in_flight or total <= base:
            return True
        if total > WINDOW_BYTES:
            return False
        return EXTRA.used + (total - base) - self.extra <= EXTRA_WINDOW_BYTES

    async def flush(self) -> None:
        """Send what is due, as far as the window allows (see the module, steps 2 and 3):
        always one frame to a client with nothing in flight, more while they fit. The
        process's fan-out and this page's acknowledgements both flush: one at a time."""
        if self.stopped or not getattr(self, "ready", False):
            return
        if self.cursor >= self.mirror.seq and not self.owed:
            return
        async with self.flushing:
            await self._flush()

    async def _flush(self) -> None:
        if self.stopped or (self.cursor >= self.mirror.seq and not self.owed):
            return
        if self.in_flight and not self._fits(1):
            return
        owed_frames, missing = self._owed_frames() if self.owed else ([], False)
        if missing:  # a row asked for is not here: the page's rows come over HTTP
            self.owed.clear()
            await self._reload("a row asked for is not held")
            return
        for text, ids in owed_frames:
            if not self._fits(len(text)) or not await self._send(text):
                return
            for pk in ids:
                self.owed.pop(pk, None)
        if self.cursor >= self.mirror.seq:
            return
        if self.cursor < self.mirror.floor:
            # Versions this client still needed were evicted: its rows come over HTTP.
            await self._reload("too far behind")
            return
        frames, end = self.mirror.frames(
            self.cursor, self.filters["team"], self.filters["broker"], self.view
        )
        if not frames:
            self.cursor = end  # nothing this client may see
        for text, after in frames:
            if not self._fits(len(text)):
                return
            if not await self._send(text):
                return
            self.cursor = after

    async def _send(self, frame: str) -> bool:
        try:
            await self.send(text_data=frame)
        except Exception as exc:  # whatever the server refused: the client must hear of it
            await self._stop(exc)
            return False
        self.in_flight.append(len(frame))
        self._account(self.in_flight_bytes + len(frame))
        self.fanout.sent += len(frame)
        return True

    async def _stop(self, exc: BaseException) -> None:
        """A failed send: logged (once for all clients hit), the client told when the socket
        still takes a small message, then closed. Nothing more is sent on this socket."""
        FAILURES.add(exc)
        await self.stop_quietly()

    async def stop_quietly(self) -> None:
        """Stop this page's live updates (logged by the caller): told when the socket still
        takes a small message, then closed; the page reloads its rows."""
        self.stopped = True
        self.in_flight.clear()
        self._account(0)
        self.fanout.discard(self)
        try:
            await self.send(text_data=notice("stopped", reason="a live update could not be sent"))
            await self.close(code=CLOSE_SEND_FAILED)
        except Exception:  # the socket is gone: the page sees it closed and says so itself
            log.debug("live board: the stop notice could not be sent either", exc_info=True)
