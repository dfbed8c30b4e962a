"""Data for ``bench.pages``, written with PostgreSQL ``COPY`` (never the ORM's INSERTs).

Channels, failure groups, dead letters and the groups' trend hours are streamed with
``COPY … FROM STDIN``; every column a row does not name gets its model default, so a field
added to a model does not break the bench. Health rows come from one real poll of every channel
through a synthetic adapter (the product's own code path), audit events through the real
``record_many`` (itself a COPY) and the real sealer.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

CHANNELS = int(os.environ.get("BENCH_CHANNELS", "10000"))
ENTRIES = int(os.environ.get("BENCH_ENTRIES", "1000000"))
AUDIT_EVENTS = int(os.environ.get("BENCH_AUDIT_EVENTS", "1000000"))
PERSON_EVERY = 50  # one audit event in 50 is a person's; the rest are system ingest events
GROUPS_PER_CHANNEL = 5
#: Dead letters are spread over this many hours back (past both trend windows of 24 h).
SPREAD_H = 72
BROKER = "bench-pages"
REASONS = ["rejected", "expired", "delivery_limit", "retry-budget-exhausted", "poison"]
CLASSES = ["CustomerNotFound", "", "PaymentGatewayUnavailable", "TimeoutError", "PoisonMessage"]


class SyntheticAdapter:
    """Every address exists with plausible numbers; one channel in 40 has no consumer and
    one in 25 a growing backlog, so the board's first screen holds several states."""

    def poll(self, addresses: Any) -> Any:
        from brokers.base import ChannelStats, PollResult

        stats = {}
        for a in addresses:
            n = int(hashlib.md5(a.name.encode()).hexdigest()[:8], 16)
            consumers = 0 if n % 40 == 0 else 2
            stats[a] = ChannelStats(
                address=a,
                backlog=(n % 5000 + (50_000 if n % 25 == 0 else 0)) if a.group else None,
                in_flight=3,
                retained=n % 50,
                consumers=consumers,
                active_consumers=consumers,
            )
        return PollResult(stats, round_trips=1, duration_s=0.001)

    def inspect(self, addresses: Any) -> dict[Any, Any]:
        return {}


def copy_rows(model: Any, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """COPY ``rows`` (values for ``columns``, attnames) into ``model``'s table; each other
    NOT NULL column gets the model's default (JSON as text). Returns the rows written."""
    from django.db import connection, models

    now = dt.datetime.now(dt.UTC)
    rest: list[tuple[str, Any]] = []
    for field in model._meta.concrete_fields:
        if field.primary_key or field.attname in columns or field.null:
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            value: Any = now
        else:
            value = field.get_default()
        if isinstance(field, models.JSONField):
            value = json.dumps(value)
        rest.append((field.attname, value))
    names = [*columns, *(name for name, _ in rest)]
    tail = [value for _, value in rest]
    column = {f.attname: f.column for f in model._meta.concrete_fields}
    quoted = ", ".join(connection.ops.quote_name(column[name]) for name in names)
    written = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        with raw.copy(f"COPY {model._meta.db_table} ({quoted}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([*row, *tail])
                written += 1
    return written


def make_channels() -> Any:
    """The broker (polled every 300 s, so health stays fresh for the whole run: stale after
    15 min) and ``CHANNELS`` channels ``bench-0000``…, then one real poll for their health."""
    from channels_registry.models import Broker, Channel

    started = time.monotonic()
    os.environ["DLO_BROKER_BENCH_PAGES_URL"] = "redis://bench.invalid:6379/0"  # never used
    broker = Broker.objects.create(
        name=BROKER, kind="redis", url_env="DLO_BROKER_BENCH_PAGES_URL", poll_interval_s=300
    )
    columns = ["broker_id", "name", "slug", "address", "address_group", "owner_team",
               "semantic", "dlq_address", "alert_dlq_depth", "redact_json_paths"]  # fmt: skip
    copy_rows(
        Channel,
        columns,
        (
            (broker.pk, f"Bench channel {i:05d}", f"bench-{i:05d}", f"bench.{i:05d}",
             "workers", f"team-{i % 10}", "at-least-once", f"bench.{i:05d}.dlq", 0,
             json.dumps(["$.customer.email"] if i % 2 else []))
            for i in range(CHANNELS)
        ),
    )  # fmt: skip
    poll_health(broker.pk)
    print(f"  {CHANNELS:,} channels (COPY) with health (one poll): "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    return broker


def poll_health(broker_id: int) -> None:
    from channels_registry import polling
    from channels_registry.models import Broker

    Broker.adapter = lambda self, installation=None: SyntheticAdapter()  # type: ignore[method-assign]
    polling.do_poll_broker(broker_id, force=True)


def make_groups(channel_ids: list[int], now: dt.datetime) -> list[list[int]]:
    """``GROUPS_PER_CHANNEL`` failure groups per channel (k-th group, k-th reason); returns
    the group ids per channel, in channel order."""
    from django.db import connection

    from dlq.models import FailureGroup

    rows = (
        (pk, hashlib.sha256(f"{pk}:{k}".encode()).hexdigest(), REASONS[k], CLASSES[k],
         "error <n> while booking order <str>", now - dt.timedelta(hours=SPREAD_H), now)
        for pk in channel_ids
        for k in range(GROUPS_PER_CHANNEL)
    )  # fmt: skip
    columns = ["channel_id", "fingerprint", "reason", "error_class", "normalized_error",
               "first_seen", "last_seen"]  # fmt: skip
    copy_rows(FailureGroup, columns, rows)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT channel_id, id FROM {FailureGroup._meta.db_table} ORDER BY id")
        per_channel: dict[int, list[int]] = {}
        for channel_id, group_id in cursor.fetchall():
            per_channel.setdefault(channel_id, []).append(group_id)
    return [per_channel[pk] for pk in channel_ids]


ENTRY_COLUMNS = [
    "channel_id", "source", "dedupe_key", "body", "body_sha256", "size",
    "content_type", "headers", "reason", "error_class", "error_message", "redelivery_count",
    "first_death_queue", "dead_lettered_at", "ingested_at", "idempotency_key", "is_parseable",
    "group_id", "search_text",
]  # fmt: skip


def _entries(
    channel_ids: list[int], groups: list[list[int]], now: dt.datetime, hours: Counter[Any]
) -> Iterable[tuple[Any, ...]]:
    """The dead letters, spread over channels, groups and ``SPREAD_H`` hours; counts each
    entry's (group, hour) into ``hours`` as ingest does."""
    from dlq.capture.trends import hour_of, windows

    oldest = windows(now)[1]
    spread_s = SPREAD_H * 3600
    for i in range(1, ENTRIES + 1):
        c, turn = i % CHANNELS, i // CHANNELS
        k = turn % GROUPS_PER_CHANNEL
        group_id = groups[c][k]
        at = now - dt.timedelta(seconds=(i * 7919) % spread_s)
        hour = hour_of(at)
        if hour >= oldest:
            hours[(group_id, hour)] += 1
        body = (
            f'{{"order_id": "ord-{i}", "customer": {{"id": "c-{i % 997}", '
            f'"email": "x@example.test"}}, "amount": 12.5}}'
        ).encode()
        yield (
            channel_ids[c], "poison" if turn % 20 == 7 else "dlq", f"bench:{i}", body,
            hashlib.sha256(body).hexdigest(), len(body), "application/json",
            json.dumps({"Idempotency-Key": f"key-{i}", "x-error-class": CLASSES[k]}),
            REASONS[k], CLASSES[k], f"error {i % 7} while booking order 'ord-{i}'", i % 5,
            "bench.queue", at, now, f"key-{i}", True, group_id,
            f'{body.decode().lower()}\nidempotency-key: key-{i}',
        )  # fmt: skip


def make_entries(channel_ids: list[int], groups: list[list[int]], now: dt.datetime) -> None:
    """``ENTRIES`` dead letters and their groups' trend hours (COPY), then the groups'
    counts and samples from them (one UPDATE)."""
    from django.db import connection

    from dlq.models import DeadLetter, EntryState, FailureGroup, GroupHour

    started = time.monotonic()
    hours: Counter[Any] = Counter()
    copy_rows(DeadLetter, ENTRY_COLUMNS, _entries(channel_ids, groups, now, hours))
    # A tenth discarded (every channel's 4th, 14th, … turn), in the state rows the insert
    # trigger made.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {EntryState._meta.db_table} s SET status = 'discarded' "
            f"FROM {DeadLetter._meta.db_table} d WHERE d.id = s.entry_id "
            f"AND (split_part(d.dedupe_key, ':', 2)::bigint / {CHANNELS}) % 10 = 3"
        )
    copy_rows(GroupHour, ["group_id", "hour", "count"], ((g, h, n) for (g, h), n in hours.items()))
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {FailureGroup._meta.db_table} fg
            SET count = x.n, open_count = x.open, sample_id = x.sample,
                first_seen = x.first, last_seen = x.last
            FROM (SELECT d.group_id, count(*) AS n, min(d.id) AS sample,
                         min(d.dead_lettered_at) AS first, max(d.dead_lettered_at) AS last,
                         count(*) FILTER (WHERE s.status NOT IN ('replayed', 'discarded')) AS open
                  FROM {DeadLetter._meta.db_table} d
                  JOIN {EntryState._meta.db_table} s ON s.entry_id = d.id GROUP BY d.group_id) x
            WHERE x.group_id = fg.id
            """
        )
    print(
        f"  {ENTRIES:,} dead letters in {sum(map(len, groups)):,} groups (COPY),"
        f" {len(hours):,} trend hours: {time.monotonic() - started:.1f} s"
    )


def make_audit(user: Any) -> None:
    """``AUDIT_EVENTS`` events (49 in 50 the system's ``dlq.ingest``), sealed."""
    from django.db import transaction

    from audit.actions import Actor, record_many
    from audit.sealer import seal

    started = time.monotonic()
    system = Actor.system()
    person = Actor(user.pk, user.get_username(), "127.0.0.1")
    for start in range(0, AUDIT_EVENTS, 10_000):
        numbers = range(start, min(AUDIT_EVENTS, start + 10_000))
        with transaction.atomic():
            record_many([_ingest_event(n) for n in numbers if n % PERSON_EVERY], actor=system)
            record_many([_discard_event(n) for n in numbers if not n % PERSON_EVERY], actor=person)
        seal(wait=True)
    print(f"  {AUDIT_EVENTS:,} audit events: {time.monotonic() - started:.1f} s")


def _ingest_event(n: int) -> Any:
    from audit.actions import EventSpec

    slug = f"bench-{n % CHANNELS:05d}"
    return EventSpec(
        "dlq.ingest", "channels_registry.channel", n % CHANNELS,
        target_repr=f"{slug} dlq bench.queue.dlq", channel_slug=slug,
        after={"inserted": 50, "duplicates": 0, "source": "dlq"},
    )  # fmt: skip


def _discard_event(n: int) -> Any:
    from audit.actions import EventSpec

    return EventSpec(
        "dlq.discard", "dlq.deadletter", n, target_repr=f"entry {n}",
        channel_slug=f"bench-{n % CHANNELS:05d}", reason="bench",
        after={"status": ["new", "discarded"]},
    )  # fmt: skip


def make_data() -> None:
    """Everything ``bench.pages`` measures, then VACUUM ANALYZE (as autovacuum would have)."""
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from channels_registry.models import Channel

    user = User.objects.create_user("bench-oncall", password=uuid.uuid4().hex)
    user.groups.add(*Group.objects.filter(name__in=["viewer", "oncall", "compliance"]))
    broker = make_channels()
    channel_ids = list(
        Channel.objects.filter(broker=broker).order_by("slug").values_list("pk", flat=True)
    )
    now = dt.datetime.now(dt.UTC)
    make_entries(channel_ids, make_groups(channel_ids, now), now)
    make_audit(user)
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    print(f"  VACUUM ANALYZE: {time.monotonic() - started:.1f} s")
