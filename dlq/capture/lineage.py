"""Lineage at ingest: a dead letter that carries one of our replay ids is a replay that died
again, linked to the entry it was replayed from."""

from __future__ import annotations

from collections.abc import Iterable

from dlq.models import DeadLetter, ReplayItem
from dlq.models.plans import REPLAY_ID_HEADER, parse_replay_id


def link_replayed_parents(entries: Iterable[DeadLetter]) -> None:
    """Lineage at ingest: an entry carrying an ``x-dlq-replay-id`` of one of our plans is a
    replay that dead-lettered again. Point it at the entry it was replayed from and count the
    generation (one query per batch). Unknown or forged ids are ignored."""
    wanted: dict[int, list[tuple[DeadLetter, int]]] = {}  # item id -> (entry, plan id)
    for entry in entries:
        value = next(
            (v for k, v in (entry.headers or {}).items() if k.lower() == REPLAY_ID_HEADER), None
        )
        parsed = parse_replay_id(value)
        if parsed is not None:
            wanted.setdefault(parsed[1], []).append((entry, parsed[0]))
    if not wanted:
        return
    rows = ReplayItem.objects.filter(pk__in=list(wanted)).values_list(
        "pk", "plan_id", "entry_id", "entry__generation", "entry__channel_id"
    )
    for item_id, plan_id, parent_id, generation, channel_id in rows:
        for entry, claimed_plan in wanted[item_id]:
            if channel_id == entry.channel_id and claimed_plan == plan_id:
                entry.parent_id = parent_id
                entry.generation = generation + 1
