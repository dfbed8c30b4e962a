"""A realistic incident to look at (issue 15's journeys): channels in several states with an
hour of samples, dead letters stored and awaiting triage, a replay plan, a firing alert and
the audit events all of that wrote. Built through the ORM and the real ingest path; no broker.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from channels_registry.models import ChannelHealth, ChannelRollup, ChannelSample
from channels_registry.polling import ROLLUP_FIELDS
from tests.conftest import make_broker, make_channel
from tests.dlq.conftest import letter, store

MINUTES = 60


def _health(channel: Any, now: dt.datetime, backlogs: list[int], **fields: Any) -> None:
    """An hour of samples, minute rollups, and the health row a poll would have left."""
    start = now - dt.timedelta(minutes=len(backlogs) - 1)
    samples, rollups = [], []
    for i, backlog in enumerate(backlogs):
        at = start + dt.timedelta(minutes=i)
        dlq = fields.get("dlq_series", [0] * len(backlogs))[i]
        poison = fields.get("poison_series", [0] * len(backlogs))[i]
        values = {"backlog": backlog, "in_flight": 3, "consumers": 2, "dlq_depth": dlq,
                  "poison_depth": poison, "produced": 40 * i, "acked": 38 * i}  # fmt: skip
        samples.append(ChannelSample(channel=channel, taken_at=at, **values))
        kept = {k: v for k, v in values.items() if k in ROLLUP_FIELDS}
        rollups.append(
            ChannelRollup(channel=channel, minute=at.replace(second=0, microsecond=0), **kept)
        )
    ChannelSample.objects.bulk_create(samples)
    ChannelRollup.objects.bulk_create(rollups, ignore_conflicts=True)
    known = {f.name for f in ChannelHealth._meta.concrete_fields}
    row = {
        "state": fields.get("state", "ok"),
        "severity": fields.get("severity", 10),
        "dlq_flags": fields.get("dlq_flags", []),
        "evidence": fields.get("evidence", ["backlog steady"]),
        "backlog": backlogs[-1],
        "in_flight": 3,
        "consumers": 2,
        "active_consumers": fields.get("active_consumers", 2),
        "oldest_age_s": fields.get("oldest_age_s", 4.0),
        "dlq_depth": fields.get("dlq_series", [0])[-1],
        "poison_depth": fields.get("poison_series", [0])[-1],
        "dlq_unresolved": fields.get("dlq_unresolved"),
        "poison_unresolved": fields.get("poison_unresolved"),
        "last_sample_at": now,
        "updated_at": now,
        "state_since": start,
        "spark": [
            [int((start + dt.timedelta(minutes=i)).replace(second=0).timestamp()), b]
            for i, b in enumerate(backlogs)
        ],
    }
    ChannelHealth.objects.update_or_create(
        channel=channel, defaults={k: v for k, v in row.items() if k in known}
    )


def incident() -> dict[str, Any]:
    """The scene: returns the objects the journeys open."""
    now = timezone.now()
    broker = make_broker(name="main-rabbit")
    orders = make_channel(broker, alert_dlq_depth=3)
    billing = make_channel(
        broker, name="Billing events", slug="billing", address="billing",
        dlq_address="billing.dlq", poison_address="billing.poison", owner_team="finance",
    )  # fmt: skip
    quiet = make_channel(
        broker, name="Audit mirror", slug="audit-mirror", address="audit.mirror",
        dlq_address="", poison_address="", dlq_strategies=[], alert_dlq_depth=None,
        owner_team="platform",
    )  # fmt: skip
    rising = [100 + 4 * i for i in range(MINUTES)]
    dlq = [0] * 30 + [min(12, i) for i in range(30)]
    poison = [0] * 45 + [min(3, i // 4) for i in range(15)]
    entries = store(orders, *[letter(headers={"x-exception-class": "Timeout"}) for _ in range(4)])
    entries += store(
        orders,
        *[letter(b"\xff\xfe not json", headers={"x-exception-class": "Parse"}) for _ in range(2)],
        source="poison",
    )
    _health(
        orders, now, rising, state="lagging", severity=60, dlq_flags=["dlq-nonempty"],
        evidence=["backlog 336 rose by 236 in 10 min", "0 in the DLQ, 0 poison, 6 stored"],
        dlq_series=[0] * MINUTES, poison_series=[0] * MINUTES, dlq_unresolved=4,
        poison_unresolved=2, oldest_age_s=340.0,
    )  # fmt: skip
    _health(
        billing, now, [20] * MINUTES, state="ok", severity=55, dlq_flags=["dlq-inflow"],
        evidence=["DLQ grew 0 → 12"], dlq_series=dlq, poison_series=poison, dlq_unresolved=0,
        poison_unresolved=0,
    )  # fmt: skip
    _health(quiet, now, [0] * MINUTES, state="idle", severity=5, evidence=["idle"])
    for n in range(12):  # a wide board: enough rows to scroll
        extra = make_channel(
            broker, name=f"Shipment events {n}", slug=f"shipments-{n}", address=f"ship.{n}",
            dlq_address=f"ship.{n}.dlq", owner_team="logistics",
        )  # fmt: skip
        _health(extra, now, [5] * 10, state="ok", severity=10, dlq_unresolved=0)
    from alerts.models import Alert

    Alert.objects.create(
        rule="dlq-depth", key=f"dlq-depth:c{orders.pk}", broker=broker, channel=orders,
        state="firing", severity="warning", summary="6 dead letters waiting > 3",
        value=6, fired_value=6, threshold=3, started_at=now - dt.timedelta(minutes=9),
        fired_at=now - dt.timedelta(minutes=8), last_evaluated_at=now,
    )  # fmt: skip
    return {"orders": orders, "billing": billing, "entries": entries}
