"""Refuse oversized request bodies before anything buffers them (issue #12: a 64 MiB
unauthenticated POST to /login/ grew the server by ~786 MB).

Two layers, because the shipped server reads the body before the application sees it:

1. ``install_daphne_limit`` (daphne: the Dockerfile's server and ``make run``'s runserver).
   Daphne's request reads the whole body into a file and then queues all of it, in memory,
   for the application before Django can look at a header. Its request class is swapped for
   one that answers 413 and closes the connection as soon as the declared Content-Length, or
   the bytes streamed so far (chunked uploads), pass the limit; the rest is discarded.
2. ``BodyLimitMiddleware`` (any ASGI server that streams, e.g. uvicorn): checks
   Content-Length and counts the streamed ``http.request`` bytes, answering 413 before
   Django reads the body.

The limit is ``DLO_MAX_REQUEST_BYTES`` (default 5 MiB: the registry import's 2 MiB file plus
its form, with room to spare). Nothing here reads or writes the database.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from django.conf import settings

MESSAGE = b"Request body too large.\n"


def _limit() -> int:
    return int(settings.DLO_MAX_REQUEST_BYTES)


def _too_large_bytes() -> bytes:
    return (
        b"HTTP/1.1 413 Content Too Large\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: " + str(len(MESSAGE)).encode() + b"\r\n"
        b"Connection: close\r\n\r\n" + MESSAGE
    )


def install_daphne_limit() -> None:
    """Make daphne build its requests from ``LimitedWebRequest`` (idempotent).

    Daphne's ``HTTPFactory.buildProtocol`` looks up its module's ``WebRequest`` for every
    connection, so rebinding that name is enough; daphne offers no setting for it."""
    try:
        from daphne import http_protocol
    except ImportError:  # another ASGI server: the middleware alone applies
        return
    if getattr(http_protocol.WebRequest, "dlo_limited", False):
        return

    class LimitedWebRequest(http_protocol.WebRequest):
        dlo_limited = True
        _dlo_refused = False
        _dlo_seen = 0

        def gotLength(self, length: int | None) -> None:  # noqa: N802 - Twisted's name
            if length is not None and length > _limit():
                self._dlo_refuse()
                self.content = BytesIO()  # never the temporary file for the whole body
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
            if self._dlo_refused:
                return
            self._dlo_seen += len(data)
            if self._dlo_seen > _limit():  # chunked, or more than it declared
                self._dlo_refuse()
                return
            super().handleContentChunk(data)

        def _dlo_refuse(self) -> None:
            self._dlo_refused = True
            transport = self.channel.transport if self.channel else None
            if transport is not None:
                transport.write(_too_large_bytes())
                transport.loseConnection()

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:  # noqa: N802
            if self._dlo_refused:  # answered already; never hand it to the application
                return
            super().requestReceived(command, path, version)

    http_protocol.WebRequest = LimitedWebRequest


class BodyLimitMiddleware:
    """ASGI middleware answering 413 for a body over the limit, before the app reads it.

    1. A declared Content-Length over the limit: 413 at once, nothing read.
    2. Otherwise the body is read here, counting bytes, at most ``limit`` of them: over it,
       413; within it, the messages are handed on to the application unchanged.
    """

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        limit = _limit()
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = limit + 1
                if declared > limit:
                    return await self._refuse(send)
        messages: list[dict[str, Any]] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the application sees it in turn
            seen += len(message.get("body", b""))
            if seen > limit:
                return await self._refuse(send)
            if not message.get("more_body", False):
                break

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        return await self.application(scope, replay, send)

    @staticmethod
    async def _refuse(send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(MESSAGE)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": MESSAGE})
