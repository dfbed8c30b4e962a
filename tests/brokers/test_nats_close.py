"""A NATS connection is closed when the adapter is done with it, even when the server stopped
reading: ``nc.close()`` flushes first and can block; the adapter then aborts the socket
instead of leaving it to the garbage collector (a ResourceWarning, a file descriptor held).
The server here is a real TCP peer that speaks the handshake and then reads nothing."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import warnings

import nats

from brokers import nats_jetstream


def _mute_server() -> tuple[socket.socket, threading.Event]:
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sendall(
            b'INFO {"server_id":"mute","version":"2.10.0","max_payload":67108864,'
            b'"headers":true,"proto":1}\r\n'
        )
        conn.recv(4096)  # CONNECT and PING
        conn.sendall(b"PONG\r\n")
        done.wait(30)  # alive, reading nothing more
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, done


def test_a_close_that_cannot_flush_still_closes_the_socket(monkeypatch) -> None:
    monkeypatch.setattr(nats_jetstream, "CLOSE_TIMEOUT_S", 0.5)
    listener, done = _mute_server()
    port = listener.getsockname()[1]
    seen: list[socket.socket] = []

    async def work() -> None:
        nc = await nats.connect(
            f"nats://127.0.0.1:{port}", allow_reconnect=False, pending_size=64_000_000
        )
        writer = nc._transport._io_writer
        seen.append(writer.get_extra_info("socket"))
        writer.transport.set_write_buffer_limits(high=1)  # any pending byte blocks drain()
        # Far more than the kernel buffers for a peer that reads nothing; less than the
        # pending limit, past which publish itself would wait for the flush.
        for _ in range(32):
            await nc.publish("x", b"y" * 1_000_000)
        await asyncio.sleep(0.1)  # the flusher writes it: the socket's buffer stays full
        await nats_jetstream.close_quietly(nc)

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nats_jetstream._run_once(work())
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert seen and seen[0].fileno() == -1  # the adapter's socket is closed
    finally:
        done.set()
        with contextlib.suppress(OSError):
            listener.close()
