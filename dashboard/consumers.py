"""The board's websocket: pushes changed rows (HTML for htmx out-of-band swaps).

The ASGI stack checks the Origin (AllowedHostsOriginValidator) and loads the session user
(AuthMiddlewareStack); this consumer checks the permission itself and refuses the handshake
otherwise (4401 anonymous, 4403 without the viewer permission). Updates are coalesced: at most
one message per ``FLUSH_INTERVAL_S`` per client, holding only the latest HTML of each row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from dashboard.live import BOARD_GROUP

FLUSH_INTERVAL_S = 1.0
VIEW_PERMISSION = "channels_registry.view_channel"


class BoardConsumer(AsyncWebsocketConsumer):
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
        self.pending: dict[int, str] = {}
        self.last_flush = float("-inf")
        self.flush_task: asyncio.Task[None] | None = None
        await self.channel_layer.group_add(BOARD_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        task = getattr(self, "flush_task", None)
        if task is not None:
            task.cancel()
        if hasattr(self, "pending"):
            await self.channel_layer.group_discard(BOARD_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Clients have nothing to say; the socket is one-way."""

    def visible(self, row: dict[str, Any]) -> bool:
        """Every viewer sees every channel today; the per-row check is here, in one place."""
        if self.filters["team"] and row["team"] != self.filters["team"]:
            return False
        return not (self.filters["broker"] and row["broker"] != self.filters["broker"])

    async def board_rows(self, event: dict[str, Any]) -> None:
        for row in event["rows"]:
            if self.visible(row):
                self.pending[int(row["id"])] = row["html"]
        if self.pending and self.flush_task is None:
            delay = max(0.0, self.last_flush + FLUSH_INTERVAL_S - time.monotonic())
            self.flush_task = asyncio.ensure_future(self._flush_after(delay))

    async def _flush_after(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        self.flush_task = None
        html, self.pending = "".join(self.pending.values()), {}
        self.last_flush = time.monotonic()
        if html:
            await self.send(text_data=html)
