"""Issue #27 item 1: forwarded headers are believed only from ``DLO_TRUSTED_PROXIES``.

The server is started with the Dockerfile's own command (bound to loopback on a free port), so
a flag that lets daphne read ``X-Forwarded-For`` from anyone fails here. Every request reaches
it from 127.0.0.1; the headers say whatever a client or a proxy wrote.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.test import Client, override_settings

from audit.mac import load_key
from audit.models import AuditEvent
from dashboard.proxy import parse_networks, resolve
from tests.conftest import PASSWORD, make_user
from tests.e2e.conftest import _database_url

ROOT = Path(__file__).resolve().parents[2]
THROTTLED = "Too many failed sign-in attempts"


def _dockerfile_command(port: int) -> list[str]:
    """The Dockerfile's CMD with its bind address and port swapped for loopback and ``port``."""
    line = next(
        line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("CMD")
    )
    command = json.loads(line.removeprefix("CMD"))
    assert command[0] == "daphne"
    for flag, value in (("-b", "127.0.0.1"), ("-p", str(port))):
        command[command.index(flag) + 1] = value
    return [sys.executable, "-m", *command]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def serve(transactional_db: Any, tmp_path: Path) -> Iterator[Callable[..., str]]:
    processes: list[subprocess.Popen[bytes]] = []
    # Production refuses to start without the audit trail's keys and checkpoint directory;
    # the MAC key is the suite's own, so the rows this server writes are the application's.
    load_key()
    audit_env = {
        "DLO_AUDIT_MAC_KEY": str(Path(settings.DLO_AUDIT_MAC_KEY).resolve()),
        "DLO_AUDIT_SIGNING_KEY": str(tmp_path / "signing.key"),
        "DLO_AUDIT_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }

    def start(**env: str) -> str:
        port = _free_port()
        full_env = {
            **os.environ,
            **audit_env,
            "DATABASE_URL": _database_url(),
            "REDIS_URL": "",  # a cache of its own: the throttle's counters live in this server
            "CELERY_BROKER_URL": "",
            "DLO_INPROCESS_SCHEDULER": "0",
            "METRICS_ALLOWED_NETWORKS": "10.9.9.0/24",
            **env,
        }
        full_env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        process = subprocess.Popen(
            _dockerfile_command(port), cwd=ROOT, env=full_env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        processes.append(process)
        for _ in range(300):
            if process.poll() is not None:
                pytest.fail("daphne exited")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.1)
        pytest.fail("daphne did not start")

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=30)


def _vera() -> User:
    """A viewer the server process can verify (the suite's MD5 hasher is not in its settings)."""
    user = make_user("vera", "viewer")
    user.password = make_password(PASSWORD, hasher="pbkdf2_sha256")
    user.save(update_fields=["password"])
    return user


def _login(base: str, password: str, forwarded: str) -> str:
    """Sign in as ``vera`` with ``X-Forwarded-For: forwarded``; the page's text or 'signed in'."""
    headers = {"X-Forwarded-For": forwarded}
    with httpx.Client(base_url=base, timeout=30, headers=headers) as client:
        form = client.get("/login/")
        token = client.cookies["csrftoken"]
        assert form.status_code == 200
        answer = client.post(
            "/login/",
            data={"username": "vera", "password": password, "csrfmiddlewaretoken": token},
        )
        if answer.status_code == 302:
            return "signed in"
        return answer.text


def _metrics(base: str, forwarded: str) -> int:
    headers = {"X-Forwarded-For": forwarded}
    return httpx.get(f"{base}/metrics", headers=headers, timeout=30).status_code


def test_without_trusted_proxies_a_forged_address_changes_nothing(
    serve: Callable[..., str],
) -> None:
    _vera()
    base = serve()
    for _ in range(5):
        assert THROTTLED not in _login(base, "wrong", "1.1.1.1")
    # Another claimed address is the same client (127.0.0.1): still throttled.
    assert THROTTLED in _login(base, PASSWORD, "2.2.2.2")
    assert _metrics(base, "10.9.9.9") == 401
    sources = set(AuditEvent.objects.values_list("source_ip", flat=True))
    assert sources == {"127.0.0.1"}


def test_a_new_forged_address_per_attempt_is_still_throttled(serve: Callable[..., str]) -> None:
    _vera()
    base = serve()
    answers = [_login(base, "wrong", f"198.51.100.{i}") for i in range(1, 8)]
    assert THROTTLED in answers[-1]


def test_behind_a_trusted_proxy_the_right_most_untrusted_hop_is_the_client(
    serve: Callable[..., str],
) -> None:
    _vera()
    base = serve(DLO_TRUSTED_PROXIES="127.0.0.1")
    # The proxy appends the address it saw (1.1.1.1); what the client wrote sits to its left.
    for forged in ("6.6.6.1", "6.6.6.2", "6.6.6.3", "6.6.6.4", "6.6.6.5"):
        assert THROTTLED not in _login(base, "wrong", f"{forged}, 1.1.1.1")
    assert THROTTLED in _login(base, PASSWORD, "2.2.2.2, 1.1.1.1")
    # A different real client is not throttled by 1.1.1.1's failures.
    assert _login(base, PASSWORD, "1.1.1.1, 2.2.2.2") == "signed in"
    assert _metrics(base, "10.9.9.9") == 200
    assert _metrics(base, "10.9.9.9, 203.0.113.5") == 401
    failed = AuditEvent.objects.filter(action="auth.login_failed")
    assert set(failed.values_list("source_ip", flat=True)) == {"1.1.1.1"}
    login = AuditEvent.objects.get(action="auth.login")
    assert login.source_ip == "2.2.2.2"


def test_behind_an_untrusted_peer_the_forwarded_scheme_is_ignored(
    serve: Callable[..., str],
) -> None:
    if not _database_url().startswith("postgres"):
        pytest.skip("production settings need PostgreSQL")
    base = serve(DLO_ENV="production", SECRET_KEY="s" * 60, ALLOWED_HOSTS="127.0.0.1")
    claims_tls = {"X-Forwarded-Proto": "https"}
    # SECURE_SSL_REDIRECT sends plain HTTP to https; a client claiming https is not believed.
    assert httpx.get(f"{base}/", headers=claims_tls, timeout=30).status_code == 301
    trusted = serve(
        DLO_ENV="production", SECRET_KEY="s" * 60, ALLOWED_HOSTS="127.0.0.1",
        DLO_TRUSTED_PROXIES="127.0.0.0/8",
    )  # fmt: skip
    # From a trusted proxy the scheme is believed: no redirect to https, on to the sign-in.
    answer = httpx.get(f"{trusted}/", headers=claims_tls, timeout=30)
    assert answer.status_code == 302 and answer.headers["location"].startswith("/login/")


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "client"),
    [
        ("203.0.113.9", "10.0.0.1", "", "203.0.113.9"),
        ("10.0.0.2", "6.6.6.6, 198.51.100.7", "10.0.0.0/8", "198.51.100.7"),
        ("10.0.0.2", "198.51.100.7, 10.0.0.3", "10.0.0.0/8", "198.51.100.7"),
        ("10.0.0.2", "10.0.0.4, 10.0.0.3", "10.0.0.0/8", "10.0.0.4"),
        ("10.0.0.2", "6.6.6.6, not-an-ip, 10.0.0.3", "10.0.0.0/8", "10.0.0.3"),
        ("10.0.0.2", "[2001:db8::7]:4711", "10.0.0.2", "2001:db8::7"),
        ("::ffff:10.0.0.2", "198.51.100.7:80", "10.0.0.2/32", "198.51.100.7"),
        ("10.0.0.2", "", "10.0.0.2", "10.0.0.2"),
    ],
)
def test_resolve_takes_the_right_most_untrusted_hop(
    peer: str, forwarded: str, trusted: str, client: str
) -> None:
    proxies = parse_networks("DLO_TRUSTED_PROXIES", [t for t in trusted.split(",") if t])
    assert resolve(peer, forwarded, proxies) == client


@pytest.mark.django_db
def test_test_client_requests_resolve_through_the_same_place(viewer: User) -> None:
    networks = parse_networks("DLO_TRUSTED_PROXIES", ["192.0.2.1"])
    with override_settings(
        DLO_TRUSTED_PROXIES_NETWORKS=networks, METRICS_ALLOWED_NETWORKS=["10.9.9.0/24"]
    ):
        forwarded = {"REMOTE_ADDR": "192.0.2.1", "HTTP_X_FORWARDED_FOR": "10.9.9.9"}
        assert Client().get("/metrics", **forwarded).status_code == 200  # type: ignore[arg-type]
        direct = {"REMOTE_ADDR": "192.0.2.9", "HTTP_X_FORWARDED_FOR": "10.9.9.9"}
        assert Client().get("/metrics", **direct).status_code == 401  # type: ignore[arg-type]


def test_a_bad_trusted_proxy_fails_loudly() -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="DLO_TRUSTED_PROXIES"):
        parse_networks("DLO_TRUSTED_PROXIES", ["proxy.example"])
