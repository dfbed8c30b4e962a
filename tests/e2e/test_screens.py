"""Issue 15 journeys: every page at 1440 px and 390 px, light and dark, with axe-core on each
(zero serious or critical violations), screenshots in artifacts/screenshots/screens-*.png."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import PASSWORD
from tests.e2e.conftest import ARTIFACTS, browser_user
from tests.e2e.screens import incident

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SIZES = {"wide": (1440, 900), "phone": (390, 844)}


def _pages(scene: dict[str, Any]) -> dict[str, str]:
    entry = scene["entries"][0]
    return {
        "board": "/",
        "channels": "/channels/",
        "channel": f"/channels/{scene['orders'].slug}/",
        "groups": "/dead-letters/",
        "entries": "/dead-letters/list/",
        "entry": f"/dead-letters/{entry.pk}/",
        "plans": "/dead-letters/replays/",
        "audit": "/audit/",
        "alerts": "/alerts/",
    }


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", list(SIZES))
def test_every_page_reads_at_every_size_in_both_themes(
    journey: Any, size: str, scheme: str
) -> None:
    browser_user("otto", "oncall", "compliance")
    scene = incident()
    width, height = SIZES[size]
    tab = journey(f"screens-{size}-{scheme}", width=width, height=height, color_scheme=scheme)
    tab.sign_in("otto", PASSWORD)
    failing: dict[str, Any] = {}
    for label, path in _pages(scene).items():
        assert tab.go(path).status == 200, path
        tab.page.wait_for_timeout(150)  # ui.js: theme and local times applied
        overflow = tab.page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, f"{label}: the page scrolls sideways by {overflow} px at {width} px"
        bad = tab.axe(label)
        if bad:
            failing[label] = bad
        tab.shot(label)
        tab.shot(f"{label}-first-screen", full_page=False)  # what one sees without scrolling
    counts = {
        label: {i: sum(1 for v in found if v["impact"] == i) for i in ("serious", "critical")}
        for label, found in tab.axe_results.items()
    }
    summary = ARTIFACTS / f"axe-{size}-{scheme}.json"
    summary.write_text(json.dumps({"counts": counts, "violations": tab.axe_results}, indent=1))
    assert not failing, json.dumps(failing, indent=1)
    tab.check_clean()


def test_theme_toggle_sticks_and_times_read_in_the_viewers_zone(journey: Any) -> None:
    browser_user("otto", "oncall", "compliance")
    scene = incident()
    tab = journey("theme-time", color_scheme="dark", timezone_id="America/New_York")
    tab.sign_in("otto", PASSWORD)
    root = tab.page.locator("html")
    toggle = tab.page.locator("#theme-toggle")
    assert toggle.inner_text() == "Theme: auto" and root.get_attribute("data-theme") is None
    toggle.click()  # auto → light, although the system is dark
    assert root.get_attribute("data-theme") == "light" and toggle.inner_text() == "Theme: light"
    bg = "() => getComputedStyle(document.body).backgroundColor"
    assert tab.page.evaluate(bg) == "rgb(246, 247, 249)"
    tab.go("/audit/")  # another page, the choice holds
    assert root.get_attribute("data-theme") == "light"
    assert tab.page.evaluate(bg) == "rgb(246, 247, 249)"
    tab.page.locator("#theme-toggle").click()  # light → dark
    tab.go("/alerts/")
    assert root.get_attribute("data-theme") == "dark"
    assert tab.page.evaluate(bg) == "rgb(18, 21, 28)"

    # Times: the viewer's zone (New York, UTC-5 in December), UTC on hover.
    entry = scene["entries"][0]
    tab.go(f"/dead-letters/{entry.pk}/")
    first = tab.page.locator("time[data-local]").first
    utc = first.get_attribute("title")
    assert utc is not None and utc.endswith(" UTC")
    shown = first.inner_text()
    assert "UTC" not in shown and ("EST" in shown or "GMT-5" in shown), shown
    # Chart hover titles too: the viewer's time first, UTC kept beside it.
    tab.go(f"/channels/{scene['orders'].slug}/")
    band = tab.page.locator("svg rect.hit[data-t] > title").first
    hover = band.text_content() or ""
    assert ("EST" in hover or "GMT-5" in hover) and hover.count("UTC") == 1, hover
    tab.go("/audit/")
    cell = tab.page.locator("td.time time").first
    assert "UTC" not in cell.inner_text() and (cell.get_attribute("title") or "").endswith("UTC")
    tab.check_clean()
