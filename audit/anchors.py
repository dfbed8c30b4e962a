"""What every stored row must be, decided by its place in the log, never by a flag it carries.

Two events, each written once by a migration, divide the log:

* ``audit.reanchor`` (migration 0004) commits to the format-1 events before it: their number
  N, the last one's seq and hash, and the Merkle root over their leaves. So events #1–#N are
  format 1 (``hash_version=1``, no texts, no plan, no MAC) and every later one is format 2,
  and the re-anchor must be event #N+1, chained to that hash, with that root. The format-1
  events it lists as failing already are reported as such, nothing else.
* ``audit.mac_anchor`` (migration 0007_audit_a_mac) commits to the number of events recorded
  before MACs existed: it must be event #(that number + 1); the events before it carry no MAC,
  and every event after it needs a valid one. Without it, every event needs one.

At most one of each may exist: a second one (inserted later, or with a lower id) is forged,
and nothing else can excuse an event. ``RowRules.check`` applies the rest to each row in seq
order, with ``created_at`` never earlier than the latest before it minus a tolerance.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from django.conf import settings
from django.db.models import Q

from audit.mac import MacChecker, MacKeyError, load_key
from audit.models import AuditEvent

REANCHOR = "audit.reanchor"
MAC_ANCHOR = "audit.mac_anchor"


@dataclasses.dataclass
class Anchors:
    legacy_events: int = 0  # format-1 events are #1–#legacy_events
    reanchor_seq: int | None = None
    legacy_root: str = ""
    tolerated: set[int] = dataclasses.field(default_factory=set)
    mac_anchor_seq: int | None = None
    problem: str = ""
    bad_seq: int | None = None


def _after(detail_json: str) -> dict[str, Any]:
    try:
        after = json.loads(detail_json or "{}").get("after")
    except (ValueError, AttributeError):
        return {}
    return after if isinstance(after, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def find_anchors() -> Anchors:
    """The re-anchor and the MAC anchor of the sealed log, each checked against its own
    commitments that can be checked without walking (the rest happens during the walk)."""
    rows: list[tuple[int, str, str, str]] = [
        (seq or 0, action, prev, detail)
        for seq, action, prev, detail in AuditEvent.objects.filter(seq__isnull=False)
        .filter(Q(action=REANCHOR) | Q(action=MAC_ANCHOR))
        .order_by("seq")
        .values_list("seq", "action", "prev_hash", "detail_json")
    ]
    anchors = Anchors()

    def bad(seq: int, problem: str) -> Anchors:
        anchors.problem, anchors.bad_seq = problem, seq
        return anchors

    reanchors = [r for r in rows if r[1] == REANCHOR]
    mac_anchors = [r for r in rows if r[1] == MAC_ANCHOR]
    for kind, found in ((REANCHOR, reanchors), (MAC_ANCHOR, mac_anchors)):
        if len(found) > 1:
            return bad(
                found[1][0],
                f"a second {kind} event (the log's is #{found[0][0]}): there is only one, "
                "recorded by its migration, so this one is forged",
            )
    if reanchors:
        seq, _, prev, detail = reanchors[0]
        after = _after(detail)
        count = _int(after.get("legacy_events"))
        if count is None or count < 1 or seq != count + 1:
            return bad(
                seq,
                f"the {REANCHOR} event #{seq} is not where the re-anchor put it (it commits to "
                f"{after.get('legacy_events')!r} format-1 events, so it must follow the last "
                "of them): forged or moved",
            )
        if _int(after.get("legacy_head_seq")) != count or after.get("legacy_head_hash") != prev:
            return bad(
                seq,
                f"the {REANCHOR} event #{seq} commits to a format-1 head that is not the "
                "event before it: forged, or the format-1 events were replaced",
            )
        anchors.legacy_events, anchors.reanchor_seq = count, seq
        anchors.legacy_root = str(after.get("legacy_root") or "")
        failures = after.get("legacy_failures") or []
        anchors.tolerated = {f for f in failures if _int(f) is not None and 1 <= f <= count}
    if mac_anchors:
        seq, _, _, detail = mac_anchors[0]
        before = _int(_after(detail).get("events_before"))
        if before is None or seq != before + 1:
            return bad(
                seq,
                f"the {MAC_ANCHOR} event #{seq} is not where its migration put it (it says "
                f"{before!r} events came before it): forged or moved",
            )
        if anchors.reanchor_seq is not None and seq < anchors.reanchor_seq:
            return bad(seq, f"the {MAC_ANCHOR} event #{seq} precedes the re-anchor: forged")
        anchors.mac_anchor_seq = seq
    return anchors


class RowRules:
    """The per-row rules of the walk (format by position, MAC, created_at order). ``check``
    returns the problem with a row, or "" when it is what its place says it must be."""

    def __init__(self, anchors: Anchors) -> None:
        self.legacy = anchors.legacy_events
        self.reanchor_seq = anchors.reanchor_seq
        self.mac_anchor = anchors.mac_anchor_seq
        self.tolerance = dt.timedelta(seconds=settings.DLO_AUDIT_CLOCK_TOLERANCE_S)
        self.latest: dt.datetime | None = None
        self.notes: list[str] = []
        self.mac_ok: MacChecker | None = None
        try:
            self.mac_ok = MacChecker(load_key())
        except MacKeyError as exc:
            self.notes.append(f"event MACs not checked: {exc}")

    def check_format(
        self, seq: int, hash_version: int, index_json: bytes, detail_json: bytes, plan_id: str
    ) -> str:
        """Before the row's hash is checked: is it stored in the format its place requires?"""
        if seq <= self.legacy:
            if hash_version != 1 or index_json or detail_json or plan_id:
                return (
                    f"event #{seq} is one of the {self.legacy} format-1 events the re-anchor "
                    f"(#{self.reanchor_seq}) commits to, but is not stored as one: modified"
                )
        elif hash_version != 2 or not index_json or not detail_json:
            where = (
                f"the re-anchor (#{self.reanchor_seq}) commits to {self.legacy} format-1 events"
                if self.reanchor_seq
                else "the log was never re-anchored (it has no format-1 events)"
            )
            return (
                f"event #{seq} is stored as format {hash_version} but {where}: a format "
                "downgrade, so its searchable columns escape the check (modified)"
            )
        return ""

    def check_origin(
        self, seq: int, index_json: bytes, detail_json: bytes, mac: str, created_at: dt.datetime
    ) -> str:
        """After the row's hash verified: did the application write it, and when?"""
        if self.mac_anchor is not None and seq < self.mac_anchor:
            if mac:
                return (
                    f"event #{seq} carries a MAC but precedes the MAC anchor #{self.mac_anchor}, "
                    "which the migration recorded before any MAC existed: the anchor is forged"
                )
        elif (
            self.mac_anchor != seq
            and self.mac_ok is not None
            and not self.mac_ok(mac, index_json, detail_json)
        ):
            return (
                f"event #{seq} has no valid MAC: it was not written by the application "
                "(inserted into the database directly)"
            )
        latest = self.latest
        if latest is not None and created_at < latest - self.tolerance:
            behind = (latest - created_at).total_seconds()
            return (
                f"event #{seq} is dated {behind:.0f} s before an earlier event (tolerance "
                f"{self.tolerance.total_seconds():.0f} s): misdated, or inserted out of order"
            )
        if latest is None or created_at > latest:
            self.latest = created_at
        return ""
