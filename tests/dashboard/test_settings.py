"""Production settings fail loudly on bad values and pass `check --deploy`."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BASE = {
    "DLO_ENV": "production",
    "ALLOWED_HOSTS": "dlo.example.com",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/test",
    "SECRET_KEY": secrets.token_urlsafe(60),
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
