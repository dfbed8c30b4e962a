"""Production settings fail loudly on bad values and pass `check --deploy`."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

BASE = {
    "DLO_ENV": "production",
    "ALLOWED_HOSTS": "dlo.example.com",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test",
    "SECRET_KEY": secrets.token_urlsafe(60),
    # The audit trail's keys and checkpoint directory (required in production).
    "DLO_AUDIT_SIGNING_KEY": "/run/dlo-keys/signing.key",
    "DLO_AUDIT_MAC_KEY": "/run/dlo-keys/mac.key",
    "DLO_AUDIT_CHECKPOINT_DIR": "/var/lib/dlo/checkpoints",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    dropped = {"DATABASE_URL", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    full_env = {k: v for k, v in os.environ.items() if k not in dropped}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        env=full_env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_is_clean_with_production_settings() -> None:
    result = manage("check", "--deploy", "--fail-level", "WARNING", **BASE)
    assert result.returncode == 0, result.stderr + result.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"SECRET_KEY": "short"}, "SECRET_KEY must be at least 50 characters"),
        ({"DATABASE_URL": "sqlite:///x.db"}, "Production needs PostgreSQL"),
        ({"DEBUG": "maybe"}, "is not a boolean"),
        ({"DEBUG": "1"}, "DEBUG must be off in production"),
        ({"DLO_AUDIT_SIGNING_KEY": ""}, "Production needs DLO_AUDIT_SIGNING_KEY"),
        ({"DLO_AUDIT_MAC_KEY": ""}, "Production needs DLO_AUDIT_MAC_KEY"),
        ({"DLO_AUDIT_CHECKPOINT_DIR": ""}, "Production needs DLO_AUDIT_CHECKPOINT_DIR"),
    ],
)
def test_bad_production_settings_fail_loudly(override: dict[str, str], message: str) -> None:
    result = manage("check", **{**BASE, **override})
    assert result.returncode != 0 and message in result.stderr


def test_compose_publishes_ports_on_loopback_by_default() -> None:
    compose = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())
    published = [
        (name, port)
        for name, service in compose["services"].items()
        for port in service.get("ports", [])
    ]
    assert published, "the web port must be published"
    for name, port in published:
        address = re.sub(r"\$\{DLO_PUBLISH_ADDR:-([^}]*)\}", r"\1", str(port))
        assert address.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_compose_gives_the_audit_trail_its_keys_and_checkpoints_outside_the_database() -> None:
    compose = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("web", "worker", "beat", "migrate"):
        env = services[name]["environment"]
        assert env["DLO_AUDIT_SIGNING_KEY"].startswith("/var/lib/dlo-keys/")
        assert env["DLO_AUDIT_MAC_KEY"].startswith("/var/lib/dlo-keys/")
        assert env["DLO_AUDIT_CHECKPOINT_DIR"] == "/var/lib/dlo-checkpoints"
        volumes = services[name]["volumes"]
        keys = next(v for v in volumes if ":/var/lib/dlo-keys" in v)
        assert keys.startswith("auditkeys:")  # not the database's volume
        # Only the one-shot migrate service (firstrun) may write the keys.
        assert keys.endswith(":ro") == (name != "migrate"), (name, keys)
        assert "checkpoints:/var/lib/dlo-checkpoints" in volumes
    assert {"auditkeys", "checkpoints"} <= set(compose["volumes"])


@pytest.mark.django_db
def test_healthz_fails_in_production_when_an_audit_key_is_unreadable(
    settings: Any, tmp_path: Path
) -> None:
    from django.test import Client

    settings.PRODUCTION = True
    settings.DLO_AUDIT_SIGNING_KEY = str(tmp_path / "signing.key")
    settings.DLO_AUDIT_MAC_KEY = str(tmp_path / "mac.key")
    (tmp_path / "signing.key").write_text("x")
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["audit_keys"] == "error: DLO_AUDIT_MAC_KEY unreadable"
    (tmp_path / "mac.key").write_text("x")
    assert Client().get("/healthz").status_code == 200
