"""Issue #27 item 9: a refused acknowledgement, silence or registry import is audited (who
tried what, from where) before the 403, as refused dead-letter and audit actions are."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from alerts.models import Alert, Silence
from audit.models import AuditEvent, Outcome
from tests.alerts.test_pages import firing  # noqa: F401 - the fixture
from tests.conftest import client_for, make_channel

pytestmark = pytest.mark.django_db


def _denial(action: str) -> AuditEvent:
    [event] = AuditEvent.objects.filter(action=action, outcome=Outcome.DENIED)
    return event


def test_a_viewers_acknowledgement_is_refused_and_audited(viewer: User, firing: Alert) -> None:  # noqa: F811
    response = client_for(viewer).post(f"/alerts/{firing.pk}/ack/", {"note": "mine"})
    assert response.status_code == 403
    firing.refresh_from_db()
    assert firing.acknowledged_at is None
    event = _denial("alert.acknowledge")
    assert event.actor_username == viewer.username
    assert event.target_type == "alerts.alert" and f"#{firing.pk}" in event.target_repr
    assert event.after["permission"] == "alerts.ack_alert"


def test_a_viewers_silence_and_its_early_end_are_refused_and_audited(viewer: User) -> None:
    channel = make_channel()
    client = client_for(viewer)
    response = client.post(
        "/alerts/silences/", {"channel": channel.slug, "minutes": "60", "reason": "x"}
    )
    assert response.status_code == 403 and not Silence.objects.exists()
    event = _denial("alert.silence")
    assert event.actor_username == viewer.username and channel.slug in event.target_repr
    assert client.post("/alerts/silences/12345/expire/").status_code == 403
    assert _denial("alert.silence.expire").target_repr == "silence #12345"


def test_a_registry_import_by_an_oncall_user_is_refused_and_audited(oncall: User) -> None:
    client = client_for(oncall)
    assert client.get("/channels/import/").status_code == 403
    response = client.post("/channels/import/", {"text": "brokers: []", "action": "import"})
    assert response.status_code == 403
    events = AuditEvent.objects.filter(action="registry.import", outcome=Outcome.DENIED)
    assert [e.after["method"] for e in events.order_by("id")] == ["GET", "POST"]
    assert events.order_by("id").last().after["action"] == "import"  # type: ignore[union-attr]
    assert {e.actor_username for e in events} == {oncall.username}
