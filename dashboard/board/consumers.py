"""The board's websocket: pushes changed rows (HTML for htmx out-of-band swaps).

The ASGI stack checks the Origin (AllowedHostsOriginValidator) and loads the session user
(AuthMiddlewareStack); this consumer checks the permission itself and refuses the handshake
otherwise (4401 anonymous, 4403 without the viewer permission).

Delivery at incident scale (issue 29), when every row changes at once:

1. Every pushed row goes into the process's ``BoardMirror``: the latest HTML of each row, in
   push order, each version numbered. One mirror per server process, shared by its clients, so
   a thousand clients cost one copy of the rows, not a thousand queues.
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
4. A row whose ``<tr>``, channel cell, state and DLQ flags are as the client last had them
   goes as a patch: the cells whose meaning changed (the state's evidence line, numbers,
   sparkline, drain ETA, sample), each cell's inner HTML as the server rendered and escaped
   it, in an inert comment ``<!--dlo {"patch": [id, {cell: html}]}-->`` (``row_patch``;
   ``static/dlo/board.js`` sets those cells), ~70 bytes for a row of ~1 KB. Only for a client
   known to hold the version the patch starts from: one sent over this socket (not a row its
   page loaded over HTTP before it connected, nor before a reload) and still the row's latest
   when the client's last frames were built (``PatchView``), and only to a page that said it
   applies patches (``?patch=1``). Any other client gets the whole row. A change of state,
   flags, name or team (what the page's attention and announcement rules read) always goes
   as a whole row.
5. A send that fails is logged once for all the clients it hit (with their number); each is
   told when possible (a ``stopped`` notice, then the socket closes) and the page says "live
   updates stopped" and reloads its rows. A client whose cursor fell behind what the mirror
   keeps gets a ``reload`` notice: the page reloads its rows over HTTP.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import json
import logging
import uuid
import weakref
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from dashboard.board.live import _SAMPLE_TIME, _SPARK, BOARD_GROUP, FRAME_BYTES

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
#: Group membership calls in flight per process: a thousand pages closing together must not
#: exhaust the Redis connection pool (redis-py's default is 100 connections).
LAYER_CALLS = 32
#: Row versions the mirror keeps (one per row: the channels on the board, plus brokers).
MIRROR_MAX_ROWS = 50_000
#: Frames built for one (cursor, filters) are shared by the clients at that cursor.
FRAME_MEMO_SIZE = 256
#: Failed sends within this many seconds are logged as one line.
FAILURE_LOG_WINDOW_S = 1.0
#: Close code after a failed send (4000-4999: the application's own).
CLOSE_SEND_FAILED = 4500


def notice(kind: str, **fields: Any) -> str:
    """A message that is not rows: JSON (rows are HTML, starting with ``<`` or whitespace)."""
    return json.dumps({kind: fields}, separators=(",", ":"))


def folded(payload: str) -> str:
    """A notice inside a frame of rows: an HTML comment after them (JSON of ASCII numbers and
    an ISO time, never ``-->``; hostile text never reaches a notice)."""
    return f"<!--dlo {payload}-->"


#: Where ``dashboard.board.rows.row_html`` starts a cell. Escaped text never holds ``<``, so
#: the split is exact: the head (``<tr …>``), then one part per cell.
_CELL = "\n<td"
#: The state cell: patched only when its state and flags are as before (what the page's
#: attention and announcement rules read), i.e. when only its evidence line changed.
_STATE = 1
_EVIDENCE = '<div class="evidence sub">'


def _meaning(part: str) -> str:
    """A cell as ``dashboard.board.live.row_digest`` compares it (no clock-only changes)."""
    return _SPARK.sub(r"<svg \1>", _SAMPLE_TIME.sub("", part))


def _inner(part: str) -> tuple[str, str]:
    """A cell's attributes and inner HTML (the part after ``\n<td``; the last holds ``</tr>``)."""
    head_end = part.index(">")
    return part[:head_end], part[head_end + 1 : part.rindex("</td>")]


def row_patch(pk: int, old: str, new: str) -> str | None:
    """The folded patch from row HTML ``old`` to ``new``: the inner HTML of each cell whose
    meaning changed, or None when the row must go whole: its ``<tr>`` or channel cell changed
    (the name, link, broker, team), its state or DLQ flags changed (only the state cell's
    evidence may be patched), or it is not a ``row_html`` row. Cell HTML is the server's,
    escaped as in a whole row; ``<`` and ``>`` are JSON escapes, so the comment cannot close
    early."""
    before, after = old.split(_CELL), new.split(_CELL)
    if len(before) != len(after) or len(after) <= _STATE + 2 or before[:2] != after[:2]:
        return None
    state = _STATE + 1
    if before[state].split(_EVIDENCE, 1)[0] != after[state].split(_EVIDENCE, 1)[0]:
        return None
    cells: dict[str, str] = {}
    for i in range(state, len(after)):
        if before[i] == after[i] or _meaning(before[i]) == _meaning(after[i]):
            continue
        try:
            (attrs_old, _), (attrs_new, inner) = _inner(before[i]), _inner(after[i])
        except ValueError:
            return None
        if attrs_old != attrs_new:
            return None
        cells[str(i - 1)] = inner
    body = json.dumps({"patch": [pk, cells]}, separators=(",", ":"))
    return folded(body.replace("<", "\\u003c").replace(">", "\\u003e"))


class PatchView:
    """What a client holds, for patches: versions up to ``joined`` it never got over the socket
    (its page loaded them over HTTP); its last frames were built when the mirror was at
    ``basis``, starting from cursor ``origin[0]`` (``origin[1:]``: that build's basis, variant)."""

    __slots__ = ("basis", "joined", "origin")

    def __init__(self, seq: int) -> None:
        self.joined = self.basis = seq
        self.origin: tuple[int, int, int] | None = None

    def rejoin(self, seq: int) -> None:
        """The page reloads its rows over HTTP: nothing before ``seq`` is known to it."""
        self.joined = self.basis = seq
        self.origin = None


class _Version:
    """One pushed version: a row's HTML, or a notice (JSON): a broker's sample time, which may
    ride in a frame of rows (``foldable``), or another, which travels in a frame alone. A row
    may also have a ``patch`` from the version ``base`` (its predecessor) to it."""

    __slots__ = ("base", "broker", "foldable", "is_row", "patch", "payload", "seq", "team")

    def __init__(
        self, seq: int, team: str | None, broker: str, payload: str, foldable: bool = False
    ) -> None:
        self.seq, self.team, self.broker, self.payload = seq, team, broker, payload
        self.is_row = not payload.startswith("{")
        self.foldable = foldable and not self.is_row
        self.patch: str | None = None
        self.base = 0

    def shown(self, team: str, broker: str) -> bool:
        """Whether a client filtered to ``team``/``broker`` gets it (``team`` None: any)."""
        if team and self.team is not None and self.team != team:
            return False
        return not (broker and self.broker != broker)


#: A mirror key: a row's channel id, or ("sampled", broker id) for a broker's last sample time.
Key = int | tuple[str, int]
#: A frame's text and the cursor after it.
Frame = tuple[str, int]


class BoardMirror:
    """The latest pushed version of each row in this process, oldest first (see the module)."""

    def __init__(self, max_rows: int = MIRROR_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self.rows: collections.OrderedDict[Key, _Version] = collections.OrderedDict()
        self.seq = 0
        #: Versions up to this number were evicted: a client whose cursor is below must reload.
        self.floor = 0
        self._batches: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._memo: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()

    def apply(self, batch: str, rows: Iterable[dict[str, Any]], sampled: Any = None) -> None:
        """Record a pushed batch once (every client of the process receives the same one)."""
        if batch in self._batches:
            return
        self._batches[batch] = None
        if len(self._batches) > 1024:
            self._batches.popitem(last=False)
        for row in rows:
            self._put(int(row["id"]), row["team"], row["broker"], row["html"])
        if sampled:
            payload = notice("sampled", broker=sampled["broker_id"], at=sampled["at"])
            key = ("sampled", int(sampled["broker_id"]))
            self._put(key, None, sampled["broker"], payload, foldable=True)
        while len(self.rows) > self.max_rows:
            _, oldest = self.rows.popitem(last=False)
            self.floor = oldest.seq

    def _put(
        self, key: Key, team: str | None, broker: str, payload: str, foldable: bool = False
    ) -> None:
        self.seq += 1
        version = _Version(self.seq, team, broker, payload, foldable)
        before = self.rows.get(key)
        if before is not None and before.is_row and version.is_row and isinstance(key, int):
            version.patch = row_patch(key, before.payload, payload)
            version.base = before.seq
        self.rows[key] = version
        self.rows.move_to_end(key)

    def frames(
        self, cursor: int, team: str, broker: str, view: PatchView | None = None
    ) -> tuple[list[Frame], int]:
        """Every frame due after ``cursor`` for a client with these filters, oldest first, and
        the cursor after them all (see ``_pack``). Given the client's ``view``, a row goes as
        its patch when the client holds the version the patch starts from: that version came
        over the socket (after ``view.joined``), the client's cursor passed it, and it was
        still the row's latest when the client's last frames were built (``view.basis``),
        so it was sent then or before. Without a view every row goes whole.

        Clients at the same cursor and basis share one build (its variants differ only for a
        client that joined after some patch's starting version), and every frame boundary of
        a build is remembered for the clients walking it: one frame per ack."""
        if view is not None and view.origin is not None and view.basis == self.seq:
            walked = self._memo.get(("walk", cursor, self.seq, team, broker, *view.origin))
            if walked is not None:
                return walked
        basis = view.basis if view is not None else self.seq
        joined = view.joined if view is not None else self.seq
        key = (cursor, self.seq, team, broker, basis)
        entry = self._memo.get(key)
        if entry is None:
            due = self._due(cursor)
            starts = sorted(
                v.base for v in due if v.patch is not None and v.seq > basis and v.base <= cursor
            )
            built: dict[int, tuple[list[Frame], int]] = {}
            entry = (due, starts, built)
            self._remember(key, entry)
        due, starts, built = entry
        variant = bisect.bisect_right(starts, joined)  # patches that start too early: whole rows
        result = built.get(variant)
        if result is None:
            result = built[variant] = self._pack(
                due, cursor, team, broker, lambda v: v.seq > basis and joined < v.base <= cursor
            )
            frames, end = result
            for i, (_, after) in enumerate(frames[:-1]):
                walk = ("walk", after, self.seq, team, broker, cursor, basis, variant)
                self._remember(walk, (frames[i + 1 :], end))
        if view is not None:
            view.basis, view.origin = self.seq, (cursor, basis, variant)
        return result

    def _due(self, cursor: int) -> list[_Version]:
        """The versions after ``cursor``, oldest first."""
        due: list[_Version] = []
        for k in reversed(self.rows):
            version = self.rows[k]
            if version.seq <= cursor:
                break
            due.append(version)
        due.reverse()
        return due

    @staticmethod
    def _pack(
        due: list[_Version], cursor: int, team: str, broker: str, patched: Any
    ) -> tuple[list[Frame], int]:
        """``due`` packed into frames of at most ``FRAME_BYTES`` (a row is ASCII,
        ``dashboard.board.live``, so its length is its size), each with the cursor after it. A row
        for which ``patched`` holds goes as its patch; a broker's sample time after rows rides
        in their frame (``folded``); any other notice is a frame of its own."""
        frames: list[Frame] = []
        parts: list[str] = []
        size = 0
        end = cursor
        for version in due:
            if not version.shown(team, broker):
                end = version.seq
                continue
            chosen = version.payload
            if version.patch is not None and patched(version):
                chosen = version.patch
            text = folded(chosen) if parts and version.foldable else chosen
            n = len(text)
            if parts and (not (version.is_row or version.foldable) or size + n > FRAME_BYTES):
                frames.append(("".join(parts), end))  # full, or a notice follows
                parts, size = [], 0
                text = chosen
            end = version.seq
            if version.is_row or (parts and version.foldable):
                parts.append(text)
                size += n
            else:
                frames.append((text, end))
        if parts:
            frames.append(("".join(parts), end))
        if frames:  # versions filtered out after the last frame are passed with it
            frames[-1] = (frames[-1][0], end)
        return frames, end

    def _remember(self, key: tuple[Any, ...], result: Any) -> None:
        self._memo[key] = result
        self._memo.move_to_end(key)
        while len(self._memo) > FRAME_MEMO_SIZE:
            self._memo.popitem(last=False)


MIRROR = BoardMirror()


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
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _layer_gate() -> asyncio.Semaphore:
    """The process's bound on group membership calls (one semaphore per event loop)."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(LAYER_CALLS)
    return gate


class BoardConsumer(AsyncWebsocketConsumer):
    mirror = MIRROR

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
        self.cursor = self.mirror.seq
        # Patches only to a page that applies them (``?patch=1``, ``templates/dashboard/
        # board.html``): a page of an older release reconnecting after a deploy gets whole rows.
        self.view = PatchView(self.cursor) if query.get("patch") == ["1"] else None
        self.in_flight: collections.deque[int] = collections.deque()
        self.in_flight_bytes = 0
        self.extra = 0  # this client's share of EXTRA (its bytes in flight past one frame)
        self.stopped = False
        async with _layer_gate():
            await self.channel_layer.group_add(BOARD_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "cursor"):
            return
        self.in_flight.clear()
        self._account(0)
        try:
            async with _layer_gate():
                await self.channel_layer.group_discard(BOARD_GROUP, self.channel_name)
        except Exception:  # the layer expires a member it could not drop (group_expiry)
            log.warning("live board: leaving the group failed", exc_info=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page says only ``ack N``: it has handled N more messages (``ack``: one); the
        window reopens by their bytes. Anything else is ignored."""
        if not text_data or not getattr(self, "in_flight", None):
            return
        word, _, count = text_data.partition(" ")
        if word != "ack" or (count and not (count.isdigit() and len(count) <= 5)):
            return
        for _ in range(min(int(count or 1), ACK_MAX, len(self.in_flight))):
            self.in_flight_bytes -= self.in_flight.popleft()
        self._account(self.in_flight_bytes)
        await self.flush()

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

    async def board_rows(self, event: dict[str, Any]) -> None:
        # A pusher of an older release names no batch: name it on the message, which the
        # process's clients share (a copy each, at worst: the rows are then put twice).
        batch = event.setdefault("batch", uuid.uuid4().hex)
        self.mirror.apply(batch, event["rows"], event.get("sampled"))
        await self.flush()

    async def flush(self) -> None:
        """Send what is due, as far as the window allows (see the module, steps 2 and 3):
        always one frame to a client with nothing in flight, more while they fit."""
        if self.stopped or self.cursor >= self.mirror.seq:
            return
        if self.in_flight and not self._fits(1):
            return
        if self.cursor < self.mirror.floor:
            # Versions this client still needed were evicted: its rows come over HTTP.
            self.cursor = self.mirror.seq
            if self.view is not None:
                self.view.rejoin(self.cursor)
            await self._send(notice("reload", reason="too far behind"))
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
        return True

    async def _stop(self, exc: BaseException) -> None:
        """A failed send: logged (once for all clients hit), the client told when the socket
        still takes a small message, then closed. Nothing more is sent on this socket."""
        self.stopped = True
        self.in_flight.clear()
        self._account(0)
        FAILURES.add(exc)
        try:
            await self.send(text_data=notice("stopped", reason="a live update could not be sent"))
            await self.close(code=CLOSE_SEND_FAILED)
        except Exception:  # the socket is gone: the page sees it closed and says so itself
            log.debug("live board: the stop notice could not be sent either", exc_info=True)
