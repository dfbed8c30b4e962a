"""A board row's version and the patch from one version to the next (issue 29).

Every rendered row carries its version in its ``<tr>``: ``data-v``, a digest of what the row
says (``row_digest``: its HTML minus what moves with the clock alone, the sample time and the
sparkline's drawing), in the page's HTTP render and in a pushed row alike. So a page can tell
whether it holds the version a patch starts from, whoever rendered its row and whenever: a
patch names the version it starts from and the one it makes, and the page applies it only to
that version (``static/dlo/board.js``), asking for the whole row otherwise (``rows N,…``).

A patch (``row_patch``) is the inner HTML of each cell whose meaning changed, as the server
rendered and escaped it, in an inert comment: ``<!--dlo {"patch":[id,{cell:html},from,to]}-->``
(``<`` and ``>`` as JSON escapes, so the comment cannot close early). A row whose ``<tr>`` (but
its version), channel cell (names, links: hostile text), state or DLQ flags changed has no
patch: it goes whole, so the page's attention and announcement rules see whole rows.
"""

from __future__ import annotations

import hashlib
import json
import re

#: Leaves what moves with the clock alone out of a row's meaning.
SAMPLE_TIME = re.compile(r"<time [^>]*>[^<]*</time>")
SPARK = re.compile(r'<svg class="spark[^"]*"[^>]*?(aria-label="[^"]*")[^>]*>.*?</svg>', re.S)
#: The version attribute in a ``<tr>`` (hex digits only).
_VERSION = re.compile(r' data-v="([0-9a-f]*)"')
_OOB = ' hx-swap-oob="true"'

#: Where ``dashboard.board.rows.row_html`` starts a cell. Escaped text never holds ``<``, so
#: the split is exact: the head (``<tr …>``), then one part per cell.
_CELL = "\n<td"
#: The state cell: patched only when its state and flags are as before (what the page's
#: attention and announcement rules read), i.e. when only its evidence line changed.
_STATE = 1
_EVIDENCE = '<div class="evidence sub">'


def meaning(html: str) -> str:
    """What a row (or a cell) says: its HTML without the clock-only parts (each pattern tried
    only where its tag is: most cells hold neither)."""
    if "<time " in html:
        html = SAMPLE_TIME.sub("", html)
    if "<svg " in html:
        html = SPARK.sub(r"<svg \1>", html)
    return html


def row_digest(html: str) -> str:
    """A row's version: the digest of its meaning, whether or not it is marked for an
    out-of-band swap or already carries a version."""
    plain = _VERSION.sub("", html.replace(_OOB, "", 1), count=1)
    return hashlib.blake2b(meaning(plain).encode(), digest_size=8).hexdigest()


def version_of(html: str) -> str:
    """The ``data-v`` a rendered row carries ("" for a row without one)."""
    found = _VERSION.search(html, 0, html.find(">") + 1)
    return found.group(1) if found else ""


def _inner(part: str) -> tuple[str, str]:
    """A cell's attributes and inner HTML (the part after ``\\n<td``; the last holds ``</tr>``)."""
    head_end = part.index(">")
    return part[:head_end], part[head_end + 1 : part.rindex("</td>")]


def row_patch(pk: int, old: str, new: str) -> str | None:
    """The folded patch from row HTML ``old`` to ``new`` (see the module), or None when the
    row must go whole, or either is not a versioned ``row_html`` row."""
    start, end = version_of(old), version_of(new)
    if not start or not end:
        return None
    before, after = old.split(_CELL), new.split(_CELL)
    if len(before) != len(after) or len(after) <= _STATE + 2:
        return None
    if _VERSION.sub("", before[0]) != _VERSION.sub("", after[0]) or before[1] != after[1]:
        return None
    state = _STATE + 1
    if before[state].split(_EVIDENCE, 1)[0] != after[state].split(_EVIDENCE, 1)[0]:
        return None
    cells: dict[str, str] = {}
    for i in range(state, len(after)):
        if before[i] == after[i] or meaning(before[i]) == meaning(after[i]):
            continue
        try:
            (attrs_old, _), (attrs_new, inner) = _inner(before[i]), _inner(after[i])
        except ValueError:
            return None
        if attrs_old != attrs_new:
            return None
        cells[str(i - 1)] = inner
    body = json.dumps({"patch": [pk, cells, start, end]}, separators=(",", ":"))
    return "<!--dlo " + body.replace("<", "\\u003c").replace(">", "\\u003e") + "-->"
