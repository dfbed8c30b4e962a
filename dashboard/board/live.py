"""Pushing board rows to open dashboards after a poll commits.

1. The rows are loaded by id in one query (no ranking: a push has no order) and each is
   rendered once, by the same ``row_html`` the page uses (never once per client).
2. A row is pushed only if it changed in meaning: its version (``data-v``, the digest of
   its meaning, ``dashboard.board.versions``) differs from the last pushed one, kept with
   that row's HTML in the shared cache (one round trip each way). The meaning leaves out what
   moves with the clock alone: the ``<time>`` of the last sample (the page shows its age from
   the timestamp, ``static/dlo/board.js``) and the sparkline's drawing, of which it keeps the
   values it states (its label: the hour's maximum and the backlog now). The patch from the
   last pushed version is computed here, once per poll, from the HTML this process pushed
   (when it is that version: a broker polled by one process, as with the in-process
   scheduler, or a worker per broker), and travels with the row: every server process can
   send it, even one started after that version (its mirror empty), to a page whose row is
   that version (the page checks ``data-v``).
3. The poll's sample time goes once per broker (``sampled``), in the last layer message of
   the poll's rows; each consumer folds it into the frame of those rows (an HTML comment
   after them), so a poll is one websocket message per in-sync client. The page moves the
   "last sample" of that broker's rows, which are therefore not pushed again just for it.
4. The rows go in ``group_send`` messages of at most ``LAYER_MESSAGE_BYTES`` each; each
   consumer keeps what its user may see, coalesces and packs frames of at most
   ``FRAME_BYTES`` (``dashboard.board.consumers``). A row larger than a frame (never seen: rows are
   ~1 KB) goes as a notice telling the page to reload its rows, never as an oversized frame.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.utils import timezone

from dashboard.board.data import load_rows
from dashboard.board.page import make_row
from dashboard.board.rows import row_html
from dashboard.board.versions import row_patch, version_of
from dashboard.html import ChannelLinks

log = logging.getLogger(__name__)

BOARD_GROUP = "board"
#: The version of a row last pushed, in the shared cache: what "changed" compares, whichever
#: process polls. A new key: the digests an older release kept under ``dlo:board-row:`` are
#: not read (every row goes once after the upgrade).
LAST_KEY = "dlo:board-row-v:{}"
LAST_TTL_S = 6 * 3600
#: The HTML this process last pushed for a row, to compute the patch from when it is still the
#: last pushed version (a broker polled by another process since: whole rows); bounded.
LAST_HTML_MAX = 20_000
_last_html: collections.OrderedDict[int, str] = collections.OrderedDict()
_last_html_lock = threading.Lock()
#: A websocket frame's limit (daphne refuses frames over 1 MiB; a batch is split across frames).
FRAME_BYTES = 256 * 1024
#: A channel-layer message's share of rows: a poll of up to ~4,000 changed rows is one message
#: (10,000 is three). At 1 MiB, 1,000 changed rows of ~1.07 KB made two, and the pages got
#: the last few rows (and the sample time) ~0.1-0.2 s after the rest, in a second frame.
LAYER_MESSAGE_BYTES = 4 * 1024 * 1024


def _reload_notice(reason: str) -> str:
    """The notice the consumer sends alone in a frame (``dashboard.board.consumers.notice``)."""
    return json.dumps({"reload": {"reason": reason}}, separators=(",", ":"))


def _changed_only(rendered: dict[int, str]) -> tuple[dict[int, str], dict[int, str]]:
    """The rows whose version differs from the last pushed one, and for each of those whose
    last pushed HTML this process holds, the patch from it; records the new versions. A cache
    failure pushes everything whole (a redundant row is harmless, a missing one is not)."""
    versions = {pk: version_of(html) for pk, html in rendered.items()}
    try:
        last = cache.get_many([LAST_KEY.format(pk) for pk in rendered])
    except Exception:
        log.warning("board row versions unavailable; pushing every row", exc_info=True)
        return rendered, {}
    fresh: dict[int, str] = {}
    patches: dict[int, str] = {}
    with _last_html_lock:
        for pk, html in rendered.items():
            before = last.get(LAST_KEY.format(pk))
            if before == versions[pk]:
                continue
            fresh[pk] = html
            held = _last_html.get(pk)
            if before and held is not None and version_of(held) == before:
                patch = row_patch(pk, held, html)
                if patch is not None:
                    patches[pk] = patch
            _last_html[pk] = html
            _last_html.move_to_end(pk)
        while len(_last_html) > LAST_HTML_MAX:
            _last_html.popitem(last=False)
    if fresh:
        try:
            cache.set_many({LAST_KEY.format(pk): versions[pk] for pk in fresh}, LAST_TTL_S)
        except Exception:
            log.warning("board row versions not saved", exc_info=True)
    return fresh, patches


def _messages(payload: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows cut into channel-layer messages of about ``LAYER_MESSAGE_BYTES`` each."""
    messages: list[list[dict[str, Any]]] = [[]]
    size = 0
    for row in payload:
        if messages[-1] and size + len(row["html"]) > LAYER_MESSAGE_BYTES:
            messages.append([])
            size = 0
        messages[-1].append(row)
        size += len(row["html"])
    return messages


def push_board_rows(
    channel_ids: Iterable[int],
    sampled: tuple[int, str, dt.datetime] | None = None,
) -> int:
    """Render and send the changed rows of ``channel_ids`` and, given ``sampled`` (broker id,
    name, time of a successful poll), that broker's sample time; returns how many rows were
    sent."""
    layer = get_channel_layer()
    ids = list(channel_ids)
    if layer is None or not (ids or sampled):
        return 0
    # The rows by id, unranked: a push has no order to keep (the page places rows by id), so
    # the board's ranking queries (stale scan, ordered walk) are not run for it.
    now = timezone.now()
    rows = {pk: make_row(channel, now) for pk, channel in load_rows(ids).items()}
    # ASCII only (non-ASCII as character references, the same HTML to a parser): Python
    # then stores each row and every client's joined frame one byte per character, and the
    # server's UTF-8 encoding of each frame is a plain copy; a frame's length is its size.
    links = ChannelLinks()
    rendered = {
        pk: row_html(row, True, links).encode("ascii", "xmlcharrefreplace").decode("ascii")
        for pk, row in rows.items()
    }
    fresh, patches = _changed_only(rendered) if rendered else ({}, {})
    payload = []
    for pk, html in fresh.items():
        patch = patches.get(pk)
        if len(html) > FRAME_BYTES:
            log.warning(
                "board row %s is %d bytes, over a frame: pages reload instead", pk, len(html)
            )
            html, patch = _reload_notice("a row too large to push"), None
        payload.append(
            {
                "id": pk,
                "team": rows[pk].channel.owner_team,
                "broker": rows[pk].channel.broker.name,
                "state": rows[pk].state,
                "html": html,
                "patch": patch,
            }
        )
    messages = _messages(payload)
    for i, chunk in enumerate(messages):
        message: dict[str, Any] = {"type": "board.rows", "batch": uuid.uuid4().hex, "rows": chunk}
        if sampled is not None and i == len(messages) - 1:
            broker_id, broker_name, at = sampled
            message["sampled"] = {
                "broker_id": broker_id,
                "broker": broker_name,
                "at": at.isoformat(),
            }
        if message["rows"] or "sampled" in message:
            async_to_sync(layer.group_send)(BOARD_GROUP, message)
    return len(payload)
