"""User- and broker-supplied text shows direction overrides and control characters as visible
markers on every page that displays it, not only on the dead-letter pages."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db

RLO = "\u202e"


def test_audit_page_marks_overrides_in_actor_and_reveal_reason(compliance: User) -> None:
    # A stranger's sign-in attempt puts whatever they typed in the actor column.
    Client().post("/login/", {"username": f"admin{RLO}txt.exe", "password": "x"})
    channel = make_channel(redact_json_paths=["$.card"])
    [entry] = store(channel, letter(b'{"card": "4111"}'))
    client = client_for(compliance)
    reason = f"INC-42{RLO}ticket{chr(0x2066)}"
    assert client.post(f"/dead-letters/{entry.pk}/reveal/", {"reason": reason}).status_code == 200
    html = client.get("/audit/").content.decode()
    assert RLO not in html and chr(0x2066) not in html
    assert "admin⟨U+202E⟩txt.exe" in html
    assert "INC-42⟨U+202E⟩ticket⟨U+2066⟩" in html


def test_replay_plan_pages_mark_overrides_in_the_reason(oncall: User) -> None:
    channel = make_channel()
    [entry] = store(channel, letter(b"{}"))
    client = client_for(oncall)
    response = client.post(
        "/dead-letters/discard/", {"id": str(entry.pk), "action_reason": f"cleanup{RLO}evil"}
    )
    assert response.status_code == 302
    for url in ("/dead-letters/replays/", response["Location"]):
        html = client.get(url).content.decode()
        assert RLO not in html and "cleanup⟨U+202E⟩evil" in html
