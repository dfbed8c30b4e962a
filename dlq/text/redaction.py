"""Per-channel redaction of payload fields for users without the reveal permission.

Rules come from the channel declaration: ``redact_headers`` (header names, case-insensitive)
and ``redact_json_paths`` (``$.a.b``, ``$.items[*].card``, ``$.list[0]``). A body that the rules
cannot be applied to (not JSON, or nested too deep to walk) is hidden entirely when the channel
has JSON-path rules: hiding too much is the safe failure.
"""

from __future__ import annotations

import re
from typing import Any

from channels_registry.models import Channel

MASK = "•••• redacted"
REVEAL_PERMISSION = "channels_registry.reveal_channel_payload"

_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\*|\d+)\]")


def parse_path(path: str) -> list[str | int | None] | None:
    """``$.a.b[0].c[*]`` → ``["a", "b", 0, "c", None]`` (``None`` = every element);
    ``None`` when the path is not of that form."""
    if not path.startswith("$"):
        return None
    rest = path[1:]
    steps: list[str | int | None] = []
    pos = 0
    while pos < len(rest):
        if rest[pos] == ".":
            pos += 1
        match = _SEGMENT.match(rest, pos)
        if match is None:
            return None
        name, index = match.groups()
        if name is not None:
            steps.append(name)
        else:
            steps.append(None if index == "*" else int(index))
        pos = match.end()
    return steps or None


def has_rules(channel: Channel) -> bool:
    return bool(channel.redact_headers or channel.redact_json_paths)


def redact_headers(headers: dict[str, Any], channel: Channel) -> dict[str, Any]:
    names = {str(n).lower() for n in channel.redact_headers or []}
    if not names:
        return headers
    return {k: (MASK if k.lower() in names else v) for k, v in headers.items()}


def _apply(node: Any, steps: list[str | int | None]) -> None:
    """Mask the value(s) at ``steps`` inside ``node`` in place (iteratively bounded by the
    path length, so hostile depth cannot recurse)."""
    if not steps:
        return
    step, rest = steps[0], steps[1:]
    if isinstance(step, str) and isinstance(node, dict) and step in node:
        if rest:
            _apply(node[step], rest)
        else:
            node[step] = MASK
    elif isinstance(node, list):
        if step is None:
            indexes = range(len(node))
        elif isinstance(step, int) and step < len(node):
            indexes = range(step, step + 1)
        else:
            return
        for i in indexes:
            if rest:
                _apply(node[i], rest)
            else:
                node[i] = MASK


def redact_document(document: Any, channel: Channel) -> Any:
    """Mask the channel's JSON paths in an already-parsed document (mutates and returns it)."""
    for path in channel.redact_json_paths or []:
        steps = parse_path(str(path))
        if steps:
            _apply(document, steps)
    return document
