"""API tokens: stored hashed, shown once, revocable; the API answers 401 JSON without one."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from dashboard.models import ApiToken, hash_token

pytestmark = pytest.mark.django_db
URL = "/api/replay-plans/"


def test_token_authenticates_and_revocation_refuses(
    viewer: User, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("apitoken", "create", "vera", "ci")
    raw = capsys.readouterr().out.strip().split()[-1]
    token = ApiToken.objects.get()
    assert raw not in token.token_hash and token.prefix == raw[4:12]
    headers = {"Authorization": f"Bearer {raw}"}
    assert Client().get(URL, headers=headers).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None
    call_command("apitoken", "revoke", token.prefix)
    assert Client().get(URL, headers=headers).status_code == 401


def test_missing_or_bad_token_is_401_json() -> None:
    response = Client().get(URL)
    assert response.status_code == 401 and b"authentication required" in response.content
    assert Client().get(URL, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert Client().get(URL, headers={"Authorization": "Basic eDp5"}).status_code == 401


def test_prefix_is_letters_and_digits_so_revoke_takes_it_as_typed(viewer: User) -> None:
    # A urlsafe prefix started with "-" one time in 64, and `apitoken revoke -x…` was then
    # read as an option (CI failed on it).
    prefixes = [ApiToken.issue(viewer, f"t{n}")[0].prefix for n in range(300)]
    assert all(len(p) == 8 and p.isascii() and p.isalnum() for p in prefixes)


def test_an_older_dash_prefix_is_revoked_after_double_dash(viewer: User) -> None:
    raw = "dlo_-abcdefgsecretpart"
    ApiToken.objects.create(user=viewer, name="old", prefix=raw[4:12], token_hash=hash_token(raw))
    call_command("apitoken", "revoke", "--", "-abcdefg")
    assert ApiToken.objects.get().revoked
