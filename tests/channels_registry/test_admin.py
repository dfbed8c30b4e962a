"""Declaring brokers and channels in the admin: validation, findings, audit, secrets."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

from audit.models import AuditEvent
from channels_registry.models import Broker, Channel
from tests.conftest import GOOD_CONTRACT, client_for, make_broker, make_channel

pytestmark = pytest.mark.django_db


def channel_post(broker: Broker, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "broker": broker.pk,
        "name": "Orders",
        "slug": "orders",
        "address": "orders",
        "owner_team": "payments",
        "enabled": "on",
        "dedup_scope": "per-medium",
        "redact_json_paths": "$.customer.email",
        "redact_headers": "",
    }
    for key, value in GOOD_CONTRACT.items():
        if isinstance(value, bool):
            if value:
                data[key] = "on"
        elif isinstance(value, list):
            data[key] = value
        else:
            data[key] = value
    data["dedup_scope"] = "per-message"
    data["dedup_store_shared"] = "on"
    data["dlq_records_reason"] = "on"
    # The alert rule overrides inline (alerts app): none.
    data["alert_overrides-TOTAL_FORMS"] = "0"
    data["alert_overrides-INITIAL_FORMS"] = "0"
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def test_registry_admin_declares_a_broker_with_a_secret_never_rendered(
    registry_admin: User,
) -> None:
    client = client_for(registry_admin)
    response = client.post(
        "/admin/channels_registry/broker/add/",
        {
            "name": "rabbit",
            "kind": "rabbitmq",
            "url_env": "",
            "url_secret": "amqp://svc:hunter2@mq.internal:5672/%2F",
            "management_url": "",
            "enabled": "on",
            "poll_interval_s": 15,
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    broker = Broker.objects.get(name="rabbit")
    assert broker.connection_url().endswith("@mq.internal:5672/%2F")
    page = client.get(f"/admin/channels_registry/broker/{broker.pk}/change/").content.decode()
    assert "hunter2" not in page
    event = AuditEvent.objects.get(action="registry.broker.create")
    assert "hunter2" not in str(event.after) and event.actor_username == "rita"
    # Saving again with the secret left blank keeps it.
    response = client.post(
        f"/admin/channels_registry/broker/{broker.pk}/change/",
        {
            "name": "rabbit",
            "kind": "rabbitmq",
            "url_env": "",
            "url_secret": "",
            "management_url": "",
            "enabled": "on",
            "poll_interval_s": 30,
        },
    )
    assert response.status_code == 302
    broker.refresh_from_db()
    assert "hunter2" in broker.url_secret and broker.poll_interval_s == 30
    update = AuditEvent.objects.get(action="registry.broker.update")
    assert update.changes == {"poll_interval_s": [15, 30]}


def test_broker_field_errors_are_clear(registry_admin: User) -> None:
    response = client_for(registry_admin).post(
        "/admin/channels_registry/broker/add/",
        {
            "name": "r",
            "kind": "redis",
            "url_env": "",
            "url_secret": "amqp://x",
            "management_url": "http://x",
            "poll_interval_s": 1,
        },
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "A Redis Streams URL starts with redis://" in page
    assert "Only RabbitMQ (management or Prometheus) and NATS (monitoring port) brokers" in page
    assert "Ensure this value is greater than or equal to 5." in page
    assert not Broker.objects.exists()


def test_channel_declared_in_admin_gets_findings_and_audit(registry_admin: User) -> None:
    broker = make_broker()
    client = client_for(registry_admin)
    response = client.post(
        "/admin/channels_registry/channel/add/",
        channel_post(broker, semantic="", alert_dlq_depth=""),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    channel = Channel.objects.get(slug="orders")
    assert channel.error_count == 2
    assert {f["code"] for f in channel.findings} >= {"semantic-unstated", "dlq-no-alert"}
    assert channel.redact_json_paths == ["$.customer.email"]
    change_page = client.get(f"/admin/channels_registry/channel/{channel.pk}/change/")
    assert "The delivery semantic is not stated." in change_page.content.decode()
    event = AuditEvent.objects.get(action="registry.channel.create")
    assert event.channel_slug == "orders"
    assert "semantic-unstated" in event.after["findings"]


def test_channel_field_errors_are_clear(registry_admin: User) -> None:
    broker = make_broker(kind="redis", url_env="DLO_BROKER_REDIS_URL")
    response = client_for(registry_admin).post(
        "/admin/channels_registry/channel/add/",
        channel_post(
            broker,
            address_group="",
            idempotency_source="json-path",
            idempotency_key="order.id",
            backoff_factor="0.5",
            dlq_address="orders",
        ),
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "A Redis Streams channel needs its consumer group." in page
    assert "A JSON path starts with $." in page
    assert "A backoff factor below 1 shrinks the delay" in page
    assert "Must differ from the channel&#x27;s own address." in page
    assert not Channel.objects.exists()


def test_channel_delete_is_audited(registry_admin: User) -> None:
    channel = make_channel()
    response = client_for(registry_admin).post(
        f"/admin/channels_registry/channel/{channel.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302
    event = AuditEvent.objects.get(action="registry.channel.delete")
    assert event.target_id == str(channel.pk) and event.before["address"] == "orders"


def test_viewer_cannot_use_the_admin(viewer: User) -> None:
    response = client_for(viewer).get("/admin/channels_registry/channel/add/")
    assert response.status_code == 302  # to the login page: not staff


def test_management_url_is_for_rabbitmq_and_nats_only() -> None:
    def errors(kind: str, management_url: str) -> dict[str, list[str]]:
        broker = Broker(
            name="b", kind=kind, url_env="DLO_BROKER_X_URL", management_url=management_url
        )
        try:
            broker.clean()
        except ValidationError as exc:
            return exc.message_dict
        return {}

    assert errors("nats", "http://127.0.0.1:8222") == {}
    assert errors("nats", "https://nats.internal:8222/jsz?acc=APP") == {}
    assert "management_url" in errors("nats", "nats://127.0.0.1:8222")
    assert "management_url" in errors("nats", "http://u:secret@127.0.0.1:8222")
    assert "management_url" in errors("redis", "http://127.0.0.1:8222")
    # ActiveMQ's health comes over STOMP (the statistics plugin): no management URL is read.
    assert "management_url" in errors("activemq", "http://127.0.0.1:8161")
    assert errors("rabbitmq", "http://127.0.0.1:15672") == {}


def test_malformed_broker_urls_are_field_errors_not_crashes(registry_admin: User) -> None:
    response = client_for(registry_admin).post(
        "/admin/channels_registry/broker/add/",
        {
            "name": "r",
            "kind": "rabbitmq",
            "url_env": "",
            "url_secret": "amqp://[::1",
            "management_url": "http://[::1",
            "poll_interval_s": 15,
        },
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert "This is not a valid URL." in page
    assert "Give an http:// or https:// URL." in page
    assert not Broker.objects.exists()


def test_saving_a_broker_whose_variable_is_unset_warns_and_the_channel_page_says_why(
    registry_admin: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLO_BROKER_NOWHERE_URL", raising=False)
    response = client_for(registry_admin).post(
        "/admin/channels_registry/broker/add/",
        {"name": "nowhere", "kind": "rabbitmq", "url_env": "DLO_BROKER_NOWHERE_URL",
         "url_secret": "", "management_url": "", "enabled": "on", "poll_interval_s": 15},
        follow=True,
    )  # fmt: skip
    page = response.content.decode()
    assert "Environment variable DLO_BROKER_NOWHERE_URL is not set on this server" in page
    broker = Broker.objects.get(name="nowhere")
    channel = make_channel(broker)
    detail = client_for(registry_admin).get(channel.get_absolute_url()).content.decode()
    assert "never — Environment variable DLO_BROKER_NOWHERE_URL is not set" in detail
    assert "is the scheduler running?" not in detail


def test_a_broker_with_both_a_variable_and_a_stored_url_names_the_ambiguity() -> None:
    broker = make_broker(url_env="DLO_BROKER_X_URL", url_secret="amqp://h/%2F")
    assert any("Both an environment variable" in p for p in broker.config_problems())


def test_channel_form_shows_declared_vs_observed_findings(registry_admin: User) -> None:
    from django.utils import timezone

    from channels_registry.models import ChannelHealth

    channel = make_channel()
    finding = {
        "code": "observed.no-dlx",
        "severity": "error",
        "principle": "P5",
        "message": "Queue orders has no dead-letter exchange",
        "fix": "Set one.",
    }
    ChannelHealth.objects.create(
        channel=channel, observed_at=timezone.now(), observed_findings=[finding]
    )
    page = (
        client_for(registry_admin)
        .get(f"/admin/channels_registry/channel/{channel.pk}/change/")
        .content.decode()
    )
    assert "Declared vs observed" in page and "Queue orders has no dead-letter exchange" in page
