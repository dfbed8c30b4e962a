"""Pushing board rows to open dashboards after a poll commits.

1. The rows are built with one query and each is rendered once, by the same ``row_html`` the
   page uses (never once per client).
2. A row is pushed only if its HTML differs from the last pushed version (a digest per row in
   the shared cache, one round trip each way); the ``<time>`` of the last sample is left out of
   the comparison, since its age ticks client-side (``static/dlo/board.js``).
3. One ``group_send`` per poll carries every changed row; each consumer keeps what its user
   may see and coalesces (``dashboard.consumers``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.utils import timezone

from dashboard.board import board_rows, conditions_for
from dashboard.board_html import row_html
from dashboard.html import ChannelLinks

log = logging.getLogger(__name__)

BOARD_GROUP = "board"
DIGEST_KEY = "dlo:board-row:{}"
DIGEST_TTL_S = 6 * 3600
_SAMPLE_TIME = re.compile(r"<time [^>]*>[^<]*</time>")


def row_digest(html: str) -> str:
    """What "changed" compares: the row's HTML minus the ticking sample time."""
    return hashlib.blake2b(_SAMPLE_TIME.sub("", html).encode(), digest_size=12).hexdigest()


def _changed_only(rendered: dict[int, str]) -> dict[int, str]:
    """The rows whose HTML differs from the last pushed version; records the new versions.
    A cache failure pushes everything (a redundant row is harmless, a missing one is not)."""
    digests = {pk: row_digest(html) for pk, html in rendered.items()}
    try:
        last = cache.get_many([DIGEST_KEY.format(pk) for pk in digests])
    except Exception:
        log.warning("board row digests unavailable; pushing every row", exc_info=True)
        return rendered
    fresh = {pk: rendered[pk] for pk, d in digests.items() if last.get(DIGEST_KEY.format(pk)) != d}
    if fresh:
        try:
            cache.set_many({DIGEST_KEY.format(pk): digests[pk] for pk in fresh}, DIGEST_TTL_S)
        except Exception:
            log.warning("board row digests not saved", exc_info=True)
    return fresh


def push_board_rows(channel_ids: Iterable[int]) -> int:
    """Render and send the changed rows of ``channel_ids``; returns how many rows were sent."""
    layer = get_channel_layer()
    ids = list(channel_ids)
    if layer is None or not ids:
        return 0
    rows = {r.channel.pk: r for r in board_rows(conditions_for(pk__in=ids), timezone.now())}
    # ASCII only (non-ASCII as character references, the same HTML to a parser): Python
    # then stores each row and every client's joined frame one byte per character, and the
    # server's UTF-8 encoding of each frame is a plain copy.
    links = ChannelLinks()
    rendered = {
        pk: row_html(row, True, links).encode("ascii", "xmlcharrefreplace").decode("ascii")
        for pk, row in rows.items()
    }
    fresh = _changed_only(rendered)
    if not fresh:
        return 0
    payload = [
        {
            "id": pk,
            "team": rows[pk].channel.owner_team,
            "broker": rows[pk].channel.broker.name,
            "state": rows[pk].state,
            "html": html,
        }
        for pk, html in fresh.items()
    ]
    # One message per poll: channels_redis stores it once per server process, and every
    # client gets all of the poll's rows in one coalesced frame (chunks arrived a flush apart).
    async_to_sync(layer.group_send)(BOARD_GROUP, {"type": "board.rows", "rows": payload})
    return len(payload)
