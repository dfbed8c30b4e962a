"""Journey 4 — a viewer sees redacted fields, has no replay or discard button, and a forged
replay POST from their signed-in browser is refused."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEvent
from dlq.models import DeadLetter, Status
from tests.conftest import PASSWORD, make_channel
from tests.dlq.conftest import letter, store
from tests.e2e.conftest import browser_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_viewer_sees_redactions_and_cannot_replay(journey: Any) -> None:
    browser_user("vera", "viewer")
    channel = make_channel(redact_json_paths=["$.customer.email"], redact_headers=["authorization"])
    body = b'{"order": 7, "customer": {"email": "ada@example.com", "name": "Ada"}}'
    (entry,) = store(
        channel, letter(body, headers={"authorization": "Bearer s3cr3t", "Idempotency-Key": "k-7"})
    )

    tab = journey("viewer")
    tab.sign_in("vera", PASSWORD)
    tab.go(f"/dead-letters/{entry.pk}/")
    main = tab.page.locator("main").inner_text()
    assert "ada@example.com" not in main and "s3cr3t" not in main
    assert "•••• redacted" in main and "Ada" in main
    # No way to act: no replay, discard or reveal controls for a viewer.
    for label in ("Replay", "Discard", "Reveal"):
        assert tab.page.get_by_role("button", name=label).count() == 0, label
    tab.shot("entry-redacted")
    # The raw download is refused for a redacted channel.
    response = tab.page.request.get(f"{tab.base}/dead-letters/{entry.pk}/raw/")
    assert response.status == 403

    # A forged POST, with a valid CSRF token taken from the page, is still refused.
    tab.go("/dead-letters/list/")
    token = tab.context.cookies()
    csrf = next(c["value"] for c in token if c["name"] == "csrftoken")
    forged = tab.page.request.post(
        f"{tab.base}/dead-letters/replay/",
        form={"ids": str(entry.pk), "reason": "forged", "confirm": "1"},
        headers={"X-CSRFToken": csrf, "Referer": f"{tab.base}/dead-letters/list/"},
    )
    assert forged.status == 403
    assert DeadLetter.objects.get(pk=entry.pk).status == Status.NEW
    assert AuditEvent.objects.filter(actor_username="vera", outcome="denied").exists()
    tab.check_clean()
