"""Shared fixtures: a small cast of users, declaration helpers, and audit-trigger handling."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from audit import triggers
from channels_registry.actions import refresh_findings
from channels_registry.models import Broker, BrokerKind, Channel

PASSWORD = "correct horse battery staple"

#: The pytest-xdist worker this process is (``gw0``, ``gw1`` …; "" in a serial run). Each worker
#: has its own test database (pytest-django appends it: ``test_dlo_gw0``); names a test creates
#: on a shared broker (queues, streams, Redis keys) take it too, through ``unique_name``.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def unique_name(prefix: str, sep: str = "-") -> str:
    """A broker-side name no other test, worker or concurrent run uses."""
    return sep.join(part for part in (prefix, WORKER, uuid.uuid4().hex[:8]) if part)


def pytest_configure(config: pytest.Config) -> None:
    # Test-only tweaks: fast password hashing.
    from django.conf import settings

    # Seal each audit event in its recording transaction, so ``record`` returns it numbered
    # (tests of the sealer itself switch to "thread" or "off").
    settings.DLO_AUDIT_SEALER = "inline"
    # Tasks run in-process whatever the shell exports: a CELERY_BROKER_URL left over from a
    # worker or a benchmark sent them to Redis, where nothing ran them, and tests that wait
    # for a task's result failed.
    settings.CELERY_BROKER_URL = ""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        # For users a separate server process (browser journeys) must verify.
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]
    if not WORKER:
        # The audit MAC key is created on first use: once here, before any xdist worker
        # starts, so parallel workers never race to create it and read a half-written file.
        from audit.mac import load_key

        load_key()


@pytest.fixture(autouse=True)
def _clear_cache() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def _audit_triggers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Keep the append-only triggers on during every test. A transactional test's database is
    flushed (DELETE/TRUNCATE) after it, which the triggers refuse, so they are dropped just
    before that flush and put back at the start of the next test."""
    markers = [m for m in request.node.iter_markers() if m.name == "django_db"]
    transactional = (
        "transactional_db" in request.fixturenames
        or "live_server" in request.fixturenames
        or any(m.kwargs.get("transaction") for m in markers)
    )
    uses_db = transactional or "db" in request.fixturenames or bool(markers)
    if uses_db:
        request.getfixturevalue("transactional_db" if transactional else "db")
        triggers.install(connection)
    yield
    if uses_db and transactional:
        triggers.drop(connection)


def ensure_roles() -> None:
    """A transactional test's flush empties the groups the data migrations created."""
    if Group.objects.filter(name="viewer").exists():
        return
    from django.apps import apps

    from dashboard.roles import sync_roles

    sync_roles(apps)


def make_user(username: str, *roles: str, staff: bool = False) -> User:
    ensure_roles()
    user = User.objects.create_user(username, f"{username}@example.test", PASSWORD)
    user.is_staff = staff
    user.save()
    for role in roles:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def viewer(db: Any) -> User:
    return make_user("vera", "viewer")


@pytest.fixture
def oncall(db: Any) -> User:
    return make_user("otto", "oncall")


@pytest.fixture
def compliance(db: Any) -> User:
    return make_user("cora", "compliance")


@pytest.fixture
def registry_admin(db: Any) -> User:
    return make_user("rita", "registry_admin", staff=True)


@pytest.fixture
def outsider(db: Any) -> User:
    return make_user("olga")


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_broker(**overrides: Any) -> Broker:
    fields: dict[str, Any] = {
        "name": "main-rabbit",
        "kind": BrokerKind.RABBITMQ,
        "url_env": "DLO_BROKER_RABBITMQ_URL",
    }
    fields.update(overrides)
    return Broker.objects.create(**fields)


GOOD_CONTRACT: dict[str, Any] = {
    "semantic": "at-least-once",
    "ordering": "per-key",
    "ordering_key": "order_id",
    "ordering_rationale": "Events of one order must apply in order; orders are independent.",
    "idempotency_source": "header",
    "idempotency_key": "Idempotency-Key",
    "dedup_ttl_s": 86400,
    "mark_in_transaction": True,
    "retry_max_attempts": 5,
    "retry_ttl_s": 1800,
    "backoff_base_s": 1.0,
    "backoff_factor": 2.0,
    "backoff_cap_s": 60.0,
    "backoff_jitter": True,
    "max_in_flight": 50,
    "ack_timeout_s": 30,
    "dlq_strategies": ["ttl-with-backoff", "poison-queue", "dlq-alert"],
    "dlq_address": "orders.dlq",
    "poison_address": "orders.poison",
    "retention_s": 604800,
    "schema_name": "orders.OrderPlaced",
    "schema_version": "3",
    "alert_dlq_depth": 0,
    "alert_lag_messages": 10000,
    "alert_lag_seconds": 300,
    "alert_oldest_age_s": 3600,
    "alert_min_consumers": 1,
}


def make_channel(broker: Broker | None = None, **overrides: Any) -> Channel:
    """A channel with a clean, fully declared contract unless overridden."""
    broker = broker or Broker.objects.first() or make_broker()
    fields: dict[str, Any] = {
        "broker": broker,
        "name": "Orders",
        "slug": "orders",
        "address": "orders",
        "owner_team": "payments",
        **GOOD_CONTRACT,
    }
    fields.update(overrides)
    channel = Channel(**fields)
    channel.full_clean()
    refresh_findings(channel)
    channel.save()
    return channel


def broker_required(service: str, exc: BaseException) -> None:
    """Skip on a laptop without the service; fail in CI, where every broker must be up."""
    message = f"{service} is not reachable on loopback: {exc}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def back_to_latest() -> Iterator[None]:
    """For a test that migrates the database back and forth (``migrate_to``): whatever it
    did, the tests after it find the database migrated to the latest state again."""
    yield
    migrate_to(MigrationExecutor(connection).loader.graph.leaf_nodes())


def migrate_to(targets: list[tuple[str, str]]) -> MigrationExecutor:
    """Migrate the test database to ``targets`` (forwards or backwards), for the tests of a
    migration on existing data (``transaction=True`` tests); returns the executor."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor
