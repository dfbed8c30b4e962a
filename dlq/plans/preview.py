"""The preview of a bulk action (replay or discard) and what a plan freezes.

Which entries a selection means (exactly the list filter's queryset, or an explicit id list),
where they would go (the channel declaration: RabbitMQ queue, Redis stream, NATS stream), and
what the declaration warns about. Nothing changes here; ``dlq.plans.actions.do_create_plan`` freezes
the ids this module orders, and ``dlq.plans.relay`` works through them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from brokers.base import Address
from channels_registry import schemas
from channels_registry.models import (
    Channel,
    ChannelHealth,
    Ordering,
    Semantic,
)
from dlq.models import (
    REPEAT_OFFENDER_REPLAYS,
    DeadLetter,
    PlanKind,
    ReplayItem,
    Source,
    Status,
)
from dlq.text import render
from dlq.triage.filters import EntryFilter, parse_id

DEFAULT_VELOCITY = 100.0
MAX_VELOCITY = 100_000.0
ID_CHUNK = 5_000
# Entries a new plan cannot include: already in a plan's hands, or without a payload.
REPLAY_EXCLUDED = {"replaying": "already being replayed by another plan", "purged": "purged"}


# -- selection and preview -------------------------------------------------------------------


@dataclasses.dataclass
class Selection:
    """Which entries: an explicit id list (one entry, or checkboxes on the list), else the
    list filter (which includes "a failure group": ``group=<id>``)."""

    filter: EntryFilter
    ids: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def from_params(cls, params: Any) -> Selection:
        raw: list[str] = []
        getlist = getattr(params, "getlist", None)
        values = getlist("id") if getlist else params.get("id", [])
        for value in [values] if isinstance(values, str | int) else values:
            raw.extend(str(value).split(","))
        ids = sorted({pk for pk in map(parse_id, raw) if pk is not None})
        return cls(EntryFilter.from_params(params), ids[:10_000])

    @property
    def mode(self) -> str:
        if self.ids:
            return "one" if len(self.ids) == 1 else "selection"
        return "group" if self.filter.group and len(self.filter.params()) == 1 else "filter"

    def queryset(self, entries: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        if self.ids:
            return entries.filter(pk__in=self.ids)
        return self.filter.apply(entries)

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "ids": self.ids[:1000], "filter": self.filter.params()}

    def params(self) -> list[tuple[str, str]]:
        """Hidden form fields that reproduce this selection."""
        if self.ids:
            return [("id", ",".join(str(i) for i in self.ids))]
        return list(self.filter.params().items())


@dataclasses.dataclass
class Warn:
    code: str
    message: str
    level: str = "warn"  # "block" | "warn" | "info"
    count: int | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Preview:
    kind: str
    selection: Selection
    channel: Channel | None = None
    matched: int = 0
    eligible: int = 0
    excluded: dict[str, int] = dataclasses.field(default_factory=dict)
    target: Address | None = None
    warnings: list[Warn] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return any(w.level == "block" for w in self.warnings)

    @property
    def ok(self) -> bool:
        return not self.errors and self.eligible > 0

    def needs_approval(self, override: bool) -> bool:
        return override or self.eligible > settings.DLO_FOUR_EYES_THRESHOLD

    @property
    def target_display(self) -> str:
        return str(self.target) if self.target else "—"

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "channel": self.channel.slug if self.channel else None,
            "selection": self.selection.as_json(),
            "matched": self.matched,
            "eligible": self.eligible,
            "excluded": self.excluded,
            "target": str(self.target) if self.target else None,
            "warnings": [w.as_json() for w in self.warnings],
            "blocked": self.blocked,
            "needs_approval": self.needs_approval(False),
            "four_eyes_threshold": settings.DLO_FOUR_EYES_THRESHOLD,
            "errors": self.errors,
        }


def replay_target(channel: Channel) -> Address | None:
    """Where a replay of this channel goes, from its declaration only: the channel's own queue
    (RabbitMQ, default exchange), stream (Redis) or stream (NATS; each message to the subject
    the stream stored it under). Allowlisted alternative targets are not offered yet."""
    if not channel.address:
        return None
    return Address(channel.address)


def held_by_open_plans() -> Exists:
    """An entry an unfinished plan still holds (see ``HOLDING_ITEMS``), for ``~`` filters."""
    from dlq.models.plans import FINISHED, HOLDING_ITEMS

    return Exists(
        ReplayItem.objects.filter(entry=OuterRef("pk"), status__in=HOLDING_ITEMS).exclude(
            plan__status__in=FINISHED
        )
    )


#: The statuses a new plan of each kind may take an entry in: a replay takes none being
#: replayed, a discard none being replayed or already discarded.
PLANNABLE = {
    PlanKind.REPLAY: (Status.NEW, Status.REPLAYED, Status.FAILED, Status.DISCARDED),
    PlanKind.DISCARD: (Status.NEW, Status.REPLAYED, Status.FAILED),
}


def plannable_entries(kind: str, entries: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
    """Entries whose own state lets a new plan take them (not yet whether a plan holds them)."""
    entries = entries.filter(state__status__in=PLANNABLE[PlanKind(kind)])
    return entries if kind == PlanKind.DISCARD else entries.filter(purged_at__isnull=True)


def eligible_entries(kind: str, entries: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
    """Entries a new plan may take: one open plan per entry at a time."""
    return plannable_entries(kind, entries).filter(~held_by_open_plans())


def _version_key(value: str) -> tuple[int, ...] | None:
    parts = value.lstrip("vV").split(".")
    digits = all(p.isascii() and p.isdigit() for p in parts)  # "²".isdigit() is true
    return tuple(int(p) for p in parts) if digits else None


def _older(version: str, current: str) -> bool:
    a, b = _version_key(version), _version_key(current)
    return a < b if a is not None and b is not None else version != current


def replayed_before_q() -> Q:
    """Entries some earlier plan already published (or tried to), or whose replay came back."""
    tried = ReplayItem.objects.filter(entry=OuterRef("pk"), attempts__gt=0)
    child = DeadLetter.objects.filter(parent=OuterRef("pk"))
    return (
        Q(state__status__in=[Status.REPLAYED, Status.FAILED]) | Q(Exists(tried)) | Q(Exists(child))
    )


def _older_schema_warnings(channel: Channel, entries: QuerySet[DeadLetter]) -> list[Warn]:
    """Entries carrying a schema version older than the channel's current one."""
    if not channel.schema_version:
        return []
    older = 0
    rows = entries.exclude(schema_version="").values("schema_version").annotate(n=Count("id"))
    for row in rows.order_by()[:1000]:
        if _older(row["schema_version"], channel.schema_version):
            older += row["n"]
    if not older:
        return []
    return [
        Warn(
            "schema_older",
            f"{older:,} entr{'y carries' if older == 1 else 'ies carry'} a schema version "
            f"older than the channel's current v{channel.schema_version}.",
            count=older,
        )
    ]


def _replay_warnings(
    channel: Channel, entries: QuerySet[DeadLetter], counts: dict[str, int]
) -> list[Warn]:
    """Warnings the declaration implies for replaying ``entries`` (already eligible), with the
    counts ``_eligible_counts`` took in its one scan."""
    warnings: list[Warn] = []
    semantic = channel.semantic
    if semantic == Semantic.AT_MOST_ONCE:
        warnings.append(
            Warn(
                "at_most_once",
                "The channel is declared at-most-once: its consumers may not tolerate a second "
                "delivery. Replay is blocked unless you override it with a reason (and a second "
                "person approves).",
                "block",
            )
        )
    elif not semantic:
        warnings.append(Warn("semantic_unstated", "The channel states no delivery semantic."))
    missing = counts["missing"]
    if missing and semantic != Semantic.AT_MOST_ONCE:
        warnings.append(
            Warn(
                "missing_idempotency_key",
                f"{missing:,} entr{'y has' if missing == 1 else 'ies have'} no idempotency key "
                "on an at-least-once channel: a consumer cannot recognise them as duplicates.",
                count=missing,
            )
        )
    again = counts["again"]
    if again:
        warnings.append(
            Warn(
                "replayed_before",
                f"{again:,} entr{'y was' if again == 1 else 'ies were'} replayed before: "
                "another copy may already have been processed.",
                count=again,
            )
        )
    offenders = counts["offenders"]
    if offenders:
        warnings.append(
            Warn(
                "repeat_offender",
                f"{offenders:,} entr{'y has' if offenders == 1 else 'ies have'} come back after "
                f"{REPEAT_OFFENDER_REPLAYS} or more replays (repeat offenders).",
                count=offenders,
            )
        )
    poison = counts["poison"]
    if poison:
        warnings.append(
            Warn(
                "poison",
                f"{poison:,} poison entr{'y' if poison == 1 else 'ies'} (unparseable or "
                "schema-invalid): they will fail again unless the consumer was fixed.",
                count=poison,
            )
        )
    warnings.extend(_ordering_warnings(channel, entries))
    warnings.extend(_older_schema_warnings(channel, entries))
    warnings.extend(_schema_warnings(channel, entries))
    health = ChannelHealth.objects.filter(channel=channel).values("consumers").first()
    consumers = health["consumers"] if health else None
    if consumers == 0:
        warnings.append(
            Warn(
                "no_consumers",
                "The target has no consumers right now: replayed messages will wait there.",
            )
        )
    elif consumers is None:
        warnings.append(Warn("consumers_unknown", "The target's consumers are unknown.", "info"))
    return warnings


SCHEMA_CHECK_LIMIT = 2_000


def _schema_warnings(channel: Channel, entries: QuerySet[DeadLetter]) -> list[Warn]:
    """Entries whose body fails the channel's schema as registered *today* (its declared
    version): replayed, they will fail the consumer again (P1/P9). Bounded: the first
    ``SCHEMA_CHECK_LIMIT`` entries are validated, and the warning says so when it stopped."""
    current = schemas.schema_for(channel)
    if current is None:
        return []
    failing, checked, example = 0, 0, None
    rows = entries.exclude(body=None).order_by("pk").values_list("body", flat=True)
    for body in rows[:SCHEMA_CHECK_LIMIT]:
        checked += 1
        document = render.parse_json(bytes(body or b""))
        problem = schemas.validate(current.schema, document) if render.is_parsed(document) else None
        if problem is not None:
            failing += 1
            example = example or problem
    if not failing or example is None:
        return []
    scope = f" (of the first {checked:,} checked)" if checked >= SCHEMA_CHECK_LIMIT else ""
    return [
        Warn(
            "schema_invalid",
            f"{failing:,} entr{'y fails' if failing == 1 else 'ies fail'}{scope} today's schema "
            f"{current.name} v{current.version} (e.g. at {example.path}: {example.message}): "
            "the consumer will reject them again.",
            count=failing,
        )
    ]


ORDER_KEY_CHECK_LIMIT = 5_000


def _ordering_warnings(channel: Channel, entries: QuerySet[DeadLetter]) -> list[Warn]:
    ordering = channel.ordering
    if ordering in (Ordering.PER_KEY, Ordering.FIFO_GROUP):
        warnings = [
            Warn(
                "ordered",
                f"The channel is ordered {channel.get_ordering_display().lower()}: entries are "
                "replayed in their original dead-letter order, which keeps the order within "
                "every key. Messages of the same key published since will arrive before them.",
                "info",
            )
        ]
        unknown, checked = _unknown_order_keys(channel, entries)
        if unknown:
            scope = "" if checked is None else f" (of the first {checked:,} checked)"
            warnings.append(
                Warn(
                    "ordering_key_unknown",
                    f"{unknown:,} entr{'y has' if unknown == 1 else 'ies have'} no "
                    f"{channel.ordering_key or 'ordering'} key{scope}: their order relative "
                    "to their key's other messages cannot be kept.",
                    count=unknown,
                )
            )
        return warnings
    if ordering == Ordering.GLOBAL:
        return [
            Warn(
                "ordered_global",
                "The channel promises global order: a replay delivers these messages after "
                "everything published since, so global order cannot be kept.",
            )
        ]
    return []


def _unknown_order_keys(channel: Channel, entries: QuerySet[DeadLetter]) -> tuple[int, int | None]:
    """Entries whose ordering key is in neither a header nor a top-level JSON field. Bodies are
    parsed for at most ``ORDER_KEY_CHECK_LIMIT`` entries (the count says when it stopped)."""
    from dlq.text import render

    key = channel.ordering_key.strip().lstrip("$").lstrip(".")
    if not key:
        return entries.count(), None
    candidates = entries.exclude(headers__has_key=key).filter(purged_at__isnull=True)
    unknown = 0
    rows = candidates.values_list("body", flat=True).iterator(chunk_size=500)
    for checked, body in enumerate(rows, start=1):
        document = render.parse_json(bytes(body)) if body is not None else None
        if not (isinstance(document, dict) and key in document):
            unknown += 1
        if checked >= ORDER_KEY_CHECK_LIMIT:
            return unknown, checked
    return unknown, None


def _eligible_counts(kind: str, eligible: QuerySet[DeadLetter]) -> dict[str, int]:
    """The eligible entries and, for a replay, the ones each count warning is about: one scan
    of the selection with a FILTER per count (each was a COUNT of its own; at a million
    entries, each a scan)."""
    counts: dict[str, Any] = {"eligible": Count("pk")}
    if kind == PlanKind.REPLAY:
        counts |= {
            "missing": Count("pk", filter=Q(missing_idempotency_key=True)),
            "again": Count("pk", filter=replayed_before_q()),
            "offenders": Count("pk", filter=Q(generation__gte=REPEAT_OFFENDER_REPLAYS)),
            "poison": Count("pk", filter=Q(source=Source.POISON)),
        }
    return {k: int(v or 0) for k, v in eligible.order_by().aggregate(**counts).items()}


def _excluded(kind: str, chosen: QuerySet[DeadLetter], left_out: int) -> dict[str, int]:
    """Why ``left_out`` matched entries cannot be planned, by reason, in one scan: the entry's
    own state first; whatever remains is held by another open plan."""
    if kind == PlanKind.DISCARD:
        own = chosen.order_by().aggregate(
            discarded=Count("pk", filter=Q(state__status=Status.DISCARDED)),
            replaying=Count("pk", filter=Q(state__status=Status.REPLAYING)),
        )
        labels = {"discarded": "already discarded", "replaying": "being replayed"}
    else:
        own = chosen.order_by().aggregate(
            replaying=Count("pk", filter=Q(state__status=Status.REPLAYING)),
            purged=Count(
                "pk", filter=~Q(state__status=Status.REPLAYING) & Q(purged_at__isnull=False)
            ),
        )
        labels = {"replaying": "being replayed", "purged": "payload purged"}
    excluded = {labels[k]: int(v or 0) for k, v in own.items()}
    excluded["in another open plan"] = left_out - sum(excluded.values())
    return {k: v for k, v in excluded.items() if v > 0}


def build_preview(kind: str, selection: Selection, entries: QuerySet[DeadLetter]) -> Preview:
    """What a replay or discard of ``selection`` would do. ``entries`` is the caller's
    permitted queryset (``dlq.triage.access.entries_for_user``)."""
    result = Preview(kind, selection)
    chosen = selection.queryset(entries)
    channels = list(chosen.order_by().values_list("channel_id", flat=True).distinct()[:2])
    result.matched = chosen.count()  # alone: a selection spanning channels stops here
    if not result.matched:
        result.errors.append("No entries match this selection.")
        return result
    if len(channels) > 1:
        result.errors.append("The selection spans several channels: filter on one channel.")
        return result
    channel = Channel.objects.select_related("broker").get(pk=channels[0])
    result.channel = channel
    eligible = eligible_entries(kind, chosen)
    counts = _eligible_counts(kind, eligible)
    result.eligible = counts["eligible"]
    if result.eligible != result.matched:
        result.excluded = _excluded(kind, chosen, result.matched - result.eligible)
    if kind == PlanKind.REPLAY:
        result.target = replay_target(channel)
        if result.target is None:
            result.errors.append("The channel declares no address to replay to.")
        if result.eligible:
            result.warnings = _replay_warnings(channel, eligible, counts)
    if not result.eligible and not result.errors:
        result.errors.append("None of the matching entries can be " + kind + "ed.")
    return result


def ids_digest(ids: Iterable[int]) -> str:
    digest = hashlib.sha256()
    for pk in ids:
        digest.update(f"{pk},".encode())
    return digest.hexdigest()
