"""Issue #12 item 9: an oversized body is refused (413) before anything buffers it, in the
shipped server (daphne) and in the ASGI application for servers that stream."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

from dashboard.body_limit import BodyLimitMiddleware

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
BODY = 64 * MIB


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _request(port: int, head: bytes, chunks: Iterator[bytes]) -> bytes:
    """Send ``head`` then ``chunks`` as fast as the server takes them; return what it said
    (it may close the connection while the body is still being sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except (ConnectionResetError, TimeoutError):
            pass
        return answer


def _body(total: int, chunked: bool) -> Iterator[bytes]:
    block = b"a" * MIB
    for _ in range(total // MIB):
        yield (b"%x\r\n" % len(block) + block + b"\r\n") if chunked else block
    if chunked:
        yield b"0\r\n\r\n"


@pytest.fixture
def daphne_server() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The shipped server: daphne serving config.asgi, as the Dockerfile runs it."""
    port = _free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "config.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("daphne did not start")
        yield port, process
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_64_mib_unauthenticated_post_is_refused_without_growing_the_server(
    daphne_server: tuple[int, subprocess.Popen[bytes]],
) -> None:
    port, process = daphne_server
    warm = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    assert b" 200 " in _request(port, warm, iter(()))  # Django loaded before measuring
    before = _rss(process.pid)
    declared = (
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-"
        b"urlencoded\r\nContent-Length: %d\r\n\r\n" % BODY
    )
    assert _request(port, declared, _body(BODY, False)).startswith(b"HTTP/1.1 413")
    chunked = (
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-"
        b"urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert _request(port, chunked, _body(BODY, True)).startswith(b"HTTP/1.1 413")
    growth = _rss(process.pid) - before
    # Structural, not a timing: the server held a small part of one body at most, where the
    # old one held the whole 64 MiB (and several copies of it).
    assert growth < BODY // 8, f"RSS grew by {growth / MIB:.1f} MiB"
    assert b" 200 " in _request(port, warm, iter(()))  # and it still serves


def _run(app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> list[Any]:
    sent: list[Any] = []
    incoming = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/login/", "headers": headers}
    async_to_sync(BodyLimitMiddleware(app))(scope, receive, send)
    return sent


@override_settings(DLO_MAX_REQUEST_BYTES=1000)
def test_the_asgi_middleware_refuses_by_length_and_by_counted_bytes() -> None:
    reached: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        reached.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    refused = _run(app, [(b"content-length", b"1001")], [b"x"])
    assert refused[0]["status"] == 413 and reached == []
    refused = _run(app, [], [b"x" * 600, b"x" * 600])  # no length: counted as it streams
    assert refused[0]["status"] == 413 and reached == []
    accepted = _run(app, [(b"content-length", b"1000")], [b"x" * 500, b"x" * 500])
    assert accepted[0]["status"] == 200 and reached == [b"x" * 1000]
