"""Websocket routes. Every consumer checks permissions itself."""

from __future__ import annotations

from typing import Any

from django.urls import path

from dashboard.board.consumers import BoardConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/board/", BoardConsumer.as_asgi()),
]
