"""Hypothesis fuzz of every list and filter page's query parameters: arbitrary text, NUL and
other control characters, huge values, odd and out-of-range times, raw malformed query
strings. Whatever arrives, a page answers 2xx/3xx/4xx (a 400 or a form error), never a 500.

Runs on PostgreSQL in CI (NUL and year-10000 times fail only in the database there)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.actions import Actor, record
from dlq.models import DeadLetter
from tests.conftest import client_for, make_channel, make_user
from tests.dlq.conftest import letter, store

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

EXAMPLES = 60

ODD_TIMES = [
    "9999-12-31T23:59:59-14:00",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31",
    "0001-01-01",
    "2024-02-30",
    "2024-13-01T00:00",
    "2024-01-01T24:00:00",
    "2024-01-01T23:59:60Z",
    "1e309",
    "-1",
    "9" * 40,
    "2024-01-01T00:00:00+99:99",
    "2024-01-01T00:00:00.9999999999Z",
    "NaN",
]

# Values a filter might meet: any text (NUL and bidi included), huge text, odd numbers and times.
VALUES = st.one_of(
    st.text(max_size=40),
    st.text(
        alphabet=st.sampled_from("\x00\x01\x7f\u202e\u2066\ufeff%&=+;'\"<>\\ a0-"), max_size=12
    ),
    st.sampled_from(ODD_TIMES),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", " ", "0", "-0", "1.5", "nan", "inf", "²", "x" * 5_000, "9" * 400]),
)

PAGES: dict[str, list[str]] = {
    "/": ["team", "broker", "state", "from", "all"],
    "/channels/": ["team", "broker", "q", "page"],
    "/channels/orders/": ["range"],
    "/dead-letters/": ["channel"],
    "/dead-letters/list/": [
        "channel", "source", "status", "group", "reason", "since", "until", "key", "q", "after",
    ],
    "/dead-letters/replay/": ["id", "channel", "status", "group", "reason", "since", "until", "q"],
    "/dead-letters/discard/": ["id", "channel", "reason", "since", "until", "key"],
    "/dead-letters/replays/": ["status"],
    "/audit/": [
        "actor", "action", "target_type", "target_id", "channel", "outcome", "since",
        "until", "before",
    ],
    "/audit/export.csv": ["actor", "action", "channel", "since", "until", "before"],
    "/alerts/": ["show"],
    "/alerts/badge/": ["variant"],
}  # fmt: skip


@pytest.fixture
def everyone(db: Any) -> User:
    """One user in every role, so each page runs its whole query, over a little data."""
    user = make_user("fuzz", "viewer", "oncall", "compliance", "registry_admin", staff=True)
    channel = make_channel()
    store(channel, letter(b'{"a": 1}'), letter(b"plain", reason="expired"))
    record("fuzz.seed", actor=Actor.system("fuzz"), target_type="x", reason="seed")
    assert DeadLetter.objects.count() == 2
    return user


def _query(path: str) -> st.SearchStrategy[dict[str, str]]:
    return st.dictionaries(st.sampled_from(PAGES[path]), VALUES, max_size=len(PAGES[path]))


def _check(client: Client, path: str, query: dict[str, str] | str, htmx: bool) -> None:
    headers = {"HX-Request": "true"} if htmx else {}
    if isinstance(query, str):
        response = client.get(f"{path}?{query}", headers=headers)
    else:
        response = client.get(path, query, headers=headers)
    assert response.status_code < 500, (path, query, response.status_code)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("path", sorted(PAGES))
def test_filter_parameters_never_cause_a_500(everyone: User, path: str) -> None:
    client = client_for(everyone)

    @FUZZ
    @given(query=_query(path), htmx=st.booleans())
    def fuzz(query: dict[str, str], htmx: bool) -> None:
        _check(client, path, query, htmx)

    fuzz()


@pytest.mark.parametrize("path", sorted(PAGES))
def test_raw_malformed_query_strings_never_cause_a_500(everyone: User, path: str) -> None:
    client = client_for(everyone)
    names = st.sampled_from(PAGES[path])
    pieces = ["%00", "%FF", "%C0%80", "%", "%E2%80%AE", "%2B", "&", "=", "+", "a", "9", "-"]
    raw = st.lists(st.sampled_from(pieces), max_size=20).map("".join)

    @FUZZ
    @given(parts=st.lists(st.tuples(names, raw), max_size=4))
    def fuzz(parts: list[tuple[str, str]]) -> None:
        _check(client, path, "&".join(f"{k}={v}" for k, v in parts), False)

    fuzz()


@pytest.mark.parametrize(
    ("path", "name"),
    [(p, n) for p in sorted(PAGES) for n in PAGES[p] if n in ("since", "until")],
)
@pytest.mark.parametrize("when", ODD_TIMES)
def test_every_odd_time_is_a_form_error_not_a_500(
    everyone: User, path: str, name: str, when: str
) -> None:
    response = client_for(everyone).get(path, {name: when})
    assert response.status_code < 500


def test_the_fixture_data_is_there_for_the_pages(everyone: User) -> None:
    html = client_for(everyone).get("/dead-letters/list/").content.decode()
    assert "expired" in html and dt.datetime.now(dt.UTC).year > 2000
