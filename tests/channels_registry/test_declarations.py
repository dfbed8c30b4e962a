"""Declarations as code: export, idempotent import, --check, line-precise errors, atomicity."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEvent
from channels_registry.models import Broker, Channel
from tests.conftest import client_for, make_broker, make_channel

pytestmark = pytest.mark.django_db

GOOD_FILE = """\
version: 1
brokers:
  - name: main-rabbit
    kind: rabbitmq
    url_env: DLO_BROKER_RABBITMQ_URL
    management_url: http://127.0.0.1:15672
channels:
  - slug: orders
    name: Orders
    broker: main-rabbit
    address: orders
    owner_team: payments
    semantic: at-least-once
    ordering: per-key
    ordering_key: order_id
    ordering_rationale: per order
    idempotency_source: header
    idempotency_key: Idempotency-Key
    dedup_ttl_s: 86400
    mark_in_transaction: true
    retry_max_attempts: 5
    retry_ttl_s: 1800
    backoff_base_s: 1
    backoff_factor: 2
    backoff_cap_s: 60
    backoff_jitter: true
    max_in_flight: 50
    dlq_strategies: [ttl-with-backoff, poison-queue, dlq-alert]
    dlq_address: orders.dlq
    poison_address: orders.poison
    retention_s: 604800
    schema_name: orders.OrderPlaced
    schema_version: "3"
    alert_dlq_depth: 0
    alert_lag_messages: 10000
    redact_headers: [authorization]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "channels.yaml"
    path.write_text(text)
    return str(path)


def test_import_creates_then_is_idempotent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, GOOD_FILE)
    call_command("registry", "import", path)
    assert "2 created, 0 updated, 0 unchanged" in capsys.readouterr().out
    channel = Channel.objects.get(slug="orders")
    assert channel.broker.name == "main-rabbit" and channel.error_count == 0
    assert channel.redact_headers == ["authorization"]
    events = AuditEvent.objects.filter(action__startswith="registry.").count()
    assert AuditEvent.objects.filter(actor_username="registry-import").count() == events == 2
    call_command("registry", "import", path)
    assert "0 created, 0 updated, 2 unchanged" in capsys.readouterr().out
    assert AuditEvent.objects.filter(action__startswith="registry.").count() == 2


def test_import_updates_and_audits_the_diff(tmp_path: Path) -> None:
    call_command("registry", "import", write(tmp_path, GOOD_FILE))
    call_command(
        "registry",
        "import",
        write(tmp_path, GOOD_FILE.replace("retry_max_attempts: 5", "retry_max_attempts: 7")),
    )
    event = AuditEvent.objects.get(action="registry.channel.update")
    assert event.changes["retry_max_attempts"] == [5, 7]


def test_export_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broker = make_broker(url_secret="amqp://u:topsecret@h/%2F", url_env="")
    make_channel(broker)
    capsys.readouterr()
    call_command("registry", "export")
    exported = capsys.readouterr().out
    assert "topsecret" not in exported
    data = yaml.safe_load(exported)
    assert data["channels"][0]["slug"] == "orders"
    call_command("registry", "import", write(tmp_path, exported))
    assert "0 created, 0 updated, 2 unchanged" in capsys.readouterr().out


def test_bad_file_gets_line_precise_errors_and_nothing_is_imported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = (
        GOOD_FILE.replace("semantic: at-least-once", "semantic: at-least-twice")
        .replace("backoff_factor: 2", "backoff_factor: 0.5")
        .replace("owner_team: payments", "owner_team: payments\n    colour: blue")
    )
    path = write(tmp_path, bad)
    with pytest.raises(CommandError, match="3 problem"):
        call_command("registry", "import", path)
    err = capsys.readouterr().err
    lines = bad.splitlines()
    semantic_line = next(i for i, s in enumerate(lines, 1) if "at-least-twice" in s)
    colour_line = next(i for i, s in enumerate(lines, 1) if "colour" in s)
    factor_line = next(i for i, s in enumerate(lines, 1) if "backoff_factor" in s)
    assert (
        f"channels.yaml:{semantic_line}: channel 'orders': semantic: Select a valid choice" in err
    )
    assert f"channels.yaml:{colour_line}: channel 'orders': unknown field 'colour'" in err
    assert f"channels.yaml:{factor_line}: channel 'orders': backoff_factor:" in err
    # The broker in the same file was valid, but nothing is half-imported.
    assert not Broker.objects.exists() and not Channel.objects.exists()
    assert not AuditEvent.objects.exists()


def test_unknown_broker_and_yaml_syntax_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CommandError):
        call_command(
            "registry",
            "import",
            write(tmp_path, GOOD_FILE.replace("broker: main-rabbit", "broker: nope")),
        )
    assert "broker 'nope' is not declared" in capsys.readouterr().err
    with pytest.raises(CommandError):
        call_command("registry", "import", write(tmp_path, "brokers:\n  - name: [unclosed\n"))
    assert "channels.yaml:3: not valid YAML" in capsys.readouterr().err


def test_secrets_are_refused_in_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = GOOD_FILE.replace("url_env: DLO_BROKER_RABBITMQ_URL", "url_secret: amqp://u:p@h/")
    with pytest.raises(CommandError):
        call_command("registry", "import", write(tmp_path, text))
    assert "url_secret is not accepted in files" in capsys.readouterr().err


def test_check_validates_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("registry", "import", "--check", write(tmp_path, GOOD_FILE))
    assert "would import: 2 created" in capsys.readouterr().out
    assert not Channel.objects.exists() and not AuditEvent.objects.exists()
    risky = GOOD_FILE.replace("    alert_dlq_depth: 0\n", "")
    with pytest.raises(CommandError, match="declaration checks found errors"):
        call_command("registry", "import", "--check", write(tmp_path, risky))
    assert "orders: error P10 (Messaging is observable) dlq-no-alert" in capsys.readouterr().out
    assert not Channel.objects.exists()


def test_import_as_a_named_user(tmp_path: Path, registry_admin: object) -> None:
    call_command("registry", "import", "--actor", "rita", write(tmp_path, GOOD_FILE))
    assert set(
        AuditEvent.objects.filter(action__startswith="registry.").values_list(
            "actor_username", flat=True
        )
    ) == {"rita"}
    with pytest.raises(CommandError, match="no user named"):
        call_command("registry", "import", "--actor", "ghost", write(tmp_path, GOOD_FILE))


def test_import_page_checks_then_imports_as_the_user(registry_admin: User) -> None:
    client = client_for(registry_admin)
    assert "version: 1" in client.get("/channels/import/").content.decode()
    page = client.post("/channels/import/", {"text": GOOD_FILE, "action": "check"})
    assert "Check passed: nothing was written" in page.content.decode()
    assert not Channel.objects.exists()
    page = client.post("/channels/import/", {"text": GOOD_FILE, "action": "import"})
    assert "2 created" in page.content.decode()
    assert set(
        AuditEvent.objects.filter(action__startswith="registry.").values_list(
            "actor_username", flat=True
        )
    ) == {"rita"}


def test_import_page_shows_line_precise_errors_escaped(registry_admin: User) -> None:
    bad = GOOD_FILE.replace("semantic: at-least-once", "semantic: <script>x</script>")
    page = (
        client_for(registry_admin)
        .post("/channels/import/", {"text": bad, "action": "import"})
        .content.decode()
    )
    line = next(i for i, s in enumerate(bad.splitlines(), 1) if "<script>" in s)
    assert f"<strong>line {line}</strong>: channel &#x27;orders&#x27;: semantic:" in page
    assert "nothing was imported" in page and "<script>x" not in page
    assert not Channel.objects.exists()


def test_import_page_needs_registry_admin(viewer: User) -> None:
    client = client_for(viewer)
    assert client.get("/channels/import/").status_code == 403
    assert client.post("/channels/import/", {"text": GOOD_FILE}).status_code == 403


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_by_the_cli_within_bounded_memory(tmp_path: Path) -> None:
    """The 1 KB bomb of issue #12 expands to 9**9 values. The command runs in a child whose
    address space is capped at 1 GiB: the old parser ran out of it, this one refuses first."""
    import resource
    import subprocess
    import sys

    bomb = write(tmp_path, _alias_bomb())
    assert len(Path(bomb).read_bytes()) < 1024

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    result = subprocess.run(
        [sys.executable, "manage.py", "registry", "import", "--check", bomb],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=cap,
        check=False,
    )
    assert result.returncode == 1
    assert "channels.yaml:1: the aliases expand to more than 500,000 values" in result.stderr
    assert "MemoryError" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "line 1: nested more than 32 levels deep"),
        ("a: &a [1]\nb: [" + ", ".join(["*a"] * 101) + "]\n", "more than 100 YAML aliases"),
        ("a: &a [*a]\n", "the aliases expand to more than 500,000 values"),
        (_alias_bomb(), "the aliases expand to more than 500,000 values"),
        ("# pad\n" * 400_000, "the file is larger than 2 MiB"),
    ],
)
def test_import_page_answers_bombs_with_a_clear_error(
    registry_admin: User, text: str, message: str
) -> None:
    response = client_for(registry_admin).post(
        "/channels/import/", {"text": text, "action": "check"}
    )
    assert response.status_code == 200
    assert message in response.content.decode().replace("<strong>", "").replace("</strong>", "")
    assert not Channel.objects.exists()


def test_a_wrong_choice_in_a_file_lists_the_valid_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = GOOD_FILE.replace("semantic: at-least-once", "semantic: at-least-twice")
    with pytest.raises(CommandError, match="1 problem"):
        call_command("registry", "import", write(tmp_path, bad))
    err = capsys.readouterr().err
    assert (
        "semantic: Select a valid choice. at-least-twice is not one of the available choices."
        " Valid values: at-most-once, at-least-once, exactly-once-via-idempotency." in err
    )
    kafka = GOOD_FILE.replace("kind: rabbitmq", "kind: kafka")
    with pytest.raises(CommandError, match="problem"):
        call_command("registry", "import", write(tmp_path, kafka))
    err = capsys.readouterr().err
    assert "kind: Select a valid choice." in err and "Valid values: rabbitmq, redis, nats" in err


NUL_FILE = GOOD_FILE.replace("owner_team: payments", 'owner_team: "pay\\0ments"')
SURROGATE_FILE = GOOD_FILE.replace("owner_team: payments", 'owner_team: "pay\\ud800ments"')


@pytest.mark.parametrize(
    ("text", "message"),
    [(NUL_FILE, "a NUL character"), (SURROGATE_FILE, "a lone surrogate")],
)
def test_a_yaml_escape_the_database_cannot_store_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    """Issue #27 item 5: ``"\\0"`` in a value raised DataError with a traceback (--check too)."""
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "owner_team" in s)
    for check in (["--check"], []):
        with pytest.raises(CommandError, match="nothing was imported"):
            call_command("registry", "import", *check, write(tmp_path, text))
        assert f"channels.yaml:{line}: {message}" in capsys.readouterr().err
    assert not Channel.objects.exists() and not AuditEvent.objects.exists()


@pytest.mark.parametrize("action", ["check", "import"])
def test_the_import_page_answers_a_nul_escape_with_a_clear_error(
    registry_admin: User, action: str
) -> None:
    client = client_for(registry_admin)
    response = client.post("/channels/import/", {"text": NUL_FILE, "action": action})
    assert response.status_code == 200
    assert "a NUL character" in response.content.decode()
    assert not Channel.objects.exists()
