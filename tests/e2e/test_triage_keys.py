"""Issue 15.5: the list's keyboard path (j/k, x, r, /, ?) and select-all, in a real browser."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import PASSWORD
from tests.e2e.conftest import browser_user
from tests.e2e.screens import incident

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_keyboard_moves_selects_and_opens_the_replay_preview(journey: Any) -> None:
    browser_user("otto", "oncall")
    scene = incident()
    newest_first = sorted((e.pk for e in scene["entries"]), reverse=True)
    tab = journey("triage-keys")
    tab.sign_in("otto", PASSWORD)
    tab.go("/dead-letters/list/")
    page = tab.page
    page.keyboard.press("?")
    assert page.locator("#shortcut-help").is_visible()
    page.keyboard.press("Escape")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    current = page.locator("tr.is-current")
    assert current.count() == 1 and f">{newest_first[0]}<" in current.inner_html()
    page.keyboard.press("x")
    assert page.locator(f"input[name=id][value='{newest_first[0]}']").is_checked()
    assert page.locator("#select-all").evaluate("b => b.indeterminate")
    page.locator("#select-all").check()  # every entry on the page
    assert page.locator("input[name=id]:checked").count() == len(newest_first)
    page.locator("#select-all").uncheck()
    page.get_by_role("button", name="Next").click()  # the visible twin of j
    page.keyboard.press("x")
    page.keyboard.press("/")
    assert page.evaluate("() => document.activeElement.name") == "q"
    page.keyboard.press("Escape")
    tab.shot("selected")
    with page.expect_navigation():
        page.keyboard.press("r")
    assert "/dead-letters/replay/" in page.url and f"id={newest_first[1]}" in page.url
    assert not tab.axe("replay-preview")
    tab.check_clean()
