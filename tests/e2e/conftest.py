"""Browser journeys: a real ASGI server (daphne, websockets included) in a subprocess on the
test database, a Redis channel layer shared by it and the test process (so a poll in the test
pushes rows to the browser), and Debian's chromium driven by Playwright.

Screenshots of each journey's key pages land in ``artifacts/screenshots/`` (CI keeps them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
AXE = Path(__file__).resolve().parent / "node_modules" / "axe-core" / "axe.min.js"
#: axe-core impacts that fail a journey (minor and moderate ones are reported, not failed).
AXE_FAILING = ("serious", "critical")
LAYER_URL = os.environ.get("DLO_TEST_LAYER_REDIS_URL", "redis://127.0.0.1:6379/9")


def required(what: str, problem: str) -> None:
    message = f"{what}: {problem}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    auth = f"{user}:{db['PASSWORD']}" if db.get("PASSWORD") else user
    return (
        f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    )


@pytest.fixture
def channel_layer_redis(settings: Any) -> Iterator[None]:
    import redis

    try:
        redis.Redis.from_url(LAYER_URL, socket_timeout=2).flushdb()
    except redis.RedisError as exc:
        required("Redis (the shared channel layer)", str(exc))
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": LAYER_URL, "socket_timeout": None}]},
        }
    }
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def asgi_server(transactional_db: Any, channel_layer_redis: None) -> Iterator[str]:
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": LAYER_URL,
        "CELERY_BROKER_URL": "",
        "DLO_INPROCESS_SCHEDULER": "0",
    }
    log = ARTIFACTS.parent / f"daphne-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "config.asgi:application",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"daphne exited: {log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("daphne did not start within 30 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a loaded machine: reap it, or its Popen warns
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        required("Debian chromium", f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM work the journeys do
    # between browser steps is ordinary synchronous test code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        instance = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
        )
        try:
            yield instance
        finally:
            # Under Playwright the ORM sees another context, hence other connections: close
            # them, or PostgreSQL refuses to drop the test database at the end.
            from django.db import connections

            connections.close_all()
            instance.close()


class Journey:
    """One signed-in browser tab that fails the test on a dialog or a console error."""

    def __init__(
        self,
        browser: Any,
        base: str,
        name: str,
        *,
        width: int = 1400,
        height: int = 900,
        color_scheme: str = "light",
        **context_options: Any,
    ) -> None:
        self.base = base
        self.name = name
        self.context = browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme=color_scheme,
            **context_options,
        )
        self.axe_results: dict[str, list[dict[str, Any]]] = {}
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.dialogs: list[str] = []
        self.console_errors: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on(
            "console",
            lambda m: self.console_errors.append(m.text) if m.type == "error" else None,
        )

    def sign_in(self, username: str, password: str) -> None:
        self.page.goto(f"{self.base}/login/")
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        self.page.click("button[type=submit]")
        self.page.wait_for_load_state()
        assert "/login/" not in self.page.url, "sign-in failed"

    def go(self, path: str) -> Any:
        return self.page.goto(f"{self.base}{path}", wait_until="load")

    def wait_until(self, predicate: Any, timeout_s: float = 10.0) -> None:
        """Poll from Python: the CSP forbids the string evaluation wait_for_function uses."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s} s")
            self.page.wait_for_timeout(100)

    def shot(self, label: str, *, full_page: bool = True) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = str(ARTIFACTS / f"{self.name}-{label}.png")
        self.page.screenshot(path=path, full_page=full_page)

    def axe(self, label: str) -> list[dict[str, Any]]:
        """Run axe-core (tests/e2e/node_modules, ``npm ci``) on the page as it is; return the
        serious and critical violations (all of them are kept in ``axe_results``)."""
        if not AXE.exists():
            required("axe-core", f"{AXE} is missing: run `npm ci` in tests/e2e")
        # Evaluated through the DevTools protocol, so the page's CSP does not block it.
        if not self.page.evaluate("() => typeof window.axe !== 'undefined'"):
            self.page.evaluate(AXE.read_text())
        result = self.page.evaluate(
            "() => axe.run(document, {resultTypes: ['violations']})"
            ".then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
            " nodes: v.nodes.slice(0, 5).map(n => n.target.join(' '))})))"
        )
        self.axe_results[label] = result
        return [v for v in result if v["impact"] in AXE_FAILING]

    def check_clean(self) -> None:
        assert self.dialogs == [], self.dialogs
        assert self.console_errors == [], self.console_errors


@pytest.fixture
def journey(browser: Any, asgi_server: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    tabs: list[Journey] = []

    def open_tab(name: str, **options: Any) -> Journey:
        tab = Journey(browser, asgi_server, name, **options)
        tabs.append(tab)
        return tab

    yield open_tab
    for tab in tabs:
        try:
            tab.shot("last")  # where the journey ended, pass or fail
        finally:
            tab.context.close()


def off_loop(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` in a worker thread: Playwright's event loop runs in this one, and code that
    uses ``async_to_sync`` (channel-layer pushes) refuses to run beside a running loop."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def call() -> Any:
        try:
            return func(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result(timeout=120)


def browser_user(username: str, *roles: str, staff: bool = False) -> Any:
    """A user the server subprocess can verify (it hashes with the production hashers)."""
    from django.contrib.auth.hashers import make_password

    from tests.conftest import PASSWORD, make_user

    user = make_user(username, *roles, staff=staff)
    user.password = make_password(PASSWORD, hasher="pbkdf2_sha256")
    user.save(update_fields=["password"])
    return user


AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@pytest.fixture
def rabbit(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """A RabbitMQ channel and a fresh queue ``name`` with its ``name.dlq``; the server process
    resolves the broker URL from ``DLO_BROKER_E2E_RABBITMQ_URL``."""
    import uuid

    import pika

    from tests.conftest import broker_required

    try:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL + "?socket_timeout=3"))
    except Exception as exc:  # any connection failure means the broker is not there
        broker_required("RabbitMQ", exc)
    monkeypatch.setenv("DLO_BROKER_E2E_RABBITMQ_URL", AMQP_URL)
    amqp = connection.channel()
    name = f"e2e.{uuid.uuid4().hex[:8]}"
    amqp.queue_declare(name)
    amqp.queue_declare(f"{name}.dlq")
    try:
        yield amqp, name
    finally:
        amqp.queue_delete(name)
        amqp.queue_delete(f"{name}.dlq")
        connection.close()
