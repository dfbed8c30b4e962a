"""The replay and discard commands and ``/api/replay-plans/``: the same rules as the pages."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client, override_settings

from audit.models import AuditEvent
from dashboard.models import ApiToken
from dlq.models import DeadLetter, PlanStatus, ReplayPlan, Status
from tests.conftest import make_channel, make_user
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import RecordingAdapter

pytestmark = pytest.mark.django_db
publisher = replay_helpers.publisher  # the fixture


def _run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _entries(n: int = 3) -> list[DeadLetter]:
    return store(make_channel(), *[letter() for _ in range(n)])


def test_replay_without_yes_only_previews() -> None:
    _entries(3)
    out = _run("replay", "--channel", "orders", "--reason", "fixed")
    assert "3 matching, 3 to replay, target orders" in out and "preview only" in out
    assert not ReplayPlan.objects.exists()


def test_replay_with_yes_freezes_and_runs_a_plan(oncall: User, publisher: RecordingAdapter) -> None:
    entries = _entries(3)
    ids = f"{entries[0].pk},{entries[2].pk}"
    out = _run("replay", "--channel", "orders", "--ids", ids, "--reason", "fixed", "--rate",
               "500", "--yes", "--run", "--user", "otto")  # fmt: skip
    plan = ReplayPlan.objects.get()
    assert plan.total == 2 and plan.velocity == 500 and plan.requested_by_username == "otto"
    assert "2 confirmed" in out and plan.status == PlanStatus.DONE
    assert DeadLetter.objects.get(pk=entries[1].pk).status == Status.NEW


def test_replay_refuses_ids_of_another_channel_and_a_missing_reason() -> None:
    [entry] = _entries(1)
    with pytest.raises(CommandError, match="Not entries"):
        _run("replay", "--channel", "billing", "--ids", str(entry.pk))
    with pytest.raises(CommandError, match="not an entry id"):
        _run("replay", "--channel", "orders", "--ids", "²")
    with pytest.raises(CommandError, match="reason"):
        _run("replay", "--channel", "orders", "--yes")
    with pytest.raises(CommandError, match="lacks"):
        _run("replay", "--channel", "orders", "--yes", "--reason", "x", "--user",
             make_user("vic", "viewer").username)  # fmt: skip


@override_settings(DLO_FOUR_EYES_THRESHOLD=1)
def test_cli_four_eyes(oncall: User) -> None:
    _entries(2)
    _run("replay", "--channel", "orders", "--reason", "r", "--yes", "--user", "otto")
    plan = ReplayPlan.objects.get()
    assert plan.status == PlanStatus.AWAITING_APPROVAL
    with pytest.raises(CommandError, match="cannot approve"):
        _run("replay", "--plan", str(plan.pk), "--approve", "--user", "otto", "--reason", "x")
    make_user("olivia", "oncall")
    out = _run("replay", "--plan", str(plan.pk), "--approve", "--user", "olivia", "--reason", "ok")
    assert "approved by olivia" in out


def test_discard_command_discards_with_a_reason() -> None:
    _entries(2)
    assert "preview only" in _run("discard", "--channel", "orders")
    out = _run("discard", "--channel", "orders", "--reason", "junk", "--yes")
    assert "2 discarded" in out
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.DISCARDED}
    [record] = AuditEvent.objects.filter(action="dlq.discard.outcomes", reason="junk")
    assert isinstance(record.after, dict) and record.after["discarded"] == 2


def _token(user: User) -> Client:
    raw = ApiToken.issue(user, "test")[1]
    client = Client()
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {raw}"
    return client


def _post(client: Client, data: dict[str, Any]) -> Any:
    return client.post("/api/replay-plans/", json.dumps(data), content_type="application/json")


def test_api_creates_one_plan_per_request_key(oncall: User) -> None:
    entries = _entries(2)
    client = _token(oncall)
    body = {"channel": "orders", "reason": "fixed", "rate": 20, "request_key": "abc"}
    first, second = _post(client, body), _post(client, body)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    assert first.json()["total"] == 2 and first.json()["velocity"] == 20
    listing = client.get("/api/replay-plans/").json()
    assert [p["id"] for p in listing["results"]] == [first.json()["id"]]
    detail = client.get(f"/api/replay-plans/{first.json()['id']}/").json()
    assert detail["status"] == PlanStatus.QUEUED
    preview = _post(client, {"channel": "orders", "preview": True}).json()
    assert preview["matched"] == 2 and preview["eligible"] == 0  # both are in the plan now
    assert len(entries) == 2


def test_api_refuses_viewers_and_a_missing_reason(viewer: User, oncall: User) -> None:
    _entries(1)
    response = _post(_token(viewer), {"channel": "orders", "reason": "x"})
    assert response.status_code == 403
    assert AuditEvent.objects.filter(outcome="denied", actor_username="vera").exists()
    assert _token(viewer).get("/api/replay-plans/").status_code == 200
    assert _post(_token(oncall), {"channel": "orders"}).status_code == 400
    assert Client().get("/api/replay-plans/").status_code == 401
    assert not ReplayPlan.objects.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"filter": ["channel", "orders"]}, "filter must be an object"),
        # Strict JSON: NaN and Infinity are not JSON, so the parser refuses them.
        ({"canary_size": 2, "canary_wait_s": float("inf")}, "JSON parse error"),
        ({"canary_size": 2, "canary_wait_s": float("nan")}, "JSON parse error"),
        ({"canary_size": 2, "canary_wait_s": "nan"}, "canary_wait_s"),
        ({"rate": "inf"}, "rate"),
        ({"canary_size": -1}, "canary_size"),
    ],
)
def test_api_answers_malformed_plan_options_with_400(
    oncall: User, extra: dict[str, Any], message: str
) -> None:
    _entries(1)
    response = _post(_token(oncall), {"channel": "orders", "reason": "fixed", **extra})
    assert response.status_code == 400 and message in response.json()["error"]
    assert not ReplayPlan.objects.exists()


def test_api_answers_missing_plans_and_outsiders_as_json(oncall: User, outsider: User) -> None:
    missing = _token(oncall).get("/api/replay-plans/999999/")
    assert missing.status_code == 404 and "error" in missing.json()
    for url in ("/api/replay-plans/", "/api/replay-plans/1/", "/api/dead-letters/"):
        refused = _token(outsider).get(url)
        assert refused.status_code == 403, url
        assert "viewer role" in refused.json()["error"], url


def test_a_null_reason_is_taken_where_the_schema_allows_it(oncall: User) -> None:
    """Issue #27 item 8: ``"reason": null`` was refused although the schema allowed it. Now
    the schema says a plan needs a reason and a preview does not, and the server agrees."""
    _entries(2)
    client = _token(oncall)
    preview = _post(client, {"channel": "orders", "preview": True, "reason": None})
    assert preview.status_code == 200 and preview.json()["eligible"] == 2
    for reason in (None, "", " \t\u3000"):
        refused = _post(client, {"channel": "orders", "reason": reason})
        assert refused.status_code == 400 and set(refused.json()["fields"]) == {"reason"}
    schema = client.get("/api/schema/?format=json").json()
    body = schema["components"]["schemas"]["PlanRequestRequest"]
    assert body["properties"]["reason"]["nullable"] is True
    assert {"required": ["preview"], "properties": {"preview": {"enum": [True]}}} in body["anyOf"]
    create = schema["paths"]["/api/replay-plans/"]["post"]
    assert "409" in create["responses"] and create["requestBody"]["required"] is True
    assert _post(client, {"channel": "orders", "reason": "  fixed  "}).status_code == 201
    assert ReplayPlan.objects.get().reason == "fixed"


def test_a_valid_plan_request_the_entries_state_refuses_is_a_409(oncall: User) -> None:
    _entries(1)
    client = _token(oncall)
    assert _post(client, {"channel": "orders", "reason": "fixed"}).status_code == 201
    # The one entry is in that plan now: a well-formed request with nothing left to plan.
    again = _post(client, {"channel": "orders", "reason": "again"})
    assert again.status_code == 409 and again.json()["error"]
    assert ReplayPlan.objects.count() == 1
