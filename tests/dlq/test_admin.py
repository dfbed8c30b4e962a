"""Issue #27 item 2: the Django admin shows dead letters as the pages do to someone who has
not revealed: headers and body redacted per the channel's rules (registry admins are staff
without the reveal permission), text through ``visible``, and no reveal path at all."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEvent
from dlq.models import FailureGroup
from dlq.text.redaction import MASK
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db

TOKEN = "Bearer sk-live-0f9e8d7c"
CARD = "4111111111111111"


def _redacted_entry() -> int:
    channel = make_channel(redact_headers=["authorization"], redact_json_paths=["$.card"])
    headers = {"Authorization": TOKEN, "x-trace": "t-1\u202eevil\u2060"}
    body = json.dumps({"card": CARD, "order": "o-1"}).encode()
    [entry] = store(channel, letter(body, headers=headers))
    return entry.pk


def test_a_registry_admin_sees_the_entry_redacted_in_the_admin(registry_admin: User) -> None:
    pk = _redacted_entry()
    assert not registry_admin.has_perm("channels_registry.reveal_channel_payload")
    client = client_for(registry_admin)
    events_before = AuditEvent.objects.count()
    response = client.get(f"/admin/dlq/deadletter/{pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    assert TOKEN not in html and "sk-live" not in html
    assert CARD not in html
    assert html.count(MASK) >= 2  # the header and the body field
    assert "o-1" in html  # what the rules leave is shown
    # Invisible and direction characters from the message show as markers here too.
    assert "\u202e" not in html and "\u2060" not in html
    assert "t-1⟨U+202E⟩evil⟨U+2060⟩" in html
    # No raw JSON widget and no reveal: nothing to audit, and the entry page is linked.
    assert "<textarea" not in html and f'href="/dead-letters/{pk}/"' in html
    assert AuditEvent.objects.count() == events_before
    listing = client.get("/admin/dlq/deadletter/").content.decode()
    assert TOKEN not in listing and CARD not in listing


def test_even_a_superuser_gets_the_redacted_view_in_the_admin() -> None:
    """The admin has one path, the redacted one: revealing is the entry page's audited action."""
    pk = _redacted_entry()
    root = User.objects.create_superuser("root-admin", password="x")
    html = client_for(root).get(f"/admin/dlq/deadletter/{pk}/change/").content.decode()
    assert TOKEN not in html and CARD not in html and MASK in html


def test_failure_group_admin_pages_mark_invisible_and_control_characters(
    registry_admin: User,
) -> None:
    channel = make_channel(name="Orders\u200b\u202e")
    store(channel, letter(b"{}", reason="rejected\x1b[31m\u00ad"))
    group = FailureGroup.objects.get(channel=channel)
    client = client_for(registry_admin)
    for url in ("/admin/dlq/failuregroup/", f"/admin/dlq/failuregroup/{group.pk}/change/"):
        html = client.get(url).content.decode()
        for raw in ("\u200b", "\u202e", "\x1b", "\u00ad"):
            assert raw not in html, (url, raw)
        assert "Orders⟨U+200B⟩⟨U+202E⟩" in html, url
        assert "rejected␛[31m⟨U+00AD⟩" in html, url
