"""Pushing board rows to open dashboards after a poll commits.

The row HTML is rendered once here, with the same partial the page uses, and sent to the
``board`` group in chunks; each consumer decides what its user may see and coalesces.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.template.loader import render_to_string
from django.utils import timezone

from channels_registry.models import Channel
from dashboard.board import board_rows

log = logging.getLogger(__name__)

BOARD_GROUP = "board"
CHUNK = 100


def push_board_rows(channel_ids: Iterable[int]) -> int:
    """Render and send the rows of ``channel_ids``; returns how many rows were sent."""
    layer = get_channel_layer()
    ids = list(channel_ids)
    if layer is None or not ids:
        return 0
    rows = board_rows(Channel.objects.filter(pk__in=ids), timezone.now())
    payload = [
        {
            "id": row.channel.pk,
            "team": row.channel.owner_team,
            "broker": row.channel.broker.name,
            "state": row.state,
            "html": render_to_string("dashboard/board.html#row", {"row": row, "oob": True}),
        }
        for row in rows
    ]
    send = async_to_sync(layer.group_send)
    for start in range(0, len(payload), CHUNK):
        send(BOARD_GROUP, {"type": "board.rows", "rows": payload[start : start + CHUNK]})
    return len(payload)
