"""Issue #12 items 1 and 2: a broker URL comes only from an allowed variable, its secrets never
appear in an error, log line, page, alert or audit event, and its credentials go to the
broker's own host only (an SSRF test with local listeners)."""

from __future__ import annotations

import http.server
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from alerts.models import Alert
from audit.models import AuditEvent
from brokers.base import BrokerError, scrub
from brokers.rabbitmq import RabbitMQAdapter
from channels_registry.actions import do_poll_broker
from channels_registry.models import Broker, BrokerConfigError, ChannelHealth
from tests.conftest import broker_required, client_for, make_broker, make_channel

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-" + uuid.uuid4().hex[:12]
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


# -- item 1: which variables a broker may name ------------------------------------------------


@pytest.mark.parametrize("name", ["SECRET_KEY", "DATABASE_URL", "RABBITMQ_URL", "DLO_BROKER_"])
def test_url_env_outside_dlo_broker_is_refused_at_save(name: str) -> None:
    broker = Broker(name="b", kind="nats", url_env=name)
    with pytest.raises(ValidationError) as info:
        broker.clean()
    assert "is not a broker URL variable" in str(info.value.message_dict["url_env"])
    assert "DLO_BROKER_URL_ENV_ALLOW" in str(info.value.message_dict["url_env"])


def test_allowlisted_and_dlo_broker_names_are_accepted() -> None:
    Broker(name="a", kind="nats", url_env="DLO_BROKER_NATS_URL").clean()
    with override_settings(DLO_BROKER_URL_ENV_ALLOW=["RABBITMQ_URL"]):
        Broker(name="b", kind="nats", url_env="RABBITMQ_URL").clean()
    with pytest.raises(ValidationError):
        Broker(name="c", kind="nats", url_env="DLO_BROKER_TIMEOUT_S").clean()


def test_admin_form_refuses_secret_key(registry_admin: User) -> None:
    response = client_for(registry_admin).post(
        "/admin/channels_registry/broker/add/",
        {"name": "leak", "kind": "nats", "url_env": "SECRET_KEY", "poll_interval_s": 15},
    )
    assert response.status_code == 200
    assert "SECRET_KEY is not a broker URL variable" in response.content.decode()
    assert not Broker.objects.exists()


def test_registry_import_refuses_secret_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "brokers.yaml"
    path.write_text(
        "version: 1\nbrokers:\n  - name: leak\n    kind: nats\n    url_env: SECRET_KEY\n"
    )
    with pytest.raises(CommandError):
        call_command("registry", "import", "--check", str(path))
    err = capsys.readouterr().err
    assert "brokers.yaml:5: broker 'leak': url_env: SECRET_KEY is not a broker URL variable" in err


def test_a_broker_saved_before_the_rule_cannot_read_the_variable(
    monkeypatch: pytest.MonkeyPatch, viewer: User
) -> None:
    monkeypatch.setenv("LEGACY_URL", SECRET)
    broker = make_broker(name="legacy", kind="nats", url_env="LEGACY_URL")  # no clean()
    channel = make_channel(broker, address="S", address_group="C")
    with pytest.raises(BrokerConfigError, match="LEGACY_URL is not a broker URL variable"):
        broker.connection_url()
    assert do_poll_broker(broker.pk).status == "failed"
    assert "not a broker URL variable" in ChannelHealth.objects.get(channel=channel).evidence[0]
    assert SECRET not in client_for(viewer).get("/").content.decode()


# -- item 1: secrets never echoed --------------------------------------------------------------


def test_scrub_removes_urls_passwords_and_tokens() -> None:
    url = f"amqp://guest:{SECRET}@h:5672/%2F,amqp://guest:{SECRET}@h2/%2F"
    text = f"failed for {url} then for amqp://guest:{SECRET}@h2/%2F and {SECRET} alone"
    assert SECRET not in scrub(text, url)
    assert SECRET not in scrub(f"x nats://{SECRET}@host:4222 y", f"nats://{SECRET}@host:4222")
    assert scrub(f"bad URL '{SECRET}'", SECRET) == "bad URL '[broker URL]'"
    assert SECRET not in str(BrokerError(f"GET https://u:{SECRET}@h/api: boom"))


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("nats", SECRET),  # not a URL at all: the "nats: bad URL '<the value>'"
        ("nats", f"nats://user:{SECRET}@127.0.0.1:bad"),
        ("rabbitmq", f"{SECRET}://x"),
        ("rabbitmq", f"amqp://guest:{SECRET}@127.0.0.1:1/%2F"),  # refused connection
        ("redis", f"redis://:{SECRET}@127.0.0.1:notaport/0"),
        ("redis", f"rediss://:{SECRET}@[::1/0"),
        ("activemq", f"stomp://user:{SECRET}@127.0.0.1:bad"),
        ("activemq", f"stomp://user:{SECRET}@127.0.0.1:1"),  # refused connection
        ("activemq", f"{SECRET}://x"),
    ],
    # Fixed ids: the secret is random per process, and pytest-xdist needs every worker to
    # collect the same test names.
    ids=[
        "nats-bare",
        "nats-url",
        "rabbitmq-scheme",
        "rabbitmq-refused",
        "redis-port",
        "rediss-host",
        "activemq-port",
        "activemq-refused",
        "activemq-scheme",
    ],
)
def test_a_failing_poll_never_shows_the_url_or_its_password(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    viewer: User,
    compliance: User,
    kind: str,
    value: str,
) -> None:
    monkeypatch.setenv("DLO_BROKER_TEST_SECRET_URL", value)
    broker = make_broker(name="leaky", kind=kind, url_env="DLO_BROKER_TEST_SECRET_URL")
    channel = make_channel(
        broker,
        address="s",
        address_group="" if kind in ("rabbitmq", "activemq") else "g",
        dlq_address="s.dlq",
    )
    with caplog.at_level(logging.DEBUG):
        outcome = do_poll_broker(broker.pk)
        for _ in range(3):  # open the circuit, fire the staleness alerts
            do_poll_broker(broker.pk, force=True)
    assert outcome.status == "failed"
    health = ChannelHealth.objects.get(channel=channel)
    seen = [
        *outcome.errors,
        *health.evidence,
        caplog.text,
        client_for(viewer).get("/").content.decode(),
        client_for(viewer).get(channel.get_absolute_url()).content.decode(),
        client_for(viewer).get("/alerts/").content.decode(),
        *(str(a.evidence) for a in Alert.objects.all()),
        *(f"{e.reason} {e.before} {e.after}" for e in AuditEvent.objects.all()),
    ]
    assert health.evidence and outcome.errors
    for text in seen:
        assert SECRET not in text


# -- item 2: credentials go to the broker's own host only --------------------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]
    redirect_to: str = ""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
        if self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to + self.path)
        else:
            self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _listen(host: str, redirect_to: str = "") -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen, "redirect_to": redirect_to})
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def collector() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A listener on another host (127.0.0.2: loopback, but not the broker's 127.0.0.1)."""
    yield from _listen("127.0.0.2")


def test_management_url_on_another_host_never_receives_the_credentials(
    collector: tuple[str, list[dict[str, str]]],
) -> None:
    base, seen = collector
    url = f"amqp://guest:{SECRET}@127.0.0.1:5672/%2F"
    for management in (f"{base}/collector", f"{base}/metrics"):
        adapter = RabbitMQAdapter(url, management_url=management, timeout=3.0)
        with pytest.raises(BrokerError, match="DLO_BROKER_CREDENTIAL_HOSTS"):
            adapter.poll([])  # an empty poll still asks the endpoint once
            adapter.inspect([])
    assert seen, "the listener must have been asked"
    assert all("authorization" not in request for request in seen)
    assert SECRET not in repr(seen)
    # The control: an operator-listed host does get them, so the test can see them.
    adapter = RabbitMQAdapter(
        url, management_url=f"{base}/api", timeout=3.0, credential_hosts=[base]
    )
    with pytest.raises(BrokerError):
        adapter.inspect([_addr()])
    assert seen[-1]["authorization"].startswith("Basic ")


def test_another_port_of_the_brokers_own_host_gets_no_credentials_over_http() -> None:
    """Issue #27 item 6: the host alone is not enough. Plain HTTP on a port that is not
    RabbitMQ's own (15672, 15692) is another service, whoever runs it; a bare host listed by
    the operator does not widen that, only the exact ``scheme://host:port``."""
    for own, own_seen in _listen("127.0.0.1"):
        url = f"amqp://guest:{SECRET}@127.0.0.1:5672/%2F"
        for management in (f"{own}/api", f"{own}/metrics"):
            for hosts in ([], ["127.0.0.1"]):
                adapter = RabbitMQAdapter(
                    url, management_url=management, timeout=3.0, credential_hosts=hosts
                )
                with pytest.raises(BrokerError, match="DLO_BROKER_CREDENTIAL_HOSTS"):
                    adapter.poll([])
        assert own_seen and all("authorization" not in request for request in own_seen)
        assert SECRET not in repr(own_seen)
        adapter = RabbitMQAdapter(
            url, management_url=f"{own}/api", timeout=3.0, credential_hosts=[own]
        )
        with pytest.raises(BrokerError):
            adapter.poll([])
        assert own_seen[-1]["authorization"].startswith("Basic ")
    for allowed in (
        "http://127.0.0.1:15672/api",
        "http://127.0.0.1:15692/metrics",
        "https://127.0.0.1:8443/api",
    ):
        adapter = RabbitMQAdapter(
            f"amqp://guest:{SECRET}@127.0.0.1:5672/%2F", management_url=allowed
        )
        assert adapter._may_receive_credentials(allowed), allowed


def _addr() -> Any:
    from brokers.base import Address

    return Address("q")


def test_a_redirect_from_the_brokers_host_does_not_carry_the_credentials_away(
    collector: tuple[str, list[dict[str, str]]],
) -> None:
    base, seen = collector
    for own, own_seen in _listen("127.0.0.1", redirect_to=base):
        adapter = RabbitMQAdapter(
            f"amqp://guest:{SECRET}@127.0.0.1:5672/%2F",
            management_url=f"{own}/api",
            credential_hosts=[own],
        )
        with pytest.raises(BrokerError):
            adapter.inspect([_addr()])
        assert own_seen and own_seen[0]["authorization"].startswith("Basic ")
    assert seen == []


def test_a_polled_broker_with_a_foreign_management_url_sends_no_credentials(
    monkeypatch: pytest.MonkeyPatch, collector: tuple[str, list[dict[str, str]]]
) -> None:
    try:
        pika.BlockingConnection(pika.URLParameters(AMQP_URL + "?socket_timeout=3")).close()
    except Exception as exc:
        broker_required("RabbitMQ", exc)
    base, seen = collector
    monkeypatch.setenv("DLO_BROKER_TEST_SSRF_URL", AMQP_URL)
    broker = make_broker(
        name="ssrf", url_env="DLO_BROKER_TEST_SSRF_URL", management_url=f"{base}/collector"
    )
    make_channel(broker, address=f"ssrf-{uuid.uuid4().hex[:8]}")
    do_poll_broker(broker.pk)
    assert seen and all("authorization" not in request for request in seen)
