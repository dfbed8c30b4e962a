"""``json_safe_headers`` converts every dead letter's headers on the drain's thread, so it has a
fast path for plain values. It must give exactly what the plain recursive walk gives (the
RabbitMQ dedupe key hashes its result), for hostile headers too."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pika.spec import Basic, BasicProperties

from brokers.base import json_safe_headers
from brokers.rabbitmq import _dead_letter


def _reference(value: Any, depth: int) -> Any:
    """The walk as it was written before the fast path: one call per value."""
    if depth > 32:
        return "…(nested too deep)"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"$bytes": raw.hex()}
    if isinstance(value, Mapping):
        return {str(k): _reference(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_reference(v, depth + 1) for v in value]
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return repr(value)


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    pass


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),  # NULs and lone surrogates included
    st.binary(max_size=20),  # invalid UTF-8 included
    st.builds(bytearray, st.binary(max_size=8)),
    st.just(Level.HIGH),
    st.builds(Text, st.text(max_size=5)),
    st.just(dt.datetime(2026, 12, 5, 4, 0, tzinfo=dt.UTC)),
    st.just(object()),  # kept as its repr, never evaluated
)
keys = st.one_of(st.text(max_size=8), st.integers(), st.builds(Text, st.text(max_size=4)))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=4),
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=8))
def test_json_safe_headers_equals_the_plain_walk(headers: dict[Any, Any]) -> None:
    assert json_safe_headers(headers) == {str(k): _reference(v, 0) for k, v in headers.items()}


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for n in range(levels):
        value = {"k": value, "n": n} if n % 2 else [value, n]
    return value


def test_json_safe_headers_marks_deep_nesting_as_the_plain_walk_does() -> None:
    for levels in (31, 32, 33, 34, 40):
        headers = {"deep": _nested(levels), "x": 1}
        assert json_safe_headers(headers) == {k: _reference(v, 0) for k, v in headers.items()}


def test_death_history_is_the_headers_own_x_death_tables() -> None:
    """The history reuses the converted ``x-death`` entries (tables only, in order)."""
    when = dt.datetime(2026, 12, 5, 4, 0, tzinfo=dt.UTC)
    deaths = [
        {"queue": b"orders", "count": 2, "reason": "rejected", "time": when},
        "not a table",
        {"queue": "orders.retry", "count": 1, "reason": b"\xff\xfe", "time": when},
    ]
    props = BasicProperties(headers={"x-death": deaths, "x-first-death-queue": "orders"})
    letter = _dead_letter("/", "orders.dlq", Basic.Deliver(delivery_tag=1), props, b"{}")
    safe = letter.headers["x-death"]
    assert safe[1] == "not a table"
    assert letter.death_history == [safe[0], safe[2]]
    assert letter.death_history[0]["queue"] == "orders"
    assert letter.death_history[1]["reason"] == {"$bytes": "fffe"}
    assert letter.death_history == [_reference(d, 0) for d in (deaths[0], deaths[2])]
