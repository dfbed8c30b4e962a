"""Websocket routes. Every consumer checks permissions itself."""

from __future__ import annotations

from typing import Any

websocket_urlpatterns: list[Any] = []
