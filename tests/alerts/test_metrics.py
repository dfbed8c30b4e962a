"""/metrics: Prometheus text format that the client parser reads, token or network access."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from alerts.evaluate import do_evaluate_alerts
from channels_registry.models import Channel, ChannelHealth, ChannelSample
from dashboard.models import ApiToken
from tests.alerts.conftest import set_health
from tests.conftest import make_broker, make_channel, make_user
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    result = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            result[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return result


def scrape(client: Client | None = None, **extra: str) -> str:
    response = (client or Client()).get("/metrics", **extra)  # type: ignore[arg-type]
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def test_metrics_expose_channel_poller_and_alert_series() -> None:
    now = timezone.now()
    channel = make_channel()
    window_point = [now.timestamp(), 7, 2, 3, 2, 0, 12.5, 1000, 990, 980, 4, 1, 30.0, 0, True]
    set_health(
        channel,
        now,
        state="lagging",
        backlog=7,
        in_flight=2,
        consumers=3,
        active_consumers=2,
        oldest_age_s=12.5,
        lag_s=14.0,
        dlq_depth=1,
        poison_depth=0,
        window=[window_point],
    )
    ChannelSample.objects.create(
        channel=channel, taken_at=now, produced=1000, delivered=990, acked=980, dead_lettered=4
    )
    store(channel, letter(), letter())
    do_evaluate_alerts(now)
    series = samples(scrape())
    ch = (("broker", "main-rabbit"), ("channel", "orders"))
    assert series[("dlo_channel_depth_messages", (*ch, ("role", "main")))] == 7
    assert series[("dlo_channel_depth_messages", (*ch, ("role", "dlq")))] == 1
    assert series[("dlo_channel_in_flight_messages", ch)] == 2
    assert series[("dlo_channel_active_consumers", ch)] == 2
    assert series[("dlo_channel_oldest_message_age_seconds", ch)] == 12.5
    assert series[("dlo_channel_lag_seconds", ch)] == 14
    assert series[("dlo_channel_health_state", (*ch, ("state", "lagging")))] == 1
    assert series[("dlo_channel_health_state", (*ch, ("state", "ok")))] == 0
    assert series[("dlo_channel_messages_total", (*ch, ("event", "produced")))] == 1000
    assert series[("dlo_channel_messages_total", (*ch, ("event", "dead_lettered")))] == 4
    assert series[("dlo_dead_letters_unresolved", (*ch, ("role", "dlq")))] == 2
    assert series[("dlo_poller_up", (("broker", "main-rabbit"),))] == 1
    assert series[("dlo_alerts", (("severity", "critical"), ("state", "firing")))] == 1
    assert series[("dlo_alerts_fired_total", ())] == 1
    assert series[("dlo_alert_evaluations_total", ())] == 1
    assert ("dlo_notifications", (("status", "failed"),)) in series


def test_a_deleted_channel_disappears_and_unknown_values_are_absent() -> None:
    now = timezone.now()
    keep = make_channel()
    gone = make_channel(name="Gone", slug="gone", address="gone")
    set_health(keep, now, lag_s=None)
    set_health(gone, now)
    assert 'channel="gone"' in scrape()
    Channel.objects.filter(pk=gone.pk).delete()
    text = scrape()
    assert 'channel="gone"' not in text
    assert "dlo_channel_lag_seconds{" not in text  # unknown is absent, never 0


def test_without_a_token_only_allowed_networks(settings: object) -> None:
    make_channel()
    assert Client().get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 401
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]  # type: ignore[attr-defined]
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 401
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200


def test_bearer_token_from_anywhere_and_403_without_the_viewer_role() -> None:
    viewer = make_user("scraper", "viewer")
    _, raw = ApiToken.issue(viewer, "prometheus")
    outsider = make_user("nobody")
    _, raw_outsider = ApiToken.issue(outsider, "x")
    far = {"REMOTE_ADDR": "203.0.113.9"}
    ok = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}", **far)  # type: ignore[arg-type]
    assert ok.status_code == 200
    bad = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope", **far)  # type: ignore[arg-type]
    assert bad.status_code == 401
    # A sent token is checked even from an allowed network.
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    denied = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw_outsider}", **far)  # type: ignore[arg-type]
    assert denied.status_code == 403


@pytest.mark.slow
def test_scrape_of_1000_channels_is_cheap(django_assert_max_num_queries: object) -> None:
    broker = make_broker()
    now = timezone.now()
    point = [now.timestamp(), 7, 2, 3, 2, 0, 12.5, 1000, 990, 980, 4, 1, 30.0, 0, True]
    channels = Channel.objects.bulk_create(
        [
            Channel(broker=broker, name=f"C{i}", slug=f"c{i}", address=f"q{i}", dlq_address=f"d{i}")
            for i in range(1000)
        ]
    )
    ChannelHealth.objects.bulk_create(
        [
            ChannelHealth(
                channel=c,
                state="ok",
                backlog=i,
                in_flight=1,
                consumers=1,
                active_consumers=1,
                dlq_depth=0,
                poison_depth=0,
                last_sample_at=now,
                updated_at=now,
                window=[point] * 80,
            )
            for i, c in enumerate(channels)
        ]
    )
    ChannelSample.objects.bulk_create(
        [
            ChannelSample(channel=c, taken_at=now - dt.timedelta(seconds=15 * k), produced=k)
            for c in channels
            for k in range(5)
        ]
    )
    # A fixed handful whatever the channel count (+1: replay plans by status; +1: the audit
    # rows the sealer refused).
    with django_assert_max_num_queries(12):  # type: ignore[operator]
        started = time.perf_counter()
        text = scrape()
        elapsed = time.perf_counter() - started
    families = {f.name for f in text_string_to_metric_families(text)}
    assert (
        'dlo_channel_messages_total{broker="main-rabbit",channel="c7",event="produced"} 0.0' in text
    )
    assert "dlo_channel_health_state" in families
    print(f"\n/metrics for 1,000 channels: {elapsed * 1000:.0f} ms, {len(text) / 1024:.0f} KiB")
