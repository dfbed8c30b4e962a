"""Issue 26, the 3 a.m. pass round two, in the browser: a plan awaiting approval reaches its
approver, firing alerts show their value now (live), the compliance page is as strong as its
CLI, the smaller fixes, contrast (axe) on /alerts/ with muted rows and the admin forms, and
the entries list on a phone.

Screenshots at 1440 px and 390 px land in ``artifacts/screenshots/`` (or ``DLO_SHOTS_DIR``,
prefixed with ``DLO_SHOTS_LABEL``, for before/after comparisons)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from alerts.models import Alert
from audit.actions import Actor, record
from audit.models import AuditEvent, AuditHead, ChainVerification
from channels_registry.models import ChannelHealth
from dlq.models.plans import PlanStatus, ReplayPlan
from tests.conftest import PASSWORD, make_broker, make_channel, make_user
from tests.dlq.conftest import letter, store
from tests.e2e.conftest import ARTIFACTS, browser_user
from tests.e2e.screens import incident

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VERIFIER = Path(__file__).resolve().parents[2] / "audit" / "verify_export.py"
WIDE, PHONE = (1440, 900), (390, 844)


def snap(tab: Any, name: str) -> None:
    """The page as it is at 1440 px and at 390 px (first screen and full page)."""
    out = Path(os.environ.get("DLO_SHOTS_DIR") or ARTIFACTS)
    out.mkdir(parents=True, exist_ok=True)
    label = os.environ.get("DLO_SHOTS_LABEL", "")
    size = tab.page.viewport_size
    for width, height in (WIDE, PHONE):
        tab.page.set_viewport_size({"width": width, "height": height})
        tab.page.wait_for_timeout(100)
        prefix = f"{label}-" if label else ""
        tab.page.screenshot(path=str(out / f"{prefix}{name}-{width}.png"), full_page=True)
        tab.page.screenshot(path=str(out / f"{prefix}{name}-{width}-first-screen.png"))
    tab.page.set_viewport_size(size)


def _awaiting(channel: Any, requester: Any, **fields: Any) -> ReplayPlan:
    values: dict[str, Any] = {
        "kind": "replay",
        "status": PlanStatus.AWAITING_APPROVAL,
        "channel": channel,
        "target_name": channel.address,
        "requested_by": requester,
        "requested_by_username": requester.get_username(),
        "reason": "payments fixed, replaying the timeouts",
        "total": 1160,
        "needs_approval": True,
        "selection": {"mode": "group", "ids": [], "filter": {"group": "7"}},
    }
    values.update(fields)
    return ReplayPlan.objects.create(**values)


# --- 1. a plan awaiting approval reaches the people who can approve it ----------------------


def test_a_plan_awaiting_approval_shows_in_the_approvers_top_bar_and_board(journey: Any) -> None:
    alice = browser_user("alice", "oncall")
    browser_user("bob", "oncall")
    browser_user("vera", "viewer")
    channel = make_channel()
    plan = _awaiting(channel, alice)

    bob = journey("approver")
    bob.sign_in("bob", PASSWORD)
    bob.go("/")
    badge = bob.page.locator("#approvals-badge")
    expect(badge).to_be_visible()
    expect(badge).to_have_text("1 plan awaits your approval")
    board = bob.page.locator("section.approvals")
    expect(board).to_contain_text(f"Replay plan #{plan.pk}")
    expect(board).to_contain_text("requested by alice")
    snap(bob, "approvals-board")
    # The count follows new plans without a reload (polled like the alert badge).
    _awaiting(channel, alice, reason="second batch")
    expect(badge).to_have_text("2 plans await your approval", timeout=15_000)
    bob.page.get_by_role("link", name="Replay plan #" + str(plan.pk)).click()
    expect(bob.page.get_by_role("button", name=re.compile("Approve"))).to_be_visible()
    bob.check_clean()

    # Four-eyes: the requester is never asked to approve their own plans; a viewer cannot.
    for name in ("alice", "vera"):
        tab = journey(name)
        tab.sign_in(name, PASSWORD)
        tab.go("/")
        assert tab.page.locator("#approvals-badge:visible").count() == 0
        assert tab.page.locator("section.approvals").count() == 0
        tab.check_clean()


# --- 2. every firing alert shows its value now, and it moves with the data -------------------


def test_firing_alert_values_move_with_the_data_inflow_and_poison_too(journey: Any) -> None:
    browser_user("otto", "oncall")
    broker = make_broker(name="main-rabbit")
    channel = make_channel(broker, poison_address="orders.poison", alert_dlq_depth=None)
    now = timezone.now()
    store(channel, *[letter() for _ in range(4)])
    store(channel, letter(b"\xff not json"), source="poison")
    ChannelHealth.objects.update_or_create(
        channel=channel,
        defaults={"state": "ok", "severity": 10, "backlog": 0, "dlq_depth": 0,
                  "poison_depth": 0, "dlq_unresolved": 4, "poison_unresolved": 1,
                  "last_sample_at": now, "updated_at": now},
    )  # fmt: skip
    common = {"broker": broker, "channel": channel, "state": "firing", "started_at": now,
              "fired_at": now, "last_evaluated_at": now, "threshold": 1}  # fmt: skip
    Alert.objects.create(
        rule="dlq-inflow", key=f"dlq-inflow:c{channel.pk}", severity="warning",
        summary="4 new dead letter(s) in 5 min", value=4, fired_value=4, **common,
    )  # fmt: skip
    Alert.objects.create(
        rule="poison-inflow", key=f"poison-inflow:c{channel.pk}", severity="critical",
        summary="1 new poison message(s) in 5 min", value=1, fired_value=1, **common,
    )  # fmt: skip
    Alert.objects.create(
        rule="poison-depth", key=f"poison-depth:c{channel.pk}", severity="critical",
        summary="poison depth 1 > 0", value=1, fired_value=1, **common,
    )  # fmt: skip

    tab = journey("alert-values")
    tab.sign_in("otto", PASSWORD)
    tab.go("/alerts/")
    rows = tab.page.locator("#alerts tr.alert-row")
    expect(rows).to_have_count(3)

    def values(rule: str) -> Any:
        return tab.page.locator("#alerts tr.alert-row", has_text=rule).locator(".alert-values")

    expect(values("DLQ inflow")).to_have_text("at firing 4 · now 4")
    expect(values("Poison inflow")).to_have_text("at firing 1 · now 1")
    expect(values("Poison depth")).to_have_text("at firing 1 · now 1")
    snap(tab, "alerts-values")
    # Hundreds more arrive: the list (polled every 10 s) follows without a reload.
    store(channel, *[letter() for _ in range(6)])
    store(channel, *[letter(b"\xfe bad") for _ in range(2)], source="poison")
    ChannelHealth.objects.filter(pk=channel.pk).update(dlq_unresolved=10, poison_unresolved=3)
    expect(values("DLQ inflow")).to_have_text("at firing 4 · now 10", timeout=15_000)
    expect(values("Poison inflow")).to_have_text("at firing 1 · now 3")
    expect(values("Poison depth")).to_have_text("at firing 1 · now 3")
    # The alert's own page too.
    alert = Alert.objects.get(rule="dlq-inflow")
    tab.go(f"/alerts/{alert.pk}/")
    expect(tab.page.locator("#alert-values")).to_have_text("(at firing 4 · now 10)")
    tab.check_clean()


# --- 4. the compliance page is as strong as its CLI ------------------------------------------


@pytest.fixture
def signing(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint signing key and sink, shared by this process and the server's."""
    from audit.checkpoints import keygen

    key = tmp_path / "signing.key"
    keygen(key)
    sink = tmp_path / "checkpoints"
    settings.DLO_AUDIT_SIGNING_KEY = str(key)
    settings.DLO_AUDIT_CHECKPOINT_DIR = str(sink)
    monkeypatch.setenv("DLO_AUDIT_SIGNING_KEY", str(key))
    monkeypatch.setenv("DLO_AUDIT_CHECKPOINT_DIR", str(sink))
    return key


def test_the_audit_page_is_as_strong_as_the_cli(
    signing: Path, journey: Any, tmp_path: Path
) -> None:
    from audit.checkpoints import write_checkpoint

    browser_user("cora", "compliance")
    otto = make_user("otto", "oncall")
    channel = make_channel()
    plan = _awaiting(channel, otto)
    for i in range(3):
        record("dlq.replay.request", actor=Actor.for_user(otto), target_type="dlq.deadletter",
               target_id=100 + i, after={"plan": plan.pk}, channel_slug=channel.slug)  # fmt: skip
        record("registry.channel.change", actor=Actor.for_user(otto), target=channel)
    plan_events = AuditEvent.objects.filter(plan_id=str(plan.pk)).count()
    assert plan_events == 3
    # A verification from long ago, of the first event only: not the current state.
    ChainVerification.objects.create(
        finished_at=timezone.now() - dt.timedelta(hours=3),
        ok=True,
        events=1,
        head_seq=1,
        head_hash="ab" * 32,
    )
    write_checkpoint(force=True)
    head = AuditHead.objects.get(pk=1).seq

    tab = journey("compliance-page")
    page = tab.page
    tab.sign_in("cora", PASSWORD)
    tab.go("/audit/")
    result = page.locator("#chain-result")
    expect(result).to_contain_text("Out of date")
    expect(result).to_contain_text("#1")
    assert "OK" not in result.inner_text()
    snap(tab, "audit-stale")

    # The plan filter is on the form; the page and its exports keep it through "Verify now".
    page.fill("input[name=plan]", str(plan.pk))
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(rf"plan={plan.pk}\b"))
    expect(page.locator("#rows table.audit > tbody > tr")).to_have_count(plan_events)
    page.get_by_role("button", name="Verify now").click()
    expect(page).to_have_url(re.compile(rf"plan={plan.pk}\b"))
    expect(page.locator("input[name=plan]")).to_have_value(str(plan.pk))
    expect(page.locator("#rows table.audit > tbody > tr")).to_have_count(plan_events)
    with page.expect_download() as jsonl:
        page.get_by_role("link", name="JSON Lines").click()
    path = tmp_path / "plan.jsonl"
    jsonl.value.save_as(path)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(events) == plan_events and {e["plan_id"] for e in events} == {str(plan.pk)}

    # Each export says in one sentence what it proves; the proof export is on the page.
    exports = page.locator("section.exports")
    expect(exports).to_contain_text("not that none is missing")
    expect(exports).to_contain_text("Proves completeness")
    snap(tab, "audit-exports")
    with page.expect_download() as proof:
        page.get_by_role("link", name="Proof export").click()
    proof_path = tmp_path / "plan-proof.jsonl"
    proof.value.save_as(proof_path)
    lines = [json.loads(line) for line in proof_path.read_text().splitlines()]
    assert lines[0]["format"] == "dlo-audit-proof/1" and lines[0]["filters"] == {
        "plan": str(plan.pk)
    }
    shown = [e for e in lines[1:] if not e.get("withheld")]
    assert len(lines) - 1 == head and len(shown) == plan_events
    check = subprocess.run(
        [sys.executable, str(VERIFIER), str(proof_path), "--public-key", f"{signing}.pub"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    # The export is audited like the CLI's.
    assert AuditEvent.objects.filter(action="audit.export", after__format="proof").exists()
    tab.check_clean()


# --- 8. the smaller things -----------------------------------------------------------------


def test_the_smaller_things_read_right(journey: Any) -> None:
    browser_user("otto", "oncall", staff=False)
    tab = journey("smaller")
    tab.sign_in("otto", PASSWORD)
    # First run: no channel yet, and the next step named.
    tab.go("/")
    expect(tab.page.locator("main")).to_contain_text("make demo")
    snap(tab, "first-run")

    broker = make_broker(name="rabbit-no-api", management_url="")
    channel = make_channel(broker, redact_json_paths=["$.card"], redact_headers=["authorization"])
    (entry,) = store(channel, letter(b'{"card": "4111"}', headers={"Idempotency-Key": "k"}))
    plan = _awaiting(channel, make_user("alice", "oncall"))

    # The channel page says the management API is missing, with the fix.
    tab.go(f"/channels/{channel.slug}/")
    note = tab.page.locator(".management-note")
    expect(note).to_contain_text("management API is not configured")
    expect(note).to_contain_text("rabbitmq-plugins enable rabbitmq_management")
    snap(tab, "channel-management-note")
    # A body rule masks the body; no header is masked, so the headers carry no badge.
    tab.go(f"/dead-letters/{entry.pk}/")
    headers = tab.page.locator("h2", has_text="Headers")
    expect(headers).to_be_visible()
    assert headers.locator(".badge").count() == 0
    expect(tab.page.locator("h2", has_text="Body").locator(".badge")).to_have_text("redacted")
    # The last-24 h column in words.
    tab.go("/dead-letters/")
    expect(tab.page.locator("thead")).to_contain_text("vs the 24 h before")
    expect(tab.page.locator("tbody td.num").last).to_contain_text("up from 0 the day before")
    snap(tab, "groups-trend")
    # The plan's selection in words.
    tab.go(f"/dead-letters/replays/{plan.pk}/")
    selection = tab.page.locator("dt:has-text('Selection') + dd")
    expect(selection).to_have_text("the entries of failure group #7")
    snap(tab, "plan-selection")
    tab.check_clean()


# --- 6. contrast: /alerts/ with muted rows, the top bar's focus ring, the admin forms ---------


def _scene_with_muted_alerts() -> dict[str, Any]:
    scene = incident()
    orders, billing = scene["orders"], scene["billing"]
    now = timezone.now()
    common = {"broker": orders.broker, "state": "firing", "started_at": now, "fired_at": now,
              "last_evaluated_at": now, "threshold": 150}  # fmt: skip
    Alert.objects.create(
        rule="backlog", key=f"backlog:c{orders.pk}", channel=orders, severity="warning",
        summary="backlog 336 ≥ 150", value=336, fired_value=166, inhibited=True, **common,
    )  # fmt: skip
    Alert.objects.create(
        rule="lag", key=f"lag:c{billing.pk}", channel=billing, severity="warning",
        summary="lag 4 min ≥ 2 min", value=240, fired_value=130, inhibited=True, **common,
    )  # fmt: skip
    return scene


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_alerts_with_muted_rows_and_the_admin_forms_pass_axe_at_both_widths(
    journey: Any, scheme: str
) -> None:
    browser_user("root", "oncall", "compliance", "registry_admin", staff=True)
    scene = _scene_with_muted_alerts()
    orders = scene["orders"]
    broker = orders.broker
    plan = _awaiting(orders, make_user("alice", "oncall"))
    alert = Alert.objects.filter(inhibited=True).first()
    assert alert is not None
    pages = [
        "/alerts/",
        f"/alerts/{alert.pk}/",
        f"/dead-letters/replays/{plan.pk}/",
        f"/dead-letters/replay/?channel={orders.slug}",
        "/channels/principles/",
        "/channels/import/",
        "/admin/",
        "/admin/channels_registry/broker/add/",
        f"/admin/channels_registry/broker/{broker.pk}/change/",
        "/admin/channels_registry/channel/add/",
        f"/admin/channels_registry/channel/{scene['orders'].pk}/change/",
        "/admin/channels_registry/channel/",
        "/admin/alerts/destination/add/",
        "/admin/alerts/destination/",
        "/admin/channels_registry/broker/",
    ]
    failing: dict[str, Any] = {}
    rings: list[str] = []
    for width, height in (WIDE, PHONE):
        tab = journey(f"axe-{scheme}-{width}", width=width, height=height, color_scheme=scheme)
        tab.sign_in("root", PASSWORD)
        for path in pages:
            assert tab.go(path).status == 200, path
            tab.page.wait_for_timeout(150)
            bad = tab.axe(path)
            if bad:
                failing[f"{width} {path}"] = bad
        tab.go("/alerts/")
        if width == WIDE[0]:
            snap(tab, f"alerts-muted-{scheme}")
        # The focus ring on the dark top bar reads in either theme (3:1 at least).
        tab.page.keyboard.press("Tab")  # the skip link
        tab.page.keyboard.press("Tab")  # the brand, on the top bar
        rings.append(
            tab.page.evaluate("() => getComputedStyle(document.activeElement).outlineColor")
        )
    assert not failing, json.dumps(failing, indent=1)
    assert rings == ["rgb(255, 255, 255)"] * 2, rings


# --- 5. the entries list on a phone ----------------------------------------------------------


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_entries_on_a_phone_are_cards_with_filters_folded_and_the_first_above_the_fold(
    journey: Any, scheme: str
) -> None:
    browser_user("otto", "oncall")
    browser_user("alice", "oncall")
    channel = make_channel()
    store(channel, *[letter(headers={"Idempotency-Key": f"k-{i}", "x-error-class": "Timeout",
                                     "x-error-message": "payments-api timed out " * 4})
                     for i in range(30)])  # fmt: skip
    _awaiting(channel, make_user("carol", "oncall"))  # the top bar carries the approvals too
    tab = journey(f"entries-phone-{scheme}", width=PHONE[0], height=PHONE[1], color_scheme=scheme)
    tab.sign_in("otto", PASSWORD)
    tab.go(f"/dead-letters/list/?channel={channel.slug}")
    page = tab.page
    fold = page.locator("details.filter-fold")
    assert fold.evaluate("d => d.open") is False
    expect(page.locator("select[name=status]")).to_be_hidden()
    first = page.locator("table.dlq-entries tbody tr").first
    box = first.bounding_box()
    assert box is not None and box["y"] + 40 < PHONE[1], box  # the first card starts above it
    assert first.evaluate("tr => getComputedStyle(tr).display") == "grid"
    widths = page.evaluate(
        "() => [document.querySelector('table.dlq-entries').scrollWidth,"
        " document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
    expect(first.locator("td[data-label=Channel]")).to_have_text(channel.slug)
    bad = tab.axe("entries-phone")
    assert not bad, json.dumps(bad, indent=1)
    page.locator("details.filter-fold > summary").click()
    expect(page.locator("select[name=status]")).to_be_visible()
    if scheme == "light":
        page.locator("details.filter-fold > summary").click()
        snap(tab, "entries")
    # Wide: a table, every filter in view.
    page.set_viewport_size({"width": WIDE[0], "height": WIDE[1]})
    tab.go(f"/dead-letters/list/?channel={channel.slug}")
    expect(page.locator("select[name=status]")).to_be_visible()
    assert first.evaluate("tr => getComputedStyle(tr).display") == "table-row"
    tab.check_clean()


# --- 7. charts for people who read charts ----------------------------------------------------


def test_charts_read_by_keyboard_mouse_and_touch_zoom_to_a_shared_range(journey: Any) -> None:
    browser_user("otto", "oncall")
    scene = incident()
    orders = scene["orders"]
    tab = journey("charts", has_touch=True)
    tab.sign_in("otto", PASSWORD)
    tab.go(f"/channels/{orders.slug}/")
    page = tab.page
    backlog = page.locator("figure.chart").first
    # Readable y-axis: round ticks as text beside the plot, more than max and 0.
    ticks = backlog.locator(".y-axis span").all_inner_texts()
    assert len(ticks) >= 3 and ticks[0] == "0", ticks
    # Keyboard: focus the plot, step with the arrows; the value is spoken (aria-live).
    plot = backlog.locator(".plot")
    plot.focus()
    readout = backlog.locator(".readout")
    expect(readout).to_contain_text("Backlog 336")  # the last sample (100 + 4 × 59)
    page.keyboard.press("ArrowLeft")
    expect(readout).to_contain_text("Backlog 332")
    assert readout.get_attribute("aria-live") == "polite"
    page.keyboard.press("Home")
    expect(readout).to_contain_text("Backlog 100")
    # Every chart follows the same time.
    expect(page.locator("figure.chart").nth(1).locator(".readout")).to_contain_text("DLQ depth")
    snap(tab, "charts-keyboard")
    # Mouse: the crosshair follows the pointer.
    box = backlog.locator("svg").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
    expect(readout).to_contain_text("Backlog 2")
    assert backlog.locator("line.crosshair").get_attribute("visibility") == "visible"
    # Touch: a tap reads the value there.
    page.touchscreen.tap(box["x"] + box["width"] - 3, box["y"] + box["height"] / 2)
    expect(readout).to_contain_text("Backlog 336")
    # The table view holds the same values.
    table = backlog.locator(".chart-table")
    table.locator("summary").click()
    expect(table.locator("tbody tr").last).to_contain_text("336")
    # Drag across a chart: every chart shows that range, and it is in the URL.
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 20)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 20, steps=5)
    page.mouse.up()
    page.wait_for_url(re.compile(r"from=\d+&to=\d+"))
    starts = {
        page.locator(".chart .plot").nth(i).get_attribute("data-start")
        for i in range(page.locator(".chart .plot").count())
    }
    assert len(starts) == 1 and starts != {None}
    assert page.locator("input[name=from]").input_value()
    snap(tab, "charts-zoomed")
    tab.check_clean()
