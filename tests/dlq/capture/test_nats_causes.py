"""NATS dead letters triaged by cause (issue 22, item 4), with nats-py against the real NATS.

A consumer in the usual shape: poison and permanent failures are copied to the DLQ / poison
stream (the copy names its original with ``Nats-Stream``/``Nats-Sequence``/``Nats-Subject``
and carries the error headers), then ``term``-inated; a transient failure is copied when its
budget is spent and ``nak``-ed once more so ``max_deliver`` gives it up. Two more die without
a copy: one whose body carries its error in fields the channel declares as error metadata,
one whose own headers name the error. Ingest must store one entry per death, grouped by the
application's error, each group of one source, with the ``Content-Type`` header kept.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from brokers.base import Address
from brokers.nats_jetstream import ADVISORY_STREAM, split_term_reason
from channels_registry.models import BrokerKind
from dlq.capture import ingest
from dlq.models import DeadLetter, FailureGroup, Source
from tests.conftest import broker_required, make_broker, make_channel

pytestmark = [pytest.mark.broker, pytest.mark.django_db, pytest.mark.timeout(120)]

NATS_URL = os.environ.get("DLO_TEST_NATS_URL", "nats://127.0.0.1:4222")
BUDGET = 2


def _nats(work: Callable[[Any], Any]) -> Any:
    import nats

    async def run() -> Any:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        try:
            return await work(nc)
        finally:
            await nc.close()

    return asyncio.run(run())


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, str]]:
    """(work stream, DLQ copy stream, poison copy stream) with the durable ``workers``."""
    token = uuid.uuid4().hex[:8]
    names = (f"DLO_CAUSE_{token}", f"DLO_CAUSE_{token}_DLQ", f"DLO_CAUSE_{token}_POISON")
    subjects = (f"cause{token}.orders", f"cause{token}.dlq", f"cause{token}.poison")

    async def setup(nc: Any) -> None:
        js = nc.jetstream()
        for name, subject in zip(names, subjects, strict=True):
            await js.add_stream(name=name, subjects=[subject])
        await js.add_consumer(
            names[0],
            ConsumerConfig(
                durable_name="workers", ack_policy=AckPolicy.EXPLICIT, max_deliver=BUDGET
            ),
        )

    try:
        _nats(setup)
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        broker_required("NATS JetStream", exc)
    monkeypatch.setenv("DLO_BROKER_TEST_CAUSES_NATS", NATS_URL)
    yield names

    async def cleanup(nc: Any) -> None:
        js = nc.jetstream()
        for name in names:
            await js.delete_stream(name)
        for info in await js.consumers_info(ADVISORY_STREAM):
            if names[0] in info.name:
                await js.delete_consumer(ADVISORY_STREAM, info.name)

    _nats(cleanup)


ERROR = {
    "poison": ("PoisonMessage", "body is not JSON"),
    "missing": ("CustomerNotFound", "customer c-7 does not exist"),
    "slow": ("PaymentGatewayUnavailable", "payment gateway answered 503"),
}


def _traffic(names: tuple[str, str, str]) -> None:
    work, _dlq, _poison = names
    token = work.removeprefix("DLO_CAUSE_")

    async def run(nc: Any) -> None:
        js = nc.jetstream()
        subject = f"cause{token}.orders"
        await js.publish(subject, b"\xff not json", headers={"kind": "poison"})
        await js.publish(subject, b'{"customer": "c-7"}', headers={"kind": "missing"})
        await js.publish(subject, b'{"customer": "c-1"}', headers={"kind": "slow"})
        body = {"sku": 12, "error_class": "InventoryLocked", "error_message": "sku 12 locked"}
        await js.publish(subject, json.dumps(body).encode(), headers={"kind": "fields"})
        await js.publish(
            subject,
            b'{"customer": "c-2"}',
            headers={
                "kind": "headers",
                "Content-Type": "application/json",
                "x-error-class": "UpstreamRejected",
                "x-error-message": "upstream said 422",
            },
        )
        sub = await js.pull_subscribe_bind("workers", work)
        for _ in range(20):  # bounded: five messages, the slow one delivered BUDGET times
            try:
                msgs = await sub.fetch(5, timeout=1)
            except TimeoutError:
                break  # on 2.9, MAX_DELIVERIES fires on this next delivery attempt
            for msg in msgs:
                kind = msg.headers["kind"]
                copy_to = {"poison": "poison", "missing": "dlq"}.get(kind)
                if kind == "slow" and msg.metadata.num_delivered >= BUDGET:
                    copy_to = "dlq"
                if copy_to:
                    error_class, error_message = ERROR[kind]
                    headers = {
                        **msg.headers,
                        "reason": "poison" if kind == "poison" else "failed",
                        "x-error-class": error_class,
                        "x-error-message": error_message,
                        "Nats-Stream": msg.metadata.stream,
                        "Nats-Sequence": str(msg.metadata.sequence.stream),
                        "Nats-Subject": msg.subject,
                    }
                    await js.publish(f"cause{token}.{copy_to}", msg.data, headers=headers)
                if kind == "slow":
                    await msg.nak()
                else:
                    await msg.term()
        await nc.flush()

    _nats(run)


@pytest.mark.slow
def test_nats_dead_letters_split_by_the_applications_error(
    streams: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every copy is published before its advisory and before this ingest: no advisory needs
    # to wait for its copy (that wait has its own test below).
    monkeypatch.setattr(ingest, "COPY_WAIT_S", 0.0)
    work, dlq, poison = streams
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAUSES_NATS")
    channel = make_channel(
        broker,
        address=work,
        address_group="workers",
        dlq_address=dlq,
        poison_address=poison,
        nats_advisory_capture=True,
        entry_metadata_fields=["error_class", "error_message"],
        redact_json_paths=[],
    )
    ingest.adapter_for(channel).prepare_drain(Address(work, "workers"))
    _traffic(streams)

    result = ingest.ingest_channel(channel)
    result.add(ingest.ingest_channel(channel))  # advisories a first run had not seen yet

    entries = {e.headers["kind"]: e for e in DeadLetter.objects.filter(channel=channel)}
    # One entry per death: the copies, and the advisories of the two messages without one.
    assert sorted(entries) == ["fields", "headers", "missing", "poison", "slow"]
    assert result.duplicates == 3  # the three copied messages' advisories, skipped
    assert {k: (e.error_class, e.source) for k, e in entries.items()} == {
        "poison": ("PoisonMessage", Source.POISON),
        "missing": ("CustomerNotFound", Source.DLQ),
        "slow": ("PaymentGatewayUnavailable", Source.DLQ),
        "fields": ("InventoryLocked", Source.DLQ),
        "headers": ("UpstreamRejected", Source.DLQ),
    }
    assert entries["fields"].error_message == "sku 12 locked"
    assert entries["headers"].error_message == "upstream said 422"
    assert entries["headers"].content_type == "application/json"
    # A copy replays to where its original was published, not to the copy stream.
    token = work.removeprefix("DLO_CAUSE_")
    assert entries["missing"].properties["subject"] == f"cause{token}.orders"
    groups = FailureGroup.objects.filter(channel=channel)
    assert sorted(g.error_class for g in groups) == sorted(e.error_class for e in entries.values())
    sources = collections.defaultdict(set)
    for entry in entries.values():
        sources[entry.group_id].add(entry.source)
    assert all(len(s) == 1 for s in sources.values())


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("CustomerNotFound: customer c-7 does not exist",
         ("CustomerNotFound", "customer c-7 does not exist")),
        ("payments.errors.Declined: card declined", ("payments.errors.Declined", "card declined")),
        ("the downstream said no", (None, "the downstream said no")),
        ("http://x: not a class", (None, "http://x: not a class")),
        ("", (None, None)),
        (None, (None, None)),
    ],
)  # fmt: skip
def test_a_term_reason_names_the_error_class_when_it_leads_with_one(
    reason: Any, expected: tuple[str | None, str | None]
) -> None:
    """NATS 2.10+ puts the consumer's ``term`` reason in the MSG_TERMINATED advisory (the
    server on this machine, 2.9, does not: its advisories carry no ``reason`` field)."""
    assert split_term_reason(reason) == expected


def test_channels_sharing_one_dlq_stream_each_take_their_own_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = uuid.uuid4().hex[:8]
    shared, works = f"DLO_SHARED_{token}", [f"DLO_SHA_{token}", f"DLO_SHB_{token}"]

    async def setup(nc: Any) -> None:
        js = nc.jetstream()
        await js.add_stream(name=shared, subjects=[f"shared{token}.dlq"])
        for work in works:
            await js.add_stream(name=work, subjects=[f"{work.lower()}.orders"])
        for i, work in enumerate(works * 2):  # two copies per channel, interleaved
            headers = {"Nats-Stream": work, "Nats-Sequence": str(i + 1), "x-error-class": work}
            await js.publish(f"shared{token}.dlq", b"{}", headers=headers)

    try:
        _nats(setup)
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        broker_required("NATS JetStream", exc)
    try:
        monkeypatch.setenv("DLO_BROKER_TEST_CAUSES_NATS", NATS_URL)
        broker = make_broker(
            name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAUSES_NATS"
        )
        channels = [
            make_channel(broker, slug=f"ch{i}", address=work, address_group="workers",
                         dlq_address=shared, poison_address="")
            for i, work in enumerate(works)
        ]  # fmt: skip
        for channel in channels:
            assert ingest.ingest_channel(channel).inserted == 2
        for channel, work in zip(channels, works, strict=True):
            classes = DeadLetter.objects.filter(channel=channel).values_list(
                "error_class", flat=True
            )
            assert list(classes) == [work, work]
    finally:

        async def cleanup(nc: Any) -> None:
            for name in (shared, *works):
                await nc.jetstream().delete_stream(name)

        _nats(cleanup)


def test_an_advisory_ingested_before_its_copy_waits_for_it(
    streams: tuple[str, str, str],
) -> None:
    """The consumer terminates first and copies afterwards (or the copy reaches its drain
    late): the advisory is left for a later run, which finds the copy and stores one entry."""
    work, dlq, _poison = streams
    token = work.removeprefix("DLO_CAUSE_")
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAUSES_NATS")
    channel = make_channel(
        broker, address=work, address_group="workers", dlq_address=dlq, poison_address="",
        nats_advisory_capture=True,
    )  # fmt: skip
    ingest.adapter_for(channel).prepare_drain(Address(work, "workers"))
    held: list[Any] = []

    async def terminate(nc: Any) -> None:
        js = nc.jetstream()
        await js.publish(f"cause{token}.orders", b'{"customer": "c-7"}')
        sub = await js.pull_subscribe_bind("workers", work)
        [msg] = await sub.fetch(1, timeout=2)
        held.append((msg.metadata.sequence.stream, msg.subject))
        await msg.term()
        await nc.flush()

    async def copy(nc: Any) -> None:
        seq, subject = held[0]
        headers = {"x-error-class": "CustomerNotFound", "Nats-Stream": work,
                   "Nats-Sequence": str(seq), "Nats-Subject": subject}  # fmt: skip
        await nc.jetstream().publish(f"cause{token}.dlq", b'{"customer": "c-7"}', headers=headers)

    _nats(terminate)
    first = ingest.ingest_channel(channel)
    assert (first.inserted, first.deferred) == (0, 1)
    assert not DeadLetter.objects.filter(channel=channel).exists()
    _nats(copy)
    second = ingest.ingest_channel(channel)

    assert (second.inserted, second.duplicates) == (1, 1)  # the copy; the advisory it covers
    [entry] = DeadLetter.objects.filter(channel=channel)
    assert entry.error_class == "CustomerNotFound" and entry.dedupe_key.endswith(":copy")


def test_a_group_is_of_one_source_when_nothing_names_the_cause(
    streams: tuple[str, str, str],
) -> None:
    """Two messages terminated without any cause: one unparseable (classified poison by the
    channel's poison-queue contract), one valid JSON (DLQ). Same reason, no error: they used
    to share a group whose source flipped between Poison and DLQ."""
    work = streams[0]
    token = work.removeprefix("DLO_CAUSE_")
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAUSES_NATS")
    channel = make_channel(
        broker, address=work, address_group="workers", dlq_address="", poison_address="",
        nats_advisory_capture=True, dlq_strategies=["ttl-with-backoff", "poison-queue"],
    )  # fmt: skip
    ingest.adapter_for(channel).prepare_drain(Address(work, "workers"))

    async def terminate(nc: Any) -> None:
        js = nc.jetstream()
        for body in (b"\xff not json", b'{"customer": "c-1"}', b"{broken", b'{"customer": 2}'):
            await js.publish(f"cause{token}.orders", body)
        sub = await js.pull_subscribe_bind("workers", work)
        for msg in await sub.fetch(4, timeout=2):
            await msg.term()
        await nc.flush()

    _nats(terminate)
    result = ingest.ingest_channel(channel)
    result.add(ingest.ingest_channel(channel))

    assert result.inserted == 4
    by_group = collections.defaultdict(set)
    for entry in DeadLetter.objects.filter(channel=channel):
        by_group[entry.group_id].add(entry.source)
    assert sorted(map(sorted, by_group.values())) == [[Source.DLQ], [Source.POISON]]
