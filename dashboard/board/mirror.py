"""The live board's mirror: the latest pushed version of each row in this server process,
shared by all its pages, and the frames each page is due from its cursor (issue 29; how the
board's websocket uses it: ``dashboard.board.consumers``).

A version is a row's HTML (with the pusher's patch from the version before it, when there is
one) or a notice (JSON). A page holds only a cursor into the mirror; its frames are built once
per (cursor, filters, basis) and shared by the pages at that cursor, a row going as its patch
where the page is known to hold the version the patch starts from (``PatchView``).
"""

from __future__ import annotations

import bisect
import collections
import json
from collections.abc import Iterable
from typing import Any

from dashboard.board.live import FRAME_BYTES
from dashboard.board.versions import row_patch

#: Row versions the mirror keeps (one per row: the channels on the board, plus brokers).
MIRROR_MAX_ROWS = 50_000
#: Frames built for one (cursor, filters) are shared by the clients at that cursor.
FRAME_MEMO_SIZE = 256


def notice(kind: str, **fields: Any) -> str:
    """A message that is not rows: JSON (rows are HTML, starting with ``<`` or whitespace)."""
    return json.dumps({kind: fields}, separators=(",", ":"))


def folded(payload: str) -> str:
    """A notice inside a frame of rows: an HTML comment after them (JSON of ASCII numbers and
    an ISO time, never ``-->``; hostile text never reaches a notice)."""
    return f"<!--dlo {payload}-->"


class PatchView:
    """What a client holds, for patches: its last frames were built when the mirror was at
    ``basis``, starting from cursor ``origin[0]`` (``origin[1:]``: that build's basis,
    variant). ``joined``: versions up to it may not be on the page. The page checks each
    patch's starting version (``data-v``) and asks for the whole row when it differs, so a
    row it loaded over HTTP, or from another server process, may be patched too: -1."""

    __slots__ = ("basis", "joined", "origin")

    def __init__(self, seq: int) -> None:
        self.basis = seq
        self.joined = -1
        self.origin: tuple[int, int, int] | None = None

    def rejoin(self, seq: int) -> None:
        """The page reloads its rows over HTTP."""
        self.basis = seq
        self.origin = None


class _Version:
    """One pushed version: a row's HTML, or a notice (JSON): a broker's sample time, which may
    ride in a frame of rows (``foldable``), or another, which travels in a frame alone. A row
    may also have a ``patch`` from the version ``base`` (its predecessor) to it."""

    __slots__ = ("base", "broker", "foldable", "is_row", "patch", "payload", "seq", "team")

    def __init__(
        self, seq: int, team: str | None, broker: str, payload: str, foldable: bool = False
    ) -> None:
        self.seq, self.team, self.broker, self.payload = seq, team, broker, payload
        self.is_row = not payload.startswith("{")
        self.foldable = foldable and not self.is_row
        self.patch: str | None = None
        self.base = 0

    def shown(self, team: str, broker: str) -> bool:
        """Whether a client filtered to ``team``/``broker`` gets it (``team`` None: any)."""
        if team and self.team is not None and self.team != team:
            return False
        return not (broker and self.broker != broker)


#: A mirror key: a row's channel id, or ("sampled", broker id) for a broker's last sample time.
Key = int | tuple[str, int]
#: A frame's text and the cursor after it.
Frame = tuple[str, int]


class BoardMirror:
    """The latest pushed version of each row in this process, oldest first (see the module)."""

    def __init__(self, max_rows: int = MIRROR_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self.rows: collections.OrderedDict[Key, _Version] = collections.OrderedDict()
        self.seq = 0
        #: Versions up to this number were evicted: a client whose cursor is below must reload.
        self.floor = 0
        self._batches: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._memo: collections.OrderedDict[tuple[Any, ...], Any] = collections.OrderedDict()

    def apply(self, batch: str, rows: Iterable[dict[str, Any]], sampled: Any = None) -> None:
        """Record a pushed batch once (every client of the process receives the same one)."""
        if batch in self._batches:
            return
        self._batches[batch] = None
        if len(self._batches) > 1024:
            self._batches.popitem(last=False)
        for row in rows:
            self._put(int(row["id"]), row["team"], row["broker"], row["html"], row.get("patch"))
        if sampled:
            payload = notice("sampled", broker=sampled["broker_id"], at=sampled["at"])
            key = ("sampled", int(sampled["broker_id"]))
            self._put(key, None, sampled["broker"], payload, None, foldable=True)
        while len(self.rows) > self.max_rows:
            _, oldest = self.rows.popitem(last=False)
            self.floor = oldest.seq

    def _put(
        self,
        key: Key,
        team: str | None,
        broker: str,
        payload: str,
        patch: str | None,
        foldable: bool = False,
    ) -> None:
        """A new version of ``key``; ``patch``: the pusher's, from the version it last pushed
        (a pusher of an older release sends none: the patch from this mirror's version)."""
        self.seq += 1
        version = _Version(self.seq, team, broker, payload, foldable)
        before = self.rows.get(key)
        if version.is_row and isinstance(key, int):
            if before is not None and before.is_row:
                version.base = before.seq
                version.patch = patch or row_patch(key, before.payload, payload)
            else:  # not in this mirror yet: a page holding the version gets the patch
                version.patch = patch
        self.rows[key] = version
        self.rows.move_to_end(key)

    def frames(
        self, cursor: int, team: str, broker: str, view: PatchView | None = None
    ) -> tuple[list[Frame], int]:
        """Every frame due after ``cursor`` for a client with these filters, oldest first, and
        the cursor after them all (see ``_pack``). Given the client's ``view``, a row goes as
        its patch when the client holds the version the patch starts from: that version came
        over the socket (after ``view.joined``), the client's cursor passed it, and it was
        still the row's latest when the client's last frames were built (``view.basis``),
        so it was sent then or before. Without a view every row goes whole.

        Clients at the same cursor and basis share one build (its variants differ only for a
        client that joined after some patch's starting version), and every frame boundary of
        a build is remembered for the clients walking it: one frame per ack."""
        if view is not None and view.origin is not None and view.basis == self.seq:
            walked = self._memo.get(("walk", cursor, self.seq, team, broker, *view.origin))
            if walked is not None:
                return walked
        basis = view.basis if view is not None else self.seq
        joined = view.joined if view is not None else self.seq
        key = (cursor, self.seq, team, broker, basis)
        entry = self._memo.get(key)
        if entry is None:
            due = self._due(cursor)
            starts = sorted(
                v.base for v in due if v.patch is not None and v.seq > basis and v.base <= cursor
            )
            built: dict[int, tuple[list[Frame], int]] = {}
            entry = (due, starts, built)
            self._remember(key, entry)
        due, starts, built = entry
        variant = bisect.bisect_right(starts, joined)  # patches that start too early: whole rows
        result = built.get(variant)
        if result is None:
            result = built[variant] = self._pack(
                due, cursor, team, broker, lambda v: v.seq > basis and joined < v.base <= cursor
            )
            frames, end = result
            for i, (_, after) in enumerate(frames[:-1]):
                walk = ("walk", after, self.seq, team, broker, cursor, basis, variant)
                self._remember(walk, (frames[i + 1 :], end))
        if view is not None:
            view.basis, view.origin = self.seq, (cursor, basis, variant)
        return result

    def _due(self, cursor: int) -> list[_Version]:
        """The versions after ``cursor``, oldest first."""
        due: list[_Version] = []
        for k in reversed(self.rows):
            version = self.rows[k]
            if version.seq <= cursor:
                break
            due.append(version)
        due.reverse()
        return due

    @staticmethod
    def _pack(
        due: list[_Version], cursor: int, team: str, broker: str, patched: Any
    ) -> tuple[list[Frame], int]:
        """``due`` packed into frames of at most ``FRAME_BYTES`` (a row is ASCII,
        ``dashboard.board.live``, so its length is its size), each with the cursor after it. A row
        for which ``patched`` holds goes as its patch; a broker's sample time after rows rides
        in their frame (``folded``); any other notice is a frame of its own."""
        frames: list[Frame] = []
        parts: list[str] = []
        size = 0
        end = cursor
        for version in due:
            if not version.shown(team, broker):
                end = version.seq
                continue
            chosen = version.payload
            if version.patch is not None and patched(version):
                chosen = version.patch
            text = folded(chosen) if parts and version.foldable else chosen
            n = len(text)
            if parts and (not (version.is_row or version.foldable) or size + n > FRAME_BYTES):
                frames.append(("".join(parts), end))  # full, or a notice follows
                parts, size = [], 0
                text = chosen
            end = version.seq
            if version.is_row or (parts and version.foldable):
                parts.append(text)
                size += n
            else:
                frames.append((text, end))
        if parts:
            frames.append(("".join(parts), end))
        if frames:  # versions filtered out after the last frame are passed with it
            frames[-1] = (frames[-1][0], end)
        return frames, end

    def _remember(self, key: tuple[Any, ...], result: Any) -> None:
        self._memo[key] = result
        self._memo.move_to_end(key)
        while len(self._memo) > FRAME_MEMO_SIZE:
            self._memo.popitem(last=False)


MIRROR = BoardMirror()
