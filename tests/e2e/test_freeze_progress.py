"""A large replay is frozen in the background: the on-call engineer confirms it, lands on the
plan's page at once, and watches the freeze's progress bar move (htmx polling) until the plan
is frozen and queued for the relay."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from dlq.models import PlanStatus, ReplayPlan
from dlq.plans import freeze
from tests.conftest import PASSWORD, make_channel
from tests.dlq.conftest import letter, store
from tests.e2e.conftest import browser_user, off_loop

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The server process and this one freeze anything above 2 entries in the background, 4
    entries per chunk; no scheduler in the server, so the test decides when chunks run."""
    for name, value in (("DLO_FREEZE_INLINE", "2"), ("DLO_FREEZE_CHUNK", "4")):
        monkeypatch.setenv(name, value)
        setattr(settings, name, int(value))
    monkeypatch.setenv("DLO_FOUR_EYES_THRESHOLD", "100")
    settings.DLO_FOUR_EYES_THRESHOLD = 100


def test_the_freeze_progress_bar_moves_until_the_plan_is_queued(journey: Any) -> None:
    browser_user("otto", "oncall")
    channel = make_channel()
    store(channel, *[letter(headers={"Idempotency-Key": f"k-{i}"}) for i in range(10)])

    tab = journey("freeze-progress")
    tab.sign_in("otto", PASSWORD)
    page = tab.page
    tab.go("/dead-letters/replay/?channel=orders")
    expect(page.locator(".replay-count")).to_have_text("10")
    page.fill("textarea[name=action_reason]", "consumer fixed in 4.2.1")
    page.get_by_role("button", name="Freeze the replay plan").click()
    page.wait_for_load_state()
    plan = ReplayPlan.objects.get()
    assert f"/dead-letters/replays/{plan.pk}/" in page.url
    assert plan.status == PlanStatus.FREEZING
    bar = page.locator("progress.freeze-bar")
    expect(page.locator("#progress")).to_contain_text("Freezing the selection: 0 of 10 entries")
    expect(bar).to_have_attribute("value", "0")
    expect(bar).to_have_attribute("max", "10")
    expect(page.locator(".messages")).to_contain_text("freezing them in the background")

    # The background job (a Celery worker in production) freezes two chunks; the page polls.
    off_loop(freeze.run_freeze, plan.pk, max_chunks=2)
    expect(page.locator("#progress")).to_contain_text("8 of 10 entries (80%)", timeout=10_000)
    expect(bar).to_have_attribute("value", "8")
    assert page.locator("main").get_by_text("Approve").count() == 0
    tab.shot("1-freezing")
    assert not tab.axe("freezing")

    off_loop(freeze.run_freeze, plan.pk)
    expect(page.locator("#progress")).to_contain_text("Queued", timeout=10_000)
    expect(page.locator("progress.freeze-bar")).to_have_count(0)
    expect(page.locator("progress.replay-bar")).to_have_attribute("max", "10")
    # Frozen: the page reloaded itself once, so its items and controls are current too.
    expect(page.locator("main table.replay-items tbody tr")).to_have_count(10, timeout=10_000)
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    tab.shot("2-queued")
    tab.check_clean()
