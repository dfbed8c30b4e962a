"""API tokens: stored hashed, shown once, revocable; the API answers 401 JSON without one."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.utils import timezone

from audit.actions import Actor
from audit.models import AuditEvent
from dashboard.actions import do_create_api_token
from dashboard.models import ApiToken, hash_token
from tests.conftest import PASSWORD, make_user

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
    ApiToken.objects.create(
        user=viewer,
        name="old",
        prefix=raw[4:12],
        token_hash=hash_token(raw),
        expires_at=timezone.now() + dt.timedelta(days=1),
    )
    call_command("apitoken", "revoke", "--", "-abcdefg")
    assert ApiToken.objects.get().revoked


# -- Issue #27 item 7: expiry, revocation with the account, last use, audit ----------------


def _token(user: User, days: int | None = None) -> tuple[ApiToken, dict[str, str]]:
    token, raw = do_create_api_token(user, "script", actor=Actor.system("test"), days=days)
    return token, {"Authorization": f"Bearer {raw}"}


def test_a_token_expires_after_its_days(viewer: User) -> None:
    token, headers = _token(viewer, days=3)
    assert Client().get(URL, headers=headers).status_code == 200
    assert token.expires_at - token.created_at == pytest.approx(
        dt.timedelta(days=3), abs=dt.timedelta(minutes=1)
    )
    # Three days later (the clock moved by moving the expiry: no timing in tests).
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert Client().get(URL, headers=headers).status_code == 401
    assert Client().get("/metrics", headers=headers).status_code == 401
    token.refresh_from_db()
    assert token.status == "expired"


@override_settings(DLO_API_TOKEN_DAYS=7, DLO_API_TOKEN_MAX_DAYS=30)
def test_the_default_and_the_maximum_lifetime_come_from_settings(
    viewer: User, capsys: pytest.CaptureFixture[str]
) -> None:
    token, _ = _token(viewer)
    assert token.expires_at - token.created_at == pytest.approx(
        dt.timedelta(days=7), abs=dt.timedelta(minutes=1)
    )
    with pytest.raises(CommandError, match="1 to 30 days"):
        call_command("apitoken", "create", "vera", "long", "--days", "31")
    call_command("apitoken", "create", "vera", "month", "--days", "30")
    assert "expires" in capsys.readouterr().out
    assert ApiToken.objects.filter(name="month").exists()
    assert not ApiToken.objects.filter(name="long").exists()


def test_the_lifetime_settings_fail_loudly_when_inconsistent() -> None:
    from tests.dashboard.test_settings import BASE, manage

    result = manage("check", **BASE, DLO_API_TOKEN_DAYS="400", DLO_API_TOKEN_MAX_DAYS="365")
    assert result.returncode != 0 and "DLO_API_TOKEN_DAYS must be" in result.stderr


def test_deactivating_the_user_revokes_the_token_for_good(viewer: User) -> None:
    token, headers = _token(viewer)
    viewer.is_active = False
    viewer.save()
    token.refresh_from_db()
    assert token.revoked and token.revoked_because == "deactivated"
    viewer.is_active = True
    viewer.save()
    # Reactivating the user does not bring the token back.
    assert Client().get(URL, headers=headers).status_code == 401
    event = AuditEvent.objects.get(action="api.token.revoke")
    assert event.target_id == str(token.pk) and event.reason == "its user was deactivated"


def test_a_password_change_revokes_the_token(viewer: User) -> None:
    token, headers = _token(viewer)
    other, other_headers = _token(make_user("wendy", "viewer"))
    viewer.set_password("a new horse battery staple")
    viewer.save()
    assert Client().get(URL, headers=headers).status_code == 401
    assert Client().get(URL, headers=other_headers).status_code == 200
    token.refresh_from_db()
    assert token.revoked and token.revoked_because == "password_changed"
    event = AuditEvent.objects.get(action="api.token.revoke")
    assert event.reason == "its user's password changed"


def test_a_password_change_in_the_admin_revokes_the_token(viewer: User) -> None:
    token, headers = _token(viewer)
    admin = User.objects.create_superuser("sam", "", PASSWORD)
    client = Client()
    client.force_login(admin)
    new = "another horse battery staple 9"
    response = client.post(
        f"/admin/auth/user/{viewer.pk}/password/",
        {"password1": new, "password2": new, "usable_password": "true"},
    )
    assert response.status_code == 302
    assert Client().get(URL, headers=headers).status_code == 401


def test_a_hash_upgrade_at_sign_in_is_not_a_password_change(viewer: User) -> None:
    token, headers = _token(viewer)
    # The suite hashes with MD5 first; a PBKDF2 hash is "outdated" and re-hashed at sign-in.
    viewer.password = make_password(PASSWORD, hasher="pbkdf2_sha256")
    viewer.save(update_fields=["password"])
    assert Client().post("/login/", {"username": "vera", "password": PASSWORD}).status_code == 302
    viewer.refresh_from_db()
    assert viewer.password.startswith("md5$")
    assert Client().get(URL, headers=headers).status_code == 200


def test_creation_and_revocation_are_audited_and_last_use_is_listed(
    viewer: User, capsys: pytest.CaptureFixture[str]
) -> None:
    token, headers = _token(viewer)
    created = AuditEvent.objects.get(action="api.token.create")
    assert created.target_id == str(token.pk)
    assert "expires_at" in created.detail_json
    call_command("apitoken", "list")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(token.prefix))
    assert line.startswith(f"{token.prefix}  vera  'script'  active") and line.endswith("never")
    Client().get(URL, headers=headers)
    call_command("apitoken", "list", "--user", "vera")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(token.prefix))
    assert not line.endswith("never")
    call_command("apitoken", "revoke", token.prefix)
    revoked = AuditEvent.objects.get(action="api.token.revoke")
    assert revoked.reason == "revoked by an operator"
    call_command("apitoken", "list")
    assert "revoked (revoked by an operator)" in capsys.readouterr().out
