"""Journey 1 — on-call: sign in → the board shows a channel turn STOPPED live → open its DLQ
failure group → inspect an entry with a hostile payload (nothing executes) → preview a replay of
the group → confirm → the plan runs and finishes → entries REPLAYED on the broker with their
replay id → the audit shows every step."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from playwright.sync_api import expect

from audit.models import AuditEvent
from channels_registry.polling import do_poll_broker
from dlq.capture.ingest import do_ingest_channel
from dlq.models import DeadLetter, Status
from dlq.models.plans import PlanStatus, ReplayPlan
from dlq.plans.relay import run_plan
from tests.conftest import PASSWORD, make_broker, make_channel
from tests.e2e.conftest import browser_user, off_loop

pytestmark = [pytest.mark.browser, pytest.mark.broker, pytest.mark.django_db(transaction=True)]

HOSTILE = (
    b'{"order": 1, "note": "<script>alert(1)</script><img src=x onerror=alert(2)>'
    b'</pre><div hx-get=\\"/admin/\\" hx-trigger=\\"load\\">x</div>"}'
)


def _dead_letter(amqp: Any, queue: str, body: bytes, n: int) -> None:
    import pika

    headers = {
        "Idempotency-Key": f"order-{n}",
        "x-error-class": "UpstreamTimeout",
        "x-error-message": f"payments-api timed out after {30 + n}s (request {uuid.uuid4()})",
        "x-death": [{"queue": queue, "exchange": "", "reason": "rejected", "count": 5}],
        "x-first-death-queue": queue,
        "x-first-death-reason": "rejected",
    }
    amqp.basic_publish(
        "",
        f"{queue}.dlq",
        body,
        pika.BasicProperties(
            headers=headers, content_type="application/json", message_id=f"m-{n}", delivery_mode=2
        ),
    )


def test_oncall_triages_and_replays_a_failure_group(journey: Any, rabbit: tuple[Any, str]) -> None:
    amqp, queue = rabbit
    browser_user("otto", "oncall")
    broker = make_broker(name="rabbit", url_env="DLO_BROKER_E2E_RABBITMQ_URL")
    channel = make_channel(
        broker,
        address=queue,
        dlq_address=f"{queue}.dlq",
        poison_address="",
        dlq_strategies=["ttl-with-backoff", "dlq-alert"],
    )
    off_loop(do_poll_broker, broker.pk, force=True)

    tab = journey("oncall")
    page = tab.page
    tab.sign_in("otto", PASSWORD)

    # 1. The board: backlog with nobody consuming turns the row STOPPED, live.
    tab.go("/")
    tab.wait_until(lambda: page.evaluate("document.getElementById('board').__dloOpen"))
    for i in range(12):
        amqp.basic_publish("", queue, json.dumps({"order": 100 + i}).encode())
    for n, body in enumerate([HOSTILE, b'{"order": 2}', b'{"order": 3}']):
        _dead_letter(amqp, queue, body, n)
    off_loop(do_poll_broker, broker.pk, force=True)
    row = page.locator(f"#ch-{channel.pk}")
    expect(row).to_contain_text("STOPPED", ignore_case=True, timeout=10_000)
    tab.shot("1-board")

    # 2. Ingest, then the failure group.
    result = off_loop(do_ingest_channel, channel.pk)
    assert result.errors == [] and DeadLetter.objects.filter(channel=channel).count() == 3
    tab.go("/dead-letters/")
    group_link = page.locator("main a[href*='group=']").first
    expect(group_link).to_be_visible()
    group_link.click()
    page.wait_for_load_state()
    assert "group=" in page.url
    expect(page.locator("main table tbody tr")).to_have_count(3)
    tab.shot("2-group")
    list_url = page.url

    # 3. The hostile entry: shown as text, nothing runs, the page keeps its structure.
    hostile = DeadLetter.objects.get(channel=channel, idempotency_key="order-0")
    tab.go(f"/dead-letters/{hostile.pk}/")
    assert "<script>alert(1)</script>" in page.locator("main").inner_text()
    assert page.locator("main img, main [hx-get], main script").count() == 0
    assert page.locator("header.topbar nav").count() == 1
    tab.shot("3-hostile-entry")

    # 4. Preview a replay of the group, give a reason, confirm.
    tab.go(list_url.split(tab.base, 1)[1])
    page.get_by_role("link", name="Replay all matching…").click()
    page.wait_for_load_state()
    expect(page.locator(".replay-count")).to_have_text("3")
    assert queue in page.locator("main").inner_text()  # the target from the declaration
    tab.shot("4-preview")
    page.fill("textarea[name=action_reason]", "payments-api fixed in release 4.2.1")
    page.get_by_role("button", name="Freeze the replay plan").click()
    page.wait_for_load_state()
    plan = ReplayPlan.objects.get()
    assert f"/dead-letters/replays/{plan.pk}/" in page.url

    # 5. The relay (a worker in production) runs the plan; the page follows it.
    for _ in range(20):
        off_loop(run_plan, plan.pk, max_seconds=5)
        plan.refresh_from_db()
        if plan.status == PlanStatus.DONE:
            break
    assert plan.status == PlanStatus.DONE
    expect(page.locator("#progress")).to_contain_text("Done", timeout=10_000)
    # Once finished, the page reloads itself: items are current and no control is offered.
    expect(page.locator("main table")).to_contain_text("Confirmed", timeout=10_000)
    assert page.get_by_role("button", name="Cancel the plan").count() == 0
    tab.shot("5-plan-done")
    assert set(
        DeadLetter.objects.filter(channel=channel).values_list("state__status", flat=True)
    ) == {Status.REPLAYED}

    # 6. On the broker: three replays with their replay ids, no x-death, keys unchanged.
    replayed = []
    for _ in range(40):
        method, props, body = amqp.basic_get(queue, auto_ack=True)
        if method is None:
            break
        if props.headers and "x-dlq-replay-id" in props.headers:
            replayed.append(props.headers)
    assert len(replayed) == 3
    assert all("x-death" not in h for h in replayed)
    assert {h["Idempotency-Key"] for h in replayed} == {"order-0", "order-1", "order-2"}

    # 7. The audit has every step: the plan, its request (one per chunk: here one), and one
    #    outcome per entry; the entry's page shows its request and its outcome.
    actions = list(AuditEvent.objects.values_list("action", flat=True))
    assert "dlq.replay.plan" in actions or any(a.startswith("dlq.replay.") for a in actions)
    assert actions.count("dlq.replay.request") == 1
    # One audit record for the relay's batch, listing each of the three entries' outcome.
    records = AuditEvent.objects.filter(action="dlq.replay.outcomes")
    assert sorted(m[4] for r in records for m in r.after["messages"]) == ["replayed"] * 3
    tab.go(f"/dead-letters/{hostile.pk}/")
    history = page.locator("main").inner_text()
    assert "dlq.replay.request" in history and "dlq.replay.outcomes" in history
    assert "this entry: replayed, attempt 1" in history
    tab.shot("6-entry-history")
    tab.check_clean()
