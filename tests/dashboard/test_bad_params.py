"""Issue #12 item 10: a NUL byte or a time outside the UTC range in a filter is a 400 or a
form error on every page that filters (PostgreSQL refused them inside the query: 500s)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.conftest import client_for, make_channel, make_user
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db

NUL_CASES = [
    ("/", "team"),
    ("/", "broker"),
    ("/channels/", "team"),
    ("/channels/", "broker"),
    ("/channels/", "q"),
    ("/dead-letters/", "channel"),
    ("/dead-letters/list/", "channel"),
    ("/dead-letters/list/", "reason"),
    ("/dead-letters/list/", "q"),
    ("/dead-letters/replay/", "reason"),
    ("/dead-letters/replays/", "status"),
    ("/audit/", "actor"),
    ("/api/dead-letters/", "channel"),
    ("/api/dead-letters/", "reason"),
    ("/api/replay-plans/", "status"),
]


@pytest.fixture
def everyone(db: object) -> User:
    user = make_user("all", "viewer", "oncall", "compliance", "registry_admin", staff=True)
    store(make_channel(), letter())
    return user


@pytest.mark.parametrize(("path", "name"), NUL_CASES)
def test_nul_in_a_filter_is_a_400(everyone: User, path: str, name: str) -> None:
    response = client_for(everyone).get(path, {name: "pay\x00ments"})
    assert response.status_code == 400
    if not path.startswith("/api/"):  # the API answers in its own format (its own tests)
        assert "NUL" in response.content.decode()


def test_nul_in_the_replay_form_post_is_a_400(everyone: User) -> None:
    response = client_for(everyone).post(
        "/dead-letters/replay/", {"reason": "x\x00", "action_reason": "because"}
    )
    assert response.status_code == 400


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize(
    "path", ["/dead-letters/list/", "/dead-letters/replay/", "/api/dead-letters/"]
)
def test_a_time_outside_the_utc_range_is_reported_not_a_500(
    everyone: User, path: str, name: str
) -> None:
    response = client_for(everyone).get(path, {name: "9999-12-31T23:59:59-14:00"})
    assert response.status_code in (200, 400)
    if path == "/dead-letters/list/":
        assert f"&#x27;{name}&#x27; is not a date or date-time" in response.content.decode()


def test_a_superscript_digit_as_the_board_offset_is_ignored(everyone: User) -> None:
    assert (
        client_for(everyone).get("/", {"from": "²"}, headers={"HX-Request": "true"}).status_code
        == 200
    )
