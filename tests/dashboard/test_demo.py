"""The demo: the reference consumer's discipline (no network) and a short run on the real
brokers (declarations audited, dead letters and poison ingested, dedup store bounded)."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from audit.actions import Actor
from audit.models import AuditEvent
from channels_registry.checks import check_channel
from channels_registry.models import Broker, BrokerKind, Channel, ChannelHealth
from dashboard.demo import compare, topology
from dashboard.demo.consumers import (
    KEY_HEADER,
    DedupStore,
    Delivery,
    ReferenceConsumer,
    RetryPolicy,
    Route,
    backoff_delay,
    jitter_fraction,
)
from dashboard.demo.producers import MIX, OrderFactory
from dashboard.demo.runner import Pace
from dlq.models import DeadLetter, Source
from tests.conftest import broker_required

POLICY = RetryPolicy(max_attempts=4, base_s=0.5, factor=2.0, cap_s=4.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def order(key: str = "k-1", attempt: int = 1, **fields: Any) -> Delivery:
    body: dict[str, Any] = {
        "schema_version": "1",
        "order_id": "ord-1",
        "customer": {"id": "cust-0001", "email": "a@example.test"},
        "amount": 10.5,
    }
    body.update(fields)
    return Delivery(json.dumps(body).encode(), {KEY_HEADER: key}, attempt)


def consumer(dedup: DedupStore | None = None) -> ReferenceConsumer:
    return ReferenceConsumer("orders", POLICY, dedup or DedupStore(ttl_s=60, max_size=100))


# --- the dedup store ---------------------------------------------------------------------


def test_dedup_store_evicts_the_least_recently_marked_key_beyond_its_bound() -> None:
    store = DedupStore(ttl_s=3600, max_size=50, clock=Clock())
    for i in range(1000):
        store.mark(f"key-{i}")
    assert len(store) == 50 and store.high_water == 50 and store.evicted == 950
    assert not store.seen("key-949") and store.seen("key-950") and store.seen("key-999")
    store.mark("key-950")  # marked again: now the most recent, so it survives the next insert
    store.mark("key-new")
    assert store.seen("key-950") and not store.seen("key-951")


def test_dedup_store_forgets_keys_after_their_ttl() -> None:
    clock = Clock()
    store = DedupStore(ttl_s=60, max_size=100, clock=clock)
    store.mark("a")
    clock.now += 30
    store.mark("b")
    assert store.seen("a") and store.seen("b")
    clock.now += 31  # a is 61 s old, b 31 s
    assert not store.seen("a") and store.seen("b")
    assert len(store) == 1 and store.expired == 1


def test_dedup_store_refuses_to_be_unbounded() -> None:
    with pytest.raises(ValueError):
        DedupStore(ttl_s=0, max_size=10)
    with pytest.raises(ValueError):
        DedupStore(ttl_s=10, max_size=0)


# --- backoff ------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_never_exceeds_the_cap() -> None:
    for retry, full in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (500, 4.0)):
        assert backoff_delay(retry, 0.5, 2.0, 4.0, 0.0) == full / 2
        assert backoff_delay(retry, 0.5, 2.0, 4.0, 0.999999) == pytest.approx(full, rel=1e-5)
        for _ in range(50):
            delay = backoff_delay(retry, 0.5, 2.0, 4.0, random.random())
            assert full / 2 <= delay <= full <= 4.0


def test_jitter_spreads_messages_but_is_stable_per_attempt() -> None:
    fractions = {jitter_fraction(f"key-{i}", 1) for i in range(200)}
    assert len(fractions) == 200 and all(0 <= f < 1 for f in fractions)
    assert jitter_fraction("key-1", 2) == jitter_fraction("key-1", 2)
    assert min(fractions) < 0.1 and max(fractions) > 0.9


# --- routing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"schema_version": "1", "order_id": "tr',
        b"\xff\xfe\x00 binary",
        b'{"schema_version": "9"}',
    ],
)
def test_poison_is_routed_at_once_and_never_retried(body: bytes) -> None:
    decision = consumer().handle(Delivery(body, {KEY_HEADER: "k"}, attempt=1))
    assert decision.route == Route.POISON
    assert decision.headers["reason"] == "poison"
    assert decision.headers["x-error-class"] == "PoisonMessage"
    assert decision.headers["x-retry-count"] == "0"
    assert decision.headers[KEY_HEADER] == "k"  # the original headers travel with it


def test_a_message_without_idempotency_key_is_poison() -> None:
    decision = consumer().handle(Delivery(order().body, {}, attempt=1))
    assert decision.route == Route.POISON and "Idempotency-Key" in decision.reason


def test_permanent_failure_is_dead_lettered_at_once_with_reason_metadata() -> None:
    decision = consumer().handle(order(customer={"id": "cust-unknown-3"}))
    assert decision.route == Route.DEAD_LETTER and not decision.exhausted
    assert decision.headers["reason"] == "permanent-failure"
    assert decision.headers["x-error-class"] == "CustomerNotFound"
    assert "cust-unknown-3" in decision.headers["x-error-message"]
    assert decision.headers["x-original-address"] == "orders"
    assert decision.headers["x-dead-lettered-at"]


def test_transient_failure_retries_with_backoff_until_the_budget_then_dead_letters() -> None:
    handler = consumer()
    delays = []
    for attempt in (1, 2, 3):
        decision = handler.handle(order(attempt=attempt, demo={"fail_times": 99}))
        assert decision.route == Route.RETRY
        assert decision.headers["x-retry-count"] == str(attempt)
        delays.append(decision.delay_s)
    assert [0.25, 0.5, 1.0] <= delays <= [0.5, 1.0, 2.0]
    last = handler.handle(order(attempt=4, demo={"fail_times": 99}))
    assert last.route == Route.DEAD_LETTER and last.exhausted
    assert last.headers["reason"] == "retry-budget-exhausted"
    assert last.headers["x-error-class"] == "PaymentGatewayUnavailable"
    assert (last.headers["x-retry-count"], last.headers["x-attempts"]) == ("3", "4")


def test_transient_failure_that_recovers_is_processed_once_and_then_deduplicated() -> None:
    dedup = DedupStore(ttl_s=60, max_size=10)
    handler = consumer(dedup)
    assert handler.handle(order(attempt=1, demo={"fail_times": 1})).route == Route.RETRY
    assert not dedup.seen("k-1")  # a failure marks nothing
    assert handler.handle(order(attempt=2, demo={"fail_times": 1})).route == Route.PROCESSED
    assert handler.handle(order(attempt=1)).route == Route.DUPLICATE  # redelivered copy
    assert handler.ledger.booked == 1


def test_dedup_is_per_message_not_per_producer() -> None:
    handler = consumer()
    same_producer = [order(key=f"k-{i}") for i in range(5)]
    assert [handler.handle(d).route for d in same_producer] == [Route.PROCESSED] * 5


# --- producers and pacing ------------------------------------------------------------------


def test_order_factory_produces_the_declared_mix_deterministically() -> None:
    first = [OrderFactory(random.Random(3), max_attempts=4).next() for _ in range(1)]
    again = [OrderFactory(random.Random(3), max_attempts=4).next() for _ in range(1)]
    assert first == again
    factory = OrderFactory(random.Random(3), max_attempts=4)
    kinds = [factory.next().kind for _ in range(4000)]
    for kind, share in MIX.items():
        assert abs(kinds.count(kind) / 4000 - share) < 0.02, kind
    handler = consumer(DedupStore(ttl_s=600, max_size=10_000))
    factory = OrderFactory(random.Random(4), max_attempts=4)
    routes = {}
    for _ in range(400):
        message = factory.next()
        decision = handler.handle(Delivery(message.body, dict(message.headers), attempt=1))
        routes.setdefault(message.kind, set()).add(decision.route)
    assert routes["poison"] == {Route.POISON}
    assert routes["permanent"] == {Route.DEAD_LETTER}
    assert routes["transient"] == {Route.RETRY} and routes["exhaust"] == {Route.RETRY}
    assert routes["duplicate"] == {Route.DUPLICATE}


def test_consumers_are_slow_first_then_catch_up() -> None:
    pace = Pace.for_run(20.0, 60.0)
    assert pace.slow(1.0) and not pace.slow(pace.slow_s + 1)
    assert pace.work_s(1.0) == pytest.approx(1 / 10)  # half the producers' rate
    assert pace.work_s(pace.slow_s + 1) < 1 / 20  # faster than the producers


# --- declarations -----------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", topology.KINDS)
def test_demo_declaration_is_clean_audited_and_idempotent(kind: str) -> None:
    names = topology.names_for("t", kind)
    env, url = topology.URL_ENV[kind]
    found = topology.Found(kind, env, url, reachable=True)
    first = topology.declare(found, names, Actor.system("demo"))
    assert check_channel(first.channel) == []
    assert first.channel.error_count == first.channel.warning_count == 0
    again = topology.declare(found, names, Actor.system("demo"))
    assert again.changed == []
    assert Broker.objects.count() == 1 and Channel.objects.count() == 1
    actions = list(AuditEvent.objects.order_by("seq").values_list("action", flat=True))
    assert actions == ["registry.broker.create", "registry.channel.create"]
    # Any process on the database (make run, a worker) can poll it, without the demo's env.
    assert Broker.objects.get().connection_url() == url
    moved = topology.Found(kind, env, url.replace("127.0.0.1", "localhost"), reachable=True)
    assert topology.declare(moved, names, Actor.system("demo")).changed != []
    assert Broker.objects.get().connection_url() == moved.url


# --- a short run on the real brokers -------------------------------------------------------


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.django_db
def test_demo_runs_traffic_through_every_path_on_the_reachable_brokers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind in topology.KINDS:  # restored after the test: the command sets what is unset
        env, default = topology.URL_ENV[kind]
        monkeypatch.setenv(env, default)
    monkeypatch.setenv(*topology.MANAGEMENT_ENV)
    found = topology.detect(timeout=2.0)
    for item in found:
        if not item.reachable:
            broker_required(item.label, RuntimeError(item.detail))
    prefix = "t" + uuid.uuid4().hex[:8]
    report_path = tmp_path / "report.json"
    try:
        call_command(
            "demo",
            "--seconds", "8",
            "--rate", "40",
            "--prefix", prefix,
            "--seed", "7",
            "--dedup-max", "50",
            "--report", str(report_path),
        )  # fmt: skip
        written = json.loads(report_path.read_text())
        report = {r["broker"]: r for r in written["brokers"]}
        assert set(report) == {f.kind for f in found if f.reachable}
        # The end-of-run comparison: the board agrees with each broker, number by number.
        compared = {c["broker"]: c for c in written["board_vs_broker"]}
        assert set(compared) == set(report)
        for kind, c in compared.items():
            assert c["poll"] == "ok" and c["agrees"], (kind, c)
            assert {r["label"] for r in c["rows"]} == {label for label, _ in compare.NUMBERS}
        for kind, r in report.items():
            channel = Channel.objects.get(slug=topology.names_for(prefix, kind).slug)
            assert channel.error_count == 0
            assert AuditEvent.objects.filter(
                action="registry.channel.create", channel_slug=channel.slug
            ).exists()
            assert r["produced"] > 100 and r["processed"] > 50, r
            assert r["retried"] > 0 and r["dead_lettered"] > 0 and r["poison"] > 0, r
            assert r["duplicates"] > 0, r
            # The bound held and was exercised.
            assert r["dedup_high_water"] <= 50 and r["dedup_evicted"] > 0, r
            # What the consumers routed reached the brokers' DLQ and poison addresses: the
            # dashboard's own ingest found it there.
            entries = DeadLetter.objects.filter(channel=channel)
            assert entries.filter(source=Source.DLQ).exists(), (kind, r)
            assert entries.filter(source=Source.POISON).exists(), (kind, r)
            with_reason = entries.exclude(reason="")
            assert with_reason.exists()
            if kind != BrokerKind.NATS:  # NATS dead letters are the original messages
                assert entries.filter(error_class="CustomerNotFound").exists()
                reasons = set(entries.values_list("reason", flat=True))
                if kind == BrokerKind.RABBITMQ:
                    # Rejected like a real consumer's: the broker's x-death names the reason
                    # (the consumer's own is in the headers) and the history is there.
                    assert reasons <= {"poison", "rejected"}, reasons
                    dead = entries.filter(source=Source.DLQ)
                    assert not dead.filter(death_history=[]).exists()
                else:
                    assert reasons <= {"poison", "permanent-failure", "retry-budget-exhausted"}
    finally:
        for item in found:
            if item.reachable:
                topology.teardown_topology(item, topology.names_for(prefix, item.kind), 2.0)


def test_demo_rabbitmq_consumer_dead_letters_by_rejecting_so_the_broker_records_x_death() -> None:
    """Issue 26.8: the demo's dead letters reach the DLQ the way a real consumer's do (reject,
    requeue=false, through the work queue's DLX), with x-death and the reason headers."""
    import pika

    from dashboard.demo.consumers import RabbitMQConsumerLink

    url = "amqp://guest:guest@127.0.0.1:5672/%2F"
    try:
        pika.BlockingConnection(pika.URLParameters(url + "?socket_timeout=3")).close()
    except Exception as exc:  # any connection failure means the broker is not there
        broker_required("RabbitMQ", exc)
    names = topology.names_for(f"t{uuid.uuid4().hex[:8]}", BrokerKind.RABBITMQ)
    topology._rabbitmq_create(url, names, 5.0)
    try:
        link = RabbitMQConsumerLink(
            url, queue=names.address, retry_queue=names.retry, dead_letter_exchange=names.dlx,
            poison_queue=names.poison, prefetch=10, timeout=5.0,
        )  # fmt: skip
        try:
            link.channel.basic_publish(
                "", names.address, order(customer={"id": "cust-unknown-9"}).body,
                pika.BasicProperties(headers={KEY_HEADER: "k-9"}, delivery_mode=2),
            )  # fmt: skip
            deliveries: list[Delivery] = []
            for _ in range(50):
                deliveries = link.receive(1, 0.1)
                if deliveries:
                    break
            (delivery,) = deliveries
            decision = consumer().handle(delivery)
            assert decision.route == Route.DEAD_LETTER
            link.settle(delivery, decision)
            for _ in range(50):  # the marked copy arrives and is rejected, not processed
                assert link.receive(1, 0.1) == []
                if link.rejected:
                    break
            assert link.rejected == 1
            got = None
            for _ in range(50):
                got = link.channel.basic_get(names.dlq, auto_ack=True)
                if got[0] is not None:
                    break
                link.connection.sleep(0.1)
            assert got is not None and got[0] is not None, "nothing reached the DLQ"
            headers = got[1].headers
            (death,) = headers["x-death"]
            assert death["reason"] == "rejected" and death["queue"] == names.address
            assert headers["x-error-class"] == "CustomerNotFound"
            assert headers["reason"] == "permanent-failure"
        finally:
            link.close()
    finally:
        topology._rabbitmq_delete(url, names, 5.0)


# --- the end-of-run comparison, board vs broker ----------------------------------------------


def test_comparison_verdict_treats_what_the_broker_cannot_tell_as_unknown() -> None:
    assert compare.verdict(5, 5, 5) == compare.AGREE
    assert compare.verdict(6, 5, 8) == compare.AGREE  # moved between the reads
    assert compare.verdict(9, 5, 8) == compare.DIFFER
    assert compare.verdict(None, 5, 5) == compare.DIFFER  # the board hides a known number
    assert compare.verdict(5, None, None) == compare.UNKNOWN
    assert compare.verdict(None, None, None) == compare.UNKNOWN


@pytest.mark.broker
@pytest.mark.django_db
@pytest.mark.parametrize("kind", topology.KINDS)
def test_comparison_agrees_after_a_poll_and_flags_a_stored_number_that_differs(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, default = topology.URL_ENV[kind]
    monkeypatch.setenv(env, default)
    monkeypatch.setenv(*topology.MANAGEMENT_ENV)
    (item,) = [f for f in topology.detect(timeout=2.0) if f.kind == kind]
    if not item.reachable:
        broker_required(item.label, RuntimeError(item.detail))
    names = topology.names_for("t" + uuid.uuid4().hex[:8], kind)
    topology.create_topology(item, names, 2.0)
    try:
        channel = topology.declare(item, names, Actor.system("demo")).channel
        # RabbitMQ's management API lists a new queue within its statistics interval (5 s):
        # until then the board trails what AMQP reads live. Bounded wait, new poll each time.
        first = compare.compare_until_agreed(channel, deadline_s=20.0)
        by_label = {r.label: r for r in first.rows}
        assert first.poll == "ok" and first.agrees, first
        # A fresh, empty topology: the known state, read by the board and the broker alike.
        assert by_label["backlog"].board == by_label["backlog"].broker == 0
        assert by_label["DLQ stored"].board == by_label["DLQ stored"].broker == 0
        # Waiting to retry: the same definition on the board and in the broker's read (NATS
        # and ActiveMQ cannot say: unknown on both sides, never a mismatch).
        retrying = by_label["waiting to retry"]
        if kind in ("nats", "activemq"):
            assert retrying.board is None and retrying.verdict == compare.UNKNOWN
        else:
            assert retrying.board == retrying.broker == 0
        # The board's stored number altered: the comparison (without a new poll) must see it.
        ChannelHealth.objects.filter(channel=channel).update(backlog=7, dlq_unresolved=3)
        second = compare.compare_channel(channel, poll=False, settle_s=0.1)
        verdicts = {r.label: r.verdict for r in second.rows}
        assert not second.agrees
        assert verdicts["backlog"] == verdicts["DLQ stored"] == compare.DIFFER
        assert verdicts["DLQ on broker"] == compare.AGREE
        text = "\n".join(compare.render([second]))
        assert "DIFFER" in text and "backlog" in text
    finally:
        topology.teardown_topology(item, names, 2.0)
