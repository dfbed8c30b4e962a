"""What a board row reads of its channel, broker and health, loaded as tuples.

The board shows 100 rows per first screen (every row with ``?all=1``), and building a channel,
a broker and a health instance for each cost twice the query itself (~4 ms of Python per 100
rows on the bench machine, docs/performance.md "Board and groups, round 5"): one model
instance walks every concrete field of its model (~60 for a channel) even when only five are
loaded. ``make_row`` and ``dashboard.board.rows`` read these tuples and model instances alike
(the channel page passes its ``Channel``). ``BoardRow``, the row both build, lives here too,
below ``dashboard.board.page`` and ``dashboard.board.rows``, so neither imports the other for it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from functools import cached_property
from typing import Any, NamedTuple

from django.utils.safestring import SafeString

from channels_registry.charts import sparkline
from channels_registry.health import HealthState
from channels_registry.models import Broker, Channel, ChannelHealth


class RowHealth(NamedTuple):
    """The ``ChannelHealth`` fields a row shows or ranks by (same names and types)."""

    state: str
    severity: int
    stale_at: dt.datetime | None
    updated_at: dt.datetime | None
    last_sample_at: dt.datetime | None
    dlq_flags: Any
    evidence: Any
    spark: Any
    backlog: int | None
    in_flight: int | None
    consumers: int | None
    active_consumers: int | None
    oldest_age_s: float | None
    lag_s: float | None
    dlq_depth: int | None
    dlq_unresolved: int | None
    poison_depth: int | None
    poison_unresolved: int | None
    retry_waiting: int | None
    retry_unknown: str
    drain_rate: float | None
    eta_s: float | None


class RowChannel(NamedTuple):
    """The ``Channel`` fields a row shows, its broker and its health (None: never polled)."""

    pk: int
    name: str
    slug: str
    owner_team: str
    broker: Broker
    health: RowHealth | None


#: The broker fields a row reads (``make_row``: its name, whether it is enabled and
#: ``config_problems()``); the broker is a model instance with only these loaded, one per
#: broker. In the model's field order, as ``Model.from_db`` takes them.
BROKER_FIELDS = tuple(
    f.attname
    for f in Broker._meta.concrete_fields
    if f.attname in {"id", "name", "enabled", "url_env", "url_secret"}
)
CHANNEL_FIELDS = ("id", "name", "slug", "owner_team")


def load_rows(ids: list[int]) -> dict[int, RowChannel]:
    """The enabled channels among ``ids``, by id: one query (channel, broker and health)."""
    columns = [
        *CHANNEL_FIELDS,
        *(f"broker__{f}" for f in BROKER_FIELDS),
        "health__pk",
        *(f"health__{f}" for f in RowHealth._fields),
    ]
    channels = Channel.objects.filter(pk__in=ids, enabled=True).order_by()
    brokers: dict[int, Broker] = {}
    loaded = {}
    start, end = len(CHANNEL_FIELDS), len(CHANNEL_FIELDS) + len(BROKER_FIELDS)
    for values in channels.values_list(*columns):
        broker_values = values[start:end]
        broker = brokers.get(broker_values[0])
        if broker is None:
            broker = brokers[broker_values[0]] = Broker.from_db(
                channels.db, list(BROKER_FIELDS), broker_values
            )
        health = RowHealth._make(values[end + 1 :]) if values[end] is not None else None
        pk, name, slug, team = values[:start]
        loaded[pk] = RowChannel(pk, name, slug, team, broker, health)
    return loaded


@dataclasses.dataclass
class BoardRow:
    channel: Channel | RowChannel
    health: ChannelHealth | RowHealth | None
    state: str
    state_label: str
    evidence: list[str]
    dlq_flags: list[tuple[str, str]]
    severity: int
    spark_points: list[tuple[float, float | None]]
    spark_start: float
    spark_end: float
    last_sample_at: dt.datetime | None
    last_sample_age_s: float | None
    eta: str

    @cached_property
    def spark(self) -> SafeString:
        """Drawn only for rows that are rendered (the SVG is the costly part of a row)."""
        return sparkline(self.spark_points, self.spark_start, self.spark_end)

    @property
    def dom_id(self) -> str:
        return f"ch-{self.channel.pk}"

    @property
    def stale(self) -> bool:
        return self.state in (HealthState.STALE, HealthState.UNKNOWN)
