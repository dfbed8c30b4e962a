"""Journey 3 — a registry admin declares a channel with a missing semantic, sees the error
finding, fixes it, sees the channel on the board; then imports a YAML file with an error and
sees the line-precise message."""

from __future__ import annotations

from typing import Any

import pytest

from channels_registry.models import Channel
from tests.conftest import PASSWORD, make_broker
from tests.e2e.conftest import browser_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

BAD_YAML = """\
version: 1
brokers:
  - name: main-rabbit
    kind: rabbitmq
    url_env: DLO_BROKER_RABBITMQ_URL
channels:
  - slug: refunds
    name: Refunds
    broker: main-rabbit
    address: refunds
    semantic: at-least-twice
"""


def test_registry_admin_declares_fixes_and_imports(journey: Any) -> None:
    browser_user("rita", "registry_admin", staff=True)
    broker = make_broker()
    tab = journey("registry-admin")
    tab.sign_in("rita", PASSWORD)

    # 1. Declare a channel without a delivery semantic.
    tab.go("/admin/channels_registry/channel/add/")
    page = tab.page
    page.select_option("#id_broker", str(broker.pk))
    page.fill("#id_name", "Payments events")  # the admin fills the slug from the name
    page.fill("#id_address", "payments.q")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    assert "declaration error" in page.locator(".messagelist").inner_text()

    # 2. The channel page shows the error finding.
    channel = Channel.objects.get(name="Payments events")
    tab.go(f"/channels/{channel.slug}/")
    findings = page.locator("ul.findings").inner_text()
    assert "The delivery semantic is not stated." in findings
    tab.shot("finding")

    # 3. Fix it: declare at-most-once (telemetry-like), save, and the error is gone.
    tab.go(f"/admin/channels_registry/channel/{channel.pk}/change/")
    page.select_option("#id_semantic", "at-most-once")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    tab.go(f"/channels/{channel.slug}/")
    assert "The delivery semantic is not stated." not in page.locator("main").inner_text()
    assert "At-most-once" in page.locator("dl.contract").last.inner_text()

    # 4. It is on the board.
    tab.go("/")
    assert page.locator("main table", has_text="Payments events").count() == 1
    tab.shot("board")

    # 5. Importing a file with an error names the line, and imports nothing.
    tab.go("/channels/import/")
    page.fill("#id_text", BAD_YAML)
    page.click("button[value=import]")
    page.wait_for_load_state()
    problems = page.locator(".import-problems").inner_text()
    assert "line 11" in problems and "semantic" in problems
    assert "nothing was imported" in problems
    assert not Channel.objects.filter(slug="refunds").exists()
    tab.shot("import-error")
    tab.check_clean()
