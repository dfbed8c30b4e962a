"""Many audit events of one shape, cheaply: ``record_uniform``.

A replay batch records thousands of events that share everything (action, actor, target type,
channel, reason, outcome, the plan and its target) but the entry they are about and a few
numbers. ``record_many`` builds each of them from scratch (cleaning, canonical JSON, COPY
values converted one by one); here the shared part is built once per batch through the same
``_event_fields`` as every other event, with a marker in each varying place, and each event's
texts are the template's pieces joined with that event's values. The result is byte for byte
what ``record_many`` would store (``tests/audit/test_uniform.py`` proves it by property test);
whenever it could differ (a value that is not a plain int or str, a marker found in the shared
text) the batch goes through ``record_many`` instead.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from audit import sealer
from audit.mac import event_mac, load_key
from audit.models import AuditEvent
from audit.recording import _COPY_FIELDS, Actor, EventSpec, _event_fields, _text, record_many

# Private-use code points: never produced by the escaping of canonical JSON, and a shared value
# that happens to contain one is detected (the marker count is checked) and falls back.
_MARK = "\ue000dlo-slot-{}\ue001"
_TARGET_ID, _TARGET_REPR = "target_id", "target_repr"

Row = Sequence[Any]  # (target_id, target_repr, *values of ``varying`` in order)


@dataclasses.dataclass
class _Text:
    """A canonical text cut at its slots: ``parts[0] + v0 + parts[1] + v1 + ...``."""

    parts: list[str]
    order: list[int]  # which slot each gap takes

    def fill(self, values: Sequence[str]) -> str:
        parts, order = self.parts, self.order
        out = [parts[0]]
        for n, slot in enumerate(order):
            out.append(values[slot])
            out.append(parts[n + 1])
        return "".join(out)


def _cut(text: str, marks: list[str], quoted: bool) -> _Text | None:
    """``text`` split at the markers (each at most once; ``quoted``: the marker stands for a
    whole JSON value and its quotes go too). None when a marker is there more than once."""
    found: list[tuple[int, int, int]] = []  # (start, end, slot)
    for slot, mark in enumerate(marks):
        needle = json.dumps(mark, ensure_ascii=False) if quoted else mark
        count = text.count(needle)
        if count > 1 or (count == 0 and mark in text):
            return None
        if count:
            start = text.index(needle)
            found.append((start, start + len(needle), slot))
    found.sort()
    parts, order, at = [], [], 0
    for start, end, slot in found:
        parts.append(text[at:start])
        order.append(slot)
        at = end
    parts.append(text[at:])
    return _Text(parts, order)


@dataclasses.dataclass
class UniformEvents:
    """The template of one batch: see the module docstring."""

    columns: dict[str, Any]  # the shared stored fields
    varying: tuple[str, ...]
    index: _Text
    detail: _Text
    after: _Text
    after_order: list[str]  # keys of ``after`` in the order the spec gave them

    @classmethod
    def build(
        cls, spec: EventSpec, varying: Sequence[str], *, actor: Actor, now: dt.datetime
    ) -> UniformEvents | None:
        """None when this shape cannot be templated (then use ``record_many``)."""
        after = dict(spec.after or {})
        if "plan" in varying or any(key not in after for key in varying):
            return None
        marks = [_MARK.format(n) for n in range(len(varying) + 2)]
        for n, key in enumerate(varying):
            after[key] = marks[n + 2]
        columns = _event_fields(
            now=now, actor=actor, action=spec.action, target_type=spec.target_type,
            target_id=marks[0], target_repr=marks[1], channel_slug=spec.channel_slug,
            reason=spec.reason, before=None, after=after, changes=None, outcome=spec.outcome,
        )  # fmt: skip
        if columns["target_id"] != marks[0] or columns["target_repr"] != marks[1]:
            return None  # truncated or altered: cannot be a slot
        after_text = json.dumps(columns["after"], separators=(",", ":"), ensure_ascii=False)
        texts = [
            _cut(columns["index_json"], marks, quoted=True),
            _cut(columns["detail_json"], marks, quoted=True),
            _cut(after_text, marks, quoted=True),
        ]
        if any(t is None for t in texts):
            return None
        index, detail, after_cut = texts
        assert index is not None and detail is not None and after_cut is not None
        if sorted(index.order) != [0] or sorted(detail.order) != list(range(1, len(marks))):
            return None
        if sorted(after_cut.order) != list(range(2, len(marks))):
            return None
        return cls(columns, tuple(varying), index, detail, after_cut, list(after))

    def values(self, row: Row) -> list[str] | None:
        """The JSON text of each slot for one event, cleaned as ``_event_fields`` cleans it;
        None when a value is not a plain int or str (then the batch falls back)."""
        target_id, target_repr, *rest = row
        out = [
            _json_str(_text(str(target_id), 64)),
            _json_str(_text(str(target_repr), 300)),
        ]
        for value in rest:
            if type(value) is int:
                out.append(str(value))
            elif type(value) is str:
                out.append(_json_str(_text(value)))
            else:
                return None
        return out

    def fields(self, row: Row) -> dict[str, Any]:
        """All stored fields of one event (what ``_event_fields`` returns for it)."""
        values = self.values(row)
        assert values is not None
        columns = dict(self.columns)
        columns["target_id"] = json.loads(values[0])
        columns["target_repr"] = json.loads(values[1])
        columns["after"] = json.loads(self.after.fill(values))
        columns["index_json"] = self.index.fill(values)
        columns["detail_json"] = self.detail.fill(values)
        return columns


def _json_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def record_uniform(
    spec: EventSpec, varying: Sequence[str], rows: Sequence[Row], *, actor: Actor
) -> int:
    """``record_many`` for events that differ only in target id, target repr and the
    ``after`` values named in ``varying``: ``spec.after`` holds the shared values (and any
    placeholder for the varying ones), each row is ``(target_id, target_repr, *values)``.
    Same events, same order, same bytes; one COPY of pre-rendered text on PostgreSQL."""
    if not rows:
        return 0
    now = timezone.now()
    template = UniformEvents.build(spec, varying, actor=actor, now=now)
    filled = None
    if template is not None and connection.vendor == "postgresql":
        filled = [template.values(row) for row in rows]
    if template is None or filled is None or any(v is None for v in filled):
        return record_many([_spec(spec, varying, row) for row in rows], actor=actor)
    with transaction.atomic():
        _copy_uniform(template, rows, filled)  # type: ignore[arg-type]
        sealer.after_record(None)
    return len(rows)


def _spec(spec: EventSpec, varying: Sequence[str], row: Row) -> EventSpec:
    after: Mapping[str, Any] = {**(spec.after or {}), **dict(zip(varying, row[2:], strict=True))}
    return dataclasses.replace(spec, target_id=row[0], target_repr=row[1], after=after)


# -- COPY in text format ---------------------------------------------------------------------

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _esc(value: str) -> str:
    """``value`` in COPY's text format (only these four characters are special)."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_ESCAPES)
    return value


def _escaped(text: _Text) -> _Text:
    return _Text([_esc(part) for part in text.parts], text.order)


def _copy_value(field: Any, value: Any) -> str:
    """One column in COPY's text format (``\\N`` for NULL)."""
    if value is None:
        return "\\N"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bool):
        return "t" if value else "f"
    if field.get_internal_type() == "JSONField":
        value = json.dumps(value, ensure_ascii=False)
    return _esc(str(value))


def _copy_uniform(template: UniformEvents, rows: Sequence[Row], filled: list[list[str]]) -> None:
    """One COPY for the batch: the shared columns rendered once, per event only its own."""
    line = [_copy_value(f, template.columns[f.attname]) for f in _COPY_FIELDS]
    names = [f.attname for f in _COPY_FIELDS]
    at = {name: names.index(name) for name in _VARYING_COLUMNS}
    i_id, i_repr, i_after = at["target_id"], at["target_repr"], at["after"]
    i_index, i_detail, i_mac = at["index_json"], at["detail_json"], at["mac"]
    # Escaping is per character: the template's pieces are escaped once, then only the values.
    after = _escaped(template.after)
    index, detail = template.index, template.detail
    key = load_key()
    lines = []
    for row, values in zip(rows, filled, strict=True):
        escaped = [_esc(v) for v in values]
        line[i_id] = _esc(_text(str(row[0]), 64))
        line[i_repr] = _esc(_text(str(row[1]), 300))
        line[i_after] = after.fill(escaped)
        # The MAC is over the texts as stored (unescaped), so these are filled plain.
        index_json, detail_json = index.fill(values), detail.fill(values)
        line[i_index] = _esc(index_json)
        line[i_detail] = _esc(detail_json)
        line[i_mac] = event_mac(index_json, detail_json, key)
        lines.append("\t".join(line))
    lines.append("")
    columns = ", ".join(connection.ops.quote_name(f.column or f.attname) for f in _COPY_FIELDS)
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
    ):
        copy.write("\n".join(lines))


_VARYING_COLUMNS = ("target_id", "target_repr", "after", "index_json", "detail_json", "mac")
