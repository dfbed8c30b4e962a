"""NATS dead-letter capture on the real server: explicit advisory capture, one set of drain
consumers per installation, bounded ack wait, and a stalled drain made visible."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from brokers.base import Address, DeadLetter
from brokers.nats_jetstream import ADVISORY_STREAM, NatsJetStreamAdapter, drain_consumer_name
from channels_registry.models import BrokerKind, Channel, ChannelHealth, installation_id
from channels_registry.polling import do_poll_broker
from dlq.capture import ingest
from dlq.capture.ingest import channels_to_ingest, do_ingest_channel
from dlq.models import DeadLetter as Entry
from tests.alerts.test_metrics import scrape
from tests.conftest import broker_required, make_broker, make_channel

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

NATS_URL = os.environ.get("DLO_TEST_NATS_URL", "nats://127.0.0.1:4222")


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
def stream() -> Iterator[str]:
    """A stream with a durable consumer ``app``; ``_terminate(stream, n)`` kills n messages."""
    name = f"DLO_CAP_{uuid.uuid4().hex[:8]}"

    async def setup(nc: Any) -> None:
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        await js.add_consumer(
            name, ConsumerConfig(durable_name="app", ack_policy=AckPolicy.EXPLICIT)
        )

    try:
        _nats(setup)
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        broker_required("NATS", exc)
    yield name

    async def cleanup(nc: Any) -> None:
        await nc.jetstream().delete_stream(name)
        jsm = nc.jetstream()
        for info in await jsm.consumers_info(ADVISORY_STREAM):
            if name in info.name:
                await jsm.delete_consumer(ADVISORY_STREAM, info.name)

    _nats(cleanup)


def _terminate(stream: str, n: int) -> None:
    async def work(nc: Any) -> None:
        js = nc.jetstream()
        for i in range(n):
            await js.publish(f"{stream.lower()}.orders", b'{"n": %d}' % i)
        sub = await js.pull_subscribe_bind("app", stream)
        done = 0
        while done < n:
            for msg in await sub.fetch(n - done, timeout=5):
                await msg.term()
                done += 1
        await nc.flush()

    _nats(work)


def _drain_all(adapter: NatsJetStreamAdapter, address: Address, n: int) -> list[DeadLetter]:
    got: list[DeadLetter] = []
    with adapter.drain(address) as session:
        for _ in range(10):
            letters = session.fetch(max_batch=100, wait_s=1.0)
            session.ack(letters)
            got += letters
            if len(got) >= n:
                break
    return got


def test_two_installations_on_one_account_each_see_every_advisory(stream: str) -> None:
    address = Address(stream, "app")
    one, two = NatsJetStreamAdapter(NATS_URL), NatsJetStreamAdapter(NATS_URL)
    one.installation_id, two.installation_id = "inst-one", "inst-two"
    one.prepare_drain(address)
    two.prepare_drain(address)
    _terminate(stream, 5)
    first = _drain_all(one, address, 5)
    second = _drain_all(two, address, 5)
    assert len(first) == len(second) == 5
    assert {x.dedupe_key for x in first} == {x.dedupe_key for x in second}
    assert drain_consumer_name(address, "inst-one") != drain_consumer_name(address, "inst-two")


def test_a_new_installation_id_takes_over_from_the_legacy_consumer_without_rereading(
    stream: str,
) -> None:
    address = Address(stream, "app")
    legacy = NatsJetStreamAdapter(NATS_URL)  # before installation ids: dlo_<stream>_<consumer>
    legacy.prepare_drain(address)
    _terminate(stream, 3)
    assert len(_drain_all(legacy, address, 3)) == 3
    _terminate(stream, 2)
    upgraded = NatsJetStreamAdapter(NATS_URL)
    upgraded.installation_id = "inst-up"
    assert len(_drain_all(upgraded, address, 2)) == 2  # only what the legacy one never acked


@pytest.mark.django_db
def test_drain_consumers_have_bounded_ack_wait_and_max_ack_pending(stream: str) -> None:
    address = Address(stream, "app")
    old = NatsJetStreamAdapter(NATS_URL)
    old.installation_id = "inst-bounds"
    old.drain_ack_wait_s, old.drain_max_ack_pending = 60.0, 1000  # what earlier versions left
    old.drain(address).__enter__().close()
    new = NatsJetStreamAdapter(NATS_URL)
    new.installation_id = "inst-bounds"
    new.drain(address).__enter__().close()  # binding brings the bounds up to date

    async def configs(nc: Any) -> list[Any]:
        durable = drain_consumer_name(address, "inst-bounds")
        js = nc.jetstream()
        return [
            (await js.consumer_info(ADVISORY_STREAM, durable + s)).config for s in ("_md", "_term")
        ]

    for config in _nats(configs):
        assert config.ack_wait == new.drain_ack_wait_s == 30.0
        assert config.max_ack_pending == new.drain_max_ack_pending == 20_000


@pytest.mark.django_db
def test_nothing_fetched_while_the_broker_says_n_wait_is_health_evidence_and_a_metric(
    stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLO_BROKER_TEST_CAP_NATS", NATS_URL)
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAP_NATS")
    channel = make_channel(
        broker, address=stream, address_group="app", dlq_address="", nats_advisory_capture=True
    )
    assert channel.pk in channels_to_ingest()
    do_poll_broker(broker.pk)  # the channel's health row
    adapter = ingest.adapter_for(channel)
    adapter.prepare_drain(Address(stream, "app"))
    _terminate(stream, 4)
    # A crashed ingester: it fetched the advisories and never acknowledged them.
    holder = adapter.open_drain(Address(stream, "app"))
    held: list[DeadLetter] = []
    for _ in range(10):
        held += holder.fetch(max_batch=10, wait_s=1.0)
        if len(held) == 4:
            break
    try:
        result = do_ingest_channel(channel.pk)
        assert (result.fetched, result.stalled) == (0, 4)
        health = ChannelHealth.objects.get(channel=channel)
        assert health.ingest_stalled == 4
        do_poll_broker(broker.pk)
        evidence = " ".join(ChannelHealth.objects.get(channel=channel).evidence)
        assert "4 dead letters are waiting, but the last ingest" in evidence
        assert f'dlo_ingest_stalled_dead_letters{{broker="nats",channel="{channel.slug}"}} 4.0' in (
            scrape()
        )
    finally:
        holder.ack(held)
        holder.close()
    assert do_ingest_channel(channel.pk).stalled == 0
    assert ChannelHealth.objects.get(channel=channel).ingest_stalled is None
    assert not Entry.objects.exists()
    assert isinstance(installation_id(), str) and installation_id() == installation_id()
    assert Channel.objects.get(pk=channel.pk).has_dlq


@pytest.mark.django_db
def test_advisory_capture_is_the_nats_channels_dead_letter_declaration() -> None:
    from django.core.exceptions import ValidationError

    from channels_registry.checks import check_channel

    nats = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAP_NATS")
    bare = make_channel(
        nats, slug="bare", address="S", address_group="c", dlq_address="", poison_address=""
    )
    captured = make_channel(
        nats,
        slug="cap",
        address="S",
        address_group="d",
        dlq_address="",
        poison_address="",
        nats_advisory_capture=True,
    )
    assert "no-dlq" in {f.code for f in check_channel(bare)}
    assert "no-dlq" not in {f.code for f in check_channel(captured)}
    assert ingest.drain_addresses(captured) == [(Address("S", "d"), "dlq")]
    assert ingest.drain_addresses(bare) == []
    rabbit = make_broker(name="rabbit")
    with pytest.raises(ValidationError, match="NATS JetStream only"):
        make_channel(rabbit, slug="r", nats_advisory_capture=True)


@pytest.mark.django_db
def test_a_capturing_channels_dlq_depth_is_what_waits_on_its_drain_consumers(
    stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLO_BROKER_TEST_CAP_NATS", NATS_URL)
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_CAP_NATS")
    channel = make_channel(
        broker,
        address=stream,
        address_group="app",
        dlq_address="",
        poison_address="",
        nats_advisory_capture=True,
    )
    assert (
        do_poll_broker(broker.pk).status == "ok"
    )  # before the first ingest: unknown, and not "missing"
    health = ChannelHealth.objects.get(channel=channel)
    assert health.dlq_depth is None
    # The drain consumers come with the first ingest: their absence is no "missing DLQ".
    assert ADVISORY_STREAM not in json.dumps(health.observed_findings)
    ingest.adapter_for(channel).prepare_drain(Address(stream, "app"))
    assert do_ingest_channel(channel.pk).fetched == 0  # creates the drain consumers
    _terminate(stream, 3)
    outcome = do_poll_broker(broker.pk)
    assert outcome.status == "ok", outcome.errors
    assert ChannelHealth.objects.get(channel=channel).dlq_depth == 3
    assert do_ingest_channel(channel.pk).inserted == 3
    do_poll_broker(broker.pk)
    assert ChannelHealth.objects.get(channel=channel).dlq_depth == 0
