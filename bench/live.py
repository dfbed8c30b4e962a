"""Live board benchmark (hand-run, not a test): ``.venv/bin/python -m bench.live``.

What it measures: the time from a poll's commit to the moment each of ``BENCH_CLIENTS``
authenticated websocket clients of ``/ws/board/`` has received the updated rows of
``BENCH_CHANNELS`` channels (``BENCH_CHANGED`` of them changing per poll), the bytes each client
received per cycle, and the resident memory of the server process.

1. A fresh PostgreSQL database (``bench_live_<run>``), migrated; a viewer user and one Django
   session per client (``SessionStore``, the cookie a browser would hold); one broker and
   1,000 channels.
2. The server is a real ASGI process: ``daphne config.asgi:application`` on loopback, with
   ``REDIS_URL=redis://127.0.0.1:6379/5`` so the channel layer (channels_redis) carries the
   pushes from this process to it.
3. Clients: a minimal RFC 6455 client on asyncio (the venv has no ``websockets`` or
   ``aiohttp``; adding one only for a benchmark is not worth a locked dependency). Each
   client logs in by its session cookie, sends an allowed Origin, answers pings, acknowledges
   the messages it handled as the page does (``static/dlo/board.js``: ``ack N`` when it has
   read all that has arrived, or at once past 256 KiB; the server keeps at most a window of
   unacknowledged bytes in flight per client), and records the receipt time and the poll cycle
   of every row. Messages that are not rows (JSON notices: "sampled", "reload", "stopped")
   are counted by kind. A client takes patches (``?patch=2``) without checking their starting
   version: it holds no HTTP rows; the page's rows carry the version the push starts from
   (``tests/dashboard/test_board_rows.py``), and a row at another version costs the page one
   ``rows N`` request (``tests/e2e/test_live_board.py``).
   The client process stands in for a thousand browsers, each with its own CPU, memory and
   garbage collector, so it keeps its own work off the receipt times: after the handshake
   the kernel reads each socket into one reused buffer per client (``_Frames``, no copy per
   read, the buffer touched at connect); a whole message is timed, acknowledged and kept,
   and its rows are read out only when the clients are idle (``Backlog``, bounded); and what
   connecting made is frozen out of the process's collections, and its heap keeps what it
   frees (``_keep_heap``). (Parsing a thousand 96 KiB messages where they arrived, paging
   the copies in again at every poll and the collections delayed the pages read after them
   by 0.2-0.5 s a poll.)
   The bench's Redis database is emptied first (``empty_redis``).
4. The poller: the real ``do_poll_broker`` (samples, health, one transaction, push after
   commit through ``dashboard.board.live.push_board_rows``) with the adapter replaced by a synthetic
   one, so no broker is involved and every cycle changes ``BENCH_CHANGED`` rows (in-flight =
   the cycle number, which the clients read back from the row HTML as today's page renders
   it: the cell ``data-label="In flight">N</td>``, or from a row patch: cell ``"3":"N"``).
   The commit time is the moment ``push_board_rows`` is called (Django calls it right after
   the commit).
5. Latency per row = receipt - commit of that row's cycle; p50/p95/max over all rows of all
   clients, and how many of the expected rows arrived (a row superseded before a slow client
   read it arrives once, at its latest cycle: counted as "superseded", not received). RSS:
   ``VmRSS`` of the server process, sampled every 0.5 s. The server log is scanned for
   tracebacks and errors.

Environment: ``BENCH_CLIENTS`` (200), ``BENCH_CHANNELS`` (1,000), ``BENCH_CHANGED`` (all; e.g.
100 for 1 % of 10,000), ``BENCH_CYCLES`` (8), ``BENCH_INTERVAL_S`` (3), ``BENCH_GRACE_S`` (10:
listening after the last poll), ``BENCH_WARMUP`` (0: polls before the measured ones, their
rows reported as unmatched) and ``BENCH_SETTLE_S`` (15: the pause after them),
``BENCH_PROFILE`` (a path: the server runs under cProfile and
writes its profile there), ``BENCH_CLIENT_PROFILE`` (the same for each client process) and
``BENCH_CLIENT_PROCS`` (1: processes the clients are spread over). The report ends with the
CPU seconds the server, the client processes and the poller used during the polls.

Note: with redis-py 8 (its socket timeout now defaults to 5 s) channels_redis' blocking
receive times out on a socket idle for 5 s and the server closes the websocket with 1011; a
longer interval shows it as client errors (the fix is ``socket_timeout: None`` in the channel
layer's host config). Everything is dropped afterwards. Loopback
only; every loop and wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import ctypes
import gc
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "200"))
CHANNELS = int(os.environ.get("BENCH_CHANNELS", "1000"))
CHANGED = int(os.environ.get("BENCH_CHANGED", str(CHANNELS)))
CYCLES = int(os.environ.get("BENCH_CYCLES", "8"))
# Below 5 s on purpose: see the note on channels_redis and redis-py 8 in the module docstring.
INTERVAL_S = float(os.environ.get("BENCH_INTERVAL_S", "3"))
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
#: How long the clients keep listening after the last poll (a server behind catches up).
GRACE_S = float(os.environ.get("BENCH_GRACE_S", "10"))
#: Polls after the clients connected that are not measured (the server's first poll finds
#: its process's mirror empty and sends whole rows: ``dashboard.board.consumers``), then a pause.
WARMUP = int(os.environ.get("BENCH_WARMUP", "0"))
SETTLE_S = float(os.environ.get("BENCH_SETTLE_S", "15"))
#: A path: the server runs under cProfile and writes its profile there when it stops.
PROFILE = os.environ.get("BENCH_PROFILE", "")
#: The patch protocol the clients name (``?patch=``): 2 today; 1 to measure a release before
#: versioned rows with this bench.
PATCH = os.environ.get("BENCH_PATCH", "2")
#: A path: each client process runs under cProfile and writes its profile there (``.PID``).
CLIENT_PROFILE = os.environ.get("BENCH_CLIENT_PROFILE", "")
#: Processes the clients are spread over (a thousand browsers each read their own socket;
#: one Python process reading for all of them queues each receipt behind the others').
CLIENT_PROCS = max(1, int(os.environ.get("BENCH_CLIENT_PROCS", "1")))
#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
RUN = uuid.uuid4().hex[:8]
DB = f"bench_live_{RUN}"
HOST = "127.0.0.1"

#: The in-flight cell of a row as ``dashboard.board.rows`` renders it: the moving rows show the
#: cycle number there (every other row shows 0); in a row patch (``dashboard.board.consumers``
#: ``row_patch``) it is cell 3.
_MOVING = re.compile(rb'data-label="In flight">([1-9]\d{0,3})</td>')
#: The in-flight cell of a row patch (``"3"``: the cell's index; a key is always a cell's
#: index in a patch, as a ``"`` inside a cell's HTML is escaped in the JSON).
_PATCHED = re.compile(rb'"3":"([1-9]\d{0,3})"')


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def _server_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=PG_ADMIN.rsplit("/", 1)[0] + "/" + DB,
        REDIS_URL=REDIS_URL,
        DEBUG="0",
        ALLOWED_HOSTS=HOST,
        LOG_LEVEL="WARNING",
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    env.pop("CELERY_BROKER_URL", None)
    return env


def empty_redis() -> None:
    """Empty the bench's Redis database (``BENCH_REDIS_URL``, db 5 by default): the channel
    layer's group would still hold the members of earlier runs' server processes (a killed
    daphne never leaves it; channels_redis forgets a member after a day), each sent a copy of
    every push, and the cache the last pushed versions of rows whose ids the new database
    reuses."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
    try:
        client.flushdb()
    finally:
        client.close()


def setup_django() -> None:
    empty_redis()
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ.update(_server_env())
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drop_database() -> None:
    from django.db import connections

    connections.close_all()
    with _pg() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


# --- data --------------------------------------------------------------------------------------


def make_data() -> tuple[int, list[str]]:
    """One viewer, CLIENTS sessions, one broker, CHANNELS channels; returns (broker id, keys)."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import Group, User
    from django.contrib.sessions.backends.db import SessionStore

    from bench.fixtures import bench_channels

    user = User.objects.create_user("bench-viewer", password=uuid.uuid4().hex)
    user.groups.add(Group.objects.get(name="viewer"))
    keys = []
    for _ in range(CLIENTS):
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        assert session.session_key is not None
        keys.append(session.session_key)
    broker = bench_channels("bench-live", CHANNELS, lambda i: {"alert_lag_messages": 10_000})
    return broker.pk, keys


class SyntheticAdapter:
    """Stands in for a broker: every address exists; the first CHANGED channels report
    in-flight = the current cycle, so exactly those rows change (and are pushed) each cycle."""

    def __init__(self, cycle: list[int]) -> None:
        self.cycle = cycle

    def poll(self, addresses: Any) -> Any:
        from brokers.base import ChannelStats, PollResult

        stats = {}
        for address in addresses:
            index = int(address.name.split(".")[1]) if address.name.count(".") == 1 else -1
            moving = 0 <= index < CHANGED
            stats[address] = ChannelStats(
                address=address,
                # The other rows are quiet (IDLE: nothing waiting, no traffic), so nothing
                # in them moves; a waiting backlog with no acks would be STALLED, whose
                # evidence names the window's span and so changes each poll until it is full.
                backlog=(1000 + index if moving else 0) if address.group else None,
                in_flight=self.cycle[0] if moving and address.group else 0,
                retained=77_777 if not address.group else 2000,
                consumers=2,
                active_consumers=2,
                # Rates only on the moving rows: a rate on every row would move every row's
                # lag estimate (backlog / ack rate) with the poll's timing.
                produced=100 * self.cycle[0] if moving else 0,
                acked=100 * self.cycle[0] if moving else 0,
            )
        return PollResult(stats, round_trips=1, duration_s=0.001)

    def inspect(self, addresses: Any) -> dict[Any, Any]:
        return {}


# --- the server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/PID/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(port: int, log: Any) -> subprocess.Popen[bytes]:
    profile = ["-m", "cProfile", "-o", PROFILE] if PROFILE else []
    proc = subprocess.Popen(
        [sys.executable, *profile, "-m", "daphne", "-b", HOST, "-p", str(port)]
        + ["config.asgi:application"],
        env=_server_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("daphne did not listen within 60 s")


# --- a minimal websocket client (RFC 6455, client side) --------------------------------------


class Backlog:
    """The messages a client process has read and not yet parsed, with their receipt times
    (see ``WsClient.message``): parsed once no message has arrived for ``IDLE_S`` (between
    polls), or at once past ``MAX_BYTES`` (the bound on what it holds)."""

    IDLE_S = 0.3
    MAX_BYTES = 256 * 1024 * 1024

    def __init__(self) -> None:
        self.items: collections.deque[tuple[WsClient, float, bytes]] = collections.deque()
        self.bytes = 0
        self.last = 0.0

    def add(self, client: WsClient, now: float, data: bytes) -> None:
        self.items.append((client, now, data))
        self.bytes += len(data)
        self.last = now
        if self.bytes > self.MAX_BYTES:
            self.parse()

    def parse(self) -> None:
        while self.items:
            client, now, data = self.items.popleft()
            client.parse(now, data)
        self.bytes = 0

    async def run(self) -> None:
        """Parse whenever the clients are idle; until cancelled."""
        while True:
            await asyncio.sleep(self.IDLE_S / 2)
            if self.items and time.time() - self.last >= self.IDLE_S:
                self.parse()


BACKLOG = Backlog()


class WsClient:
    """One page's socket. The handshake goes through asyncio streams; then ``_Frames`` reads
    the frames in place (no copy per read, one per whole message, kept for ``Backlog``: a
    thousand pages' hundred megabytes per cycle go through this one process, and the stream's
    three copies per message delayed the receipt times of the pages read after them)."""

    def __init__(self, port: int, session_key: str) -> None:
        self.port, self.session_key = port, session_key
        self.received: list[tuple[float, int, int]] = []  # (time, cycle, rows)
        self.messages = 0
        self.bytes = 0
        self.notices: dict[str, int] = {}
        self.error = ""
        self.unacked = 0
        self.unacked_bytes = 0
        self.ack_due = False
        self.frames: _Frames | None = None
        self.stream: tuple[Any, Any] | None = None

    async def connect(self) -> None:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, self.port), 10)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /ws/board/?patch={PATCH} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
            "Upgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: http://{HOST}:{self.port}\r\nCookie: sessionid={self.session_key}\r\n\r\n"
        )
        writer.write(request.encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            writer.close()
            raise RuntimeError(f"handshake refused: {head[:80]!r}")
        # What arrived after the handshake is the first frames' start: handed over.
        leftover = bytes(reader._buffer)  # noqa: SLF001 - the stream is not read again
        self.frames = _Frames(self, writer.transport, leftover)
        # Kept: a stream writer closes its transport when it is collected.
        self.stream = (reader, writer)

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x80 | opcode])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        assert self.frames is not None
        self.frames.transport.write(header + mask + masked)

    def message(
        self, opcode: int, buf: bytes | bytearray, start: int, end: int, now: float
    ) -> None:
        """A whole message, ``buf[start:end]``, read at ``now``: answered (ping, close),
        acknowledged, and kept for ``parse`` with its time. Reading the rows out of it waits
        until the clients are idle (``Backlog``): a thousand pages' parsing in this one process
        would otherwise delay the receipt of the pages read after them."""
        if opcode == 0x9:
            self._send(0xA, bytes(buf[start:end]))
            return
        if opcode == 0xA:
            return
        if opcode == 0x8:
            self.error = f"closed by server: {bytes(buf[start : start + 2]).hex()}"
            assert self.frames is not None
            self.frames.transport.close()
            return
        n = end - start
        self.messages += 1
        self.bytes += n
        self._ack(n)
        BACKLOG.add(self, now, bytes(buf[start:end]))

    def parse(self, now: float, data: bytes) -> None:
        """The rows of each cycle in a message read at ``now``, whole or as patches (a message
        holds one cycle, or a few when a client fell behind and rows were coalesced)."""
        if data[:1] == b"{":
            kind = data[2:20].split(b'"', 1)[0].decode("ascii", "replace")
            self.notices[kind] = self.notices.get(kind, 0) + 1
            return
        folded = data.count(b'<!--dlo {"sampled"')  # a sample time after the rows
        if folded:
            self.notices["sampled in rows"] = self.notices.get("sampled in rows", 0) + folded
        cycles = collections.Counter(_PATCHED.findall(data))
        if cycles:
            self.notices["row patches"] = self.notices.get("row patches", 0) + cycles.total()
        if b"<tr " in data:
            cycles.update(_MOVING.findall(data))
        for cycle, rows in cycles.items():
            if int(cycle) <= WARMUP + CYCLES:
                self.received.append((now, int(cycle), rows))

    async def listen(self) -> None:
        """Until the socket closes or this is cancelled (no ``wait_for`` here: on Python 3.11
        it can swallow the cancel)."""
        assert self.frames is not None
        await asyncio.shield(self.frames.closed)

    def _ack(self, size: int) -> None:
        """As the page does: at once past 256 KiB, else when this client waits for more
        (``call_soon`` runs once the reads at hand are handled: all that arrived has been)."""
        self.unacked += 1
        self.unacked_bytes += size
        if self.unacked_bytes >= 256 * 1024:
            self._send_ack()
        elif not self.ack_due:
            self.ack_due = True
            asyncio.get_running_loop().call_soon(self._send_ack)

    def _send_ack(self) -> None:
        self.ack_due = False
        if self.unacked and self.frames is not None and not self.frames.transport.is_closing():
            self._send(0x1, b"ack %d" % self.unacked)
        self.unacked = self.unacked_bytes = 0

    async def close(self) -> None:
        if self.frames is None or self.frames.transport.is_closing():
            return
        with contextlib.suppress(Exception):
            self._send(0x8, struct.pack("!H", 1000))
            self.frames.transport.close()
            await asyncio.wait_for(asyncio.shield(self.frames.closed), 2)


class _Frames(asyncio.BufferedProtocol):
    """A client's socket after the handshake: the kernel reads into one buffer per client
    (``recv_into``), whole messages are handed to ``WsClient.message`` where they lie, and the
    buffer is reused (a message longer than it grows it). Servers do not mask, nor (daphne)
    fragment; both are handled anyway, by copying."""

    def __init__(self, client: WsClient, transport: Any, leftover: bytes) -> None:
        self.client = client
        self.transport = transport
        # Touched now, as a page's memory is its own: left to the first poll, the
        # thousand buffers' page faults (~24,000) in this one process delayed every page
        # read after them.
        self.buf = bytearray(b"\0") * (1 << 18)
        self.start = self.end = 0
        self.parts: list[bytes] = []  # a fragmented message's frames so far
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        transport.set_protocol(self)
        if leftover:
            self.buf[: len(leftover)] = leftover
            self.buffer_updated(len(leftover))
        transport.resume_reading()  # the stream may have paused it

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.end == len(self.buf):  # full: move the partial message to the front, or grow
            if self.start:
                pending = self.end - self.start
                self.buf[:pending] = self.buf[self.start : self.end]
                self.start, self.end = 0, pending
            else:
                self.buf.extend(bytes(len(self.buf)))
        return memoryview(self.buf)[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        now = time.time()
        buf = self.buf
        while True:
            start, avail = self.start, self.end - self.start
            if avail < 2:
                break
            b1, b2 = buf[start], buf[start + 1]
            n, head = b2 & 0x7F, 2
            if n == 126:
                if avail < 4:
                    break
                n, head = int.from_bytes(buf[start + 2 : start + 4], "big"), 4
            elif n == 127:
                if avail < 10:
                    break
                n, head = int.from_bytes(buf[start + 2 : start + 10], "big"), 10
            masked = b2 & 0x80
            if avail < head + (4 if masked else 0) + n:
                break
            begin = start + head + (4 if masked else 0)
            self.start = begin + n
            fin, opcode = b1 & 0x80, b1 & 0x0F
            if masked or self.parts or not fin:  # rare: copied
                data = bytes(buf[begin : begin + n])
                if masked:
                    mask = buf[start + head : start + head + 4]
                    data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
                if opcode >= 0x8:  # control frames may come between fragments
                    self.client.message(opcode, data, 0, len(data), now)
                    continue
                self.parts.append(data)
                if not fin:
                    continue
                whole, self.parts = b"".join(self.parts), []
                self.client.message(opcode or 0x1, whole, 0, len(whole), now)
                continue
            self.client.message(opcode, buf, begin, begin + n, now)
        if self.start == self.end:
            self.start = self.end = 0

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.client.error:
            self.client.error = f"{type(exc).__name__}: {exc}"
        if not self.closed.done():
            self.closed.set_result(None)


# --- the run -------------------------------------------------------------------------------------


def poller(broker_id: int, cycle: list[int], done: threading.Event, pushes: list[float]) -> None:
    from django.db import connection

    from channels_registry.polling import do_poll_broker

    try:
        for n in range(1, WARMUP + CYCLES + 1):
            started = time.monotonic()
            cycle[0] = n
            pushed = len(pushes)
            outcome = do_poll_broker(broker_id, force=True)
            if outcome.status != "ok":
                print(f"  poll {n}: {outcome.status} {outcome.errors[:1]}")
            print(
                f"  cycle {n}: poll+commit+push {time.monotonic() - started:.2f} s"
                f" (push {sum(pushes[pushed:]):.2f} s), {len(outcome.changed)} rows changed"
            )
            wait = SETTLE_S if n == WARMUP else INTERVAL_S - (time.monotonic() - started)
            done.wait(max(0.0, wait))
    finally:
        connection.close()
        done.set()


def percentile(values: list[tuple[float, int]], q: float) -> float:
    """Weighted percentile of (value, weight) pairs."""
    ordered = sorted(values)
    total = sum(w for _, w in ordered)
    running = 0
    for value, weight in ordered:
        running += weight
        if running >= q * total:
            return value
    return float("nan")


async def _clients(port: int, keys: list[str], ready: Any, stop: Any, out: Any) -> None:
    """The client side, in a process of its own (see ``client_process``)."""
    clients = [WsClient(port, key) for key in keys]
    gate = asyncio.Semaphore(50)

    async def connect(client: WsClient) -> None:
        async with gate:
            try:
                await client.connect()
            except Exception as exc:
                client.error = f"connect: {exc}"

    started = time.monotonic()
    await asyncio.gather(*(connect(c) for c in clients))
    connected = [c for c in clients if not c.error]
    # A thousand browsers do not share one garbage collector: what connecting made (sockets,
    # protocols, buffers) is moved out of this process's collections, whose full passes
    # (~0.15 s) would otherwise delay every page's receipt at once.
    gc.collect()
    gc.freeze()
    _keep_heap(len(connected))
    out.put(("connected", len(connected), time.monotonic() - started))
    ready.set()
    until = time.monotonic() + CYCLES * 120  # bounded, whatever the poller does
    listeners = [asyncio.ensure_future(c.listen()) for c in connected]
    parser = asyncio.ensure_future(BACKLOG.run())
    while not stop.is_set() and time.monotonic() < until:
        await asyncio.sleep(0.2)
    for task in listeners:
        task.cancel()
    await asyncio.wait(listeners, timeout=30)
    await asyncio.wait([asyncio.ensure_future(c.close()) for c in connected], timeout=30)
    parser.cancel()
    BACKLOG.parse()
    out.put(
        [(c.received, c.messages, c.bytes, c.notices, c.error, c in connected) for c in clients]
    )


def _keep_heap(clients: int) -> None:
    """Keep this process's freed memory for reuse, and page in a poll's worth now: each
    message kept for ``Backlog`` is a copy (~96 KiB), and glibc gave the memory back after each
    parse, so every poll paged ~22,000 pages in again (0.04-0.33 s of this one process's time
    on a virtual machine, across every page's receipt). A browser's memory is its own; glibc
    only (``mallopt``), a no-op elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
        libc.mallopt(M_MMAP_THRESHOLD, 4 << 20)
    except (OSError, AttributeError):
        return
    warm = [bytearray(b"\1") * (100 * 1024) for _ in range(clients + clients // 10)]
    del warm


def client_process(port: int, keys: list[str], ready: Any, stop: Any, out: Any) -> None:
    """The clients run in their own process, so that reading a gigabyte per cycle does not
    hold the poller's GIL (nor the poller theirs): commit and receipt times are wall clock."""
    if not CLIENT_PROFILE:
        asyncio.run(_clients(port, keys, ready, stop, out))
        return
    import cProfile

    profile = cProfile.Profile()
    try:
        profile.runcall(asyncio.run, _clients(port, keys, ready, stop, out))
    finally:
        profile.dump_stats(f"{CLIENT_PROFILE}.{os.getpid()}")


class Received:
    """What one client process reported about one client."""

    def __init__(self, report: tuple[Any, ...]) -> None:
        self.received, self.messages, self.bytes, self.notices, self.error, self.ok = report


def run_clients(
    port: int, keys: list[str], server: subprocess.Popen[bytes], broker_id: int
) -> None:
    import multiprocessing

    from django.db import connections

    from channels_registry.models import Broker
    from dashboard.board import live

    cycle = [0]
    commits: dict[int, float] = {}
    pushes: list[float] = []
    real_push = live.push_board_rows

    def timed_push(*args: Any, **kwargs: Any) -> int:
        if cycle[0] > WARMUP:  # called by on_commit: right after the commit
            commits.setdefault(cycle[0], time.time())
        started = time.monotonic()
        try:
            return real_push(*args, **kwargs)
        finally:  # render, compare, group_send: part of commit → receipt
            pushes.append(time.monotonic() - started)

    live.push_board_rows = timed_push  # type: ignore[assignment]
    Broker.adapter = lambda self, installation=None: SyntheticAdapter(cycle)  # type: ignore[method-assign]

    rss_idle = rss_mib(server.pid)
    connections.close_all()  # not shared with the forked client processes
    context = multiprocessing.get_context("fork")
    ready, stop, out = context.Event(), context.Event(), context.Queue()
    processes = [
        context.Process(target=client_process, args=(port, keys[i::CLIENT_PROCS], ready, stop, out))
        for i in range(CLIENT_PROCS)
    ]
    for process in processes:
        process.start()
    connected_n, took = 0, 0.0
    for _ in processes:
        _, n, t = out.get(timeout=600)
        connected_n, took = connected_n + n, max(took, t)
    print(
        f"{connected_n}/{len(keys)} clients connected in {took:.1f} s"
        f" ({CLIENT_PROCS} client process(es)); server RSS {rss_mib(server.pid):.0f} MiB"
        f" (idle {rss_idle:.0f} MiB)"
    )
    done = threading.Event()
    rss_samples: list[float] = []
    # Who used the machine's CPU during the polls: the server, the clients (in a real
    # deployment, a thousand browsers elsewhere) and this process (the poller and PostgreSQL's
    # client side; PostgreSQL and Redis themselves are not counted).
    pids = {"server": [server.pid], "clients": [p.pid for p in processes], "poller": [os.getpid()]}
    cpu_start = {name: sum(map(cpu_s, group)) for name, group in pids.items()}
    wall_start = time.monotonic()
    if os.environ.get("BENCH_SETTLE_HEAP", "0") == "1":  # as a poller process would at start
        from config.startup import settle_heap

        print(f"  poller's heap settled: {settle_heap():,} objects frozen")
    thread = threading.Thread(target=poller, args=(broker_id, cycle, done, pushes), daemon=True)
    thread.start()
    until = time.monotonic() + CYCLES * 120
    while not done.is_set() and time.monotonic() < until:
        rss_samples.append(rss_mib(server.pid))
        time.sleep(0.5)
    for _ in range(int(GRACE_S * 2)):  # stragglers
        rss_samples.append(rss_mib(server.pid))
        time.sleep(0.5)
    cpu = {name: sum(map(cpu_s, group)) - cpu_start[name] for name, group in pids.items()}
    wall = time.monotonic() - wall_start
    stop.set()
    reports = [Received(r) for _ in processes for r in out.get(timeout=300)]
    for process in processes:
        process.join(30)
    thread.join(5)
    report(reports, commits, pushes, rss_idle, rss_samples)
    print(
        f"CPU during the polls and grace ({wall:.0f} s wall × {os.cpu_count()} cores): "
        + ", ".join(f"{name} {used:.1f} s" for name, used in cpu.items())
    )


def report(
    clients: list[Received],
    commits: dict[int, float],
    pushes: list[float],
    rss_idle: float,
    rss_samples: list[float],
) -> None:
    """What the clients received against what each cycle committed, and the server's RSS."""
    connected = [c for c in clients if c.ok]
    latencies: list[tuple[float, int]] = []
    by_cycle: dict[int, list[tuple[float, int]]] = {}
    rows_received = 0
    unmatched = 0
    superseded = 0
    complete = 0
    notices: dict[str, int] = {}
    last = max(commits, default=0)
    for client in connected:
        seen: dict[int, int] = {}
        for t, n, rows in client.received:
            if n in commits:
                latencies.append((t - commits[n], rows))
                by_cycle.setdefault(n, []).append((t - commits[n], rows))
                rows_received += rows
                seen[n] = seen.get(n, 0) + rows
            else:
                unmatched += rows
        # Rows a slow client never saw at cycle n because cycle n+1 replaced them (coalesced):
        # what arrived later covers them; the last cycle has nothing after it.
        superseded += sum(max(0, CHANGED - seen.get(n, 0)) for n in commits if n < last)
        complete += seen.get(last, 0) >= CHANGED
        for kind, count in client.notices.items():
            notices[kind] = notices.get(kind, 0) + count
    expected = len(connected) * CHANGED * len(commits)
    errors = [c.error for c in clients if c.error]
    total_bytes = sum(c.bytes for c in connected)
    per_client_cycle = total_bytes / max(1, len(connected)) / max(1, len(commits))
    print(
        f"clients={len(connected)} channels={CHANNELS} changed/cycle={CHANGED}"
        f" cycles={len(commits)} (after {WARMUP} unmeasured) interval={INTERVAL_S:g}s"
    )
    print(
        f"rows received {rows_received:,} of {expected:,} expected"
        f" ({100 * rows_received / max(1, expected):.1f} %), unmatched {unmatched},"
        f" {sum(c.messages for c in connected):,} messages, {total_bytes / 2**20:,.0f} MiB;"
        f" {per_client_cycle / 1024:,.1f} KiB per client per cycle"
    )
    print(f"clients holding every row's last version: {complete} of {len(connected)}")
    if pushes:
        print(f"push (render, compare, group_send) per cycle: max {max(pushes):.3f} s")
    if superseded and 0 < rows_received < expected:
        print(f"  of the missing: at most {superseded:,} superseded by a later cycle (coalesced)")
    if notices:
        print(f"notices: {notices}")
    if latencies:
        p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
        worst = max(v for v, _ in latencies)
        print(f"commit → receipt: p50 {p50:.3f} s  p95 {p95:.3f} s  max {worst:.3f} s")
        print(
            "  per cycle p95: "
            + ", ".join(f"{n}: {percentile(v, 0.95):.2f} s" for n, v in sorted(by_cycle.items()))
        )
    print(
        f"server RSS: idle {rss_idle:.0f} MiB, peak {max(rss_samples):.0f} MiB,"
        f" end {rss_samples[-1]:.0f} MiB (median during run {statistics.median(rss_samples):.0f})"
    )
    if errors:
        print(f"client errors: {len(errors)}, e.g. {errors[0]}")


def scan_log(path: str) -> None:
    """Tracebacks and error lines in the server's log, counted (the first one shown)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().splitlines()
    bad = [
        line
        for line in lines
        if "Traceback" in line or "ERROR" in line or "exception" in line.lower()
    ]
    print(f"server log: {len(lines)} lines, {len(bad)} with an error or traceback")
    for line in bad[:3]:
        print(f"  {line[:200]}")


def main() -> None:
    print(
        f"bench.live: {CLIENTS} clients, {CHANNELS} channels, {CHANGED} changing, {CYCLES} cycles"
        f" (db {DB}); load {os.getloadavg()}"
    )
    setup_django()
    server = None
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in the finally below)
        "w+b", prefix="bench-live-daphne-", suffix=".log", delete=False
    )
    try:
        from channels_registry.models import Broker
        from channels_registry.polling import do_poll_broker

        broker_id, keys = make_data()
        Broker.adapter = lambda self, installation=None: SyntheticAdapter([0])  # type: ignore[method-assign]
        # The first health rows, and a second poll that gives them rates, before anyone
        # listens: cycle 1 then changes the moving rows only, as every later cycle does.
        do_poll_broker(broker_id, force=True)
        do_poll_broker(broker_id, force=True)
        port = free_port()
        server = start_server(port, log)
        run_clients(port, keys, server, broker_id)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
        log.close()
        drop_database()
        scan_log(log.name)
        print(f"server log: {log.name}; load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
