"""API tokens: stored hashed, shown once, revocable; the API answers 401 JSON without one."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory

from dashboard.api import api_view
from dashboard.models import ApiToken

pytestmark = pytest.mark.django_db


@api_view
def whoami(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"user": request.user.get_username()})


def test_token_authenticates_and_revocation_refuses(
    viewer: User, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("apitoken", "create", "vera", "ci")
    raw = capsys.readouterr().out.strip().split()[-1]
    token = ApiToken.objects.get()
    assert raw not in token.token_hash and token.prefix == raw[4:12]
    request = RequestFactory().get("/api/x", headers={"Authorization": f"Bearer {raw}"})
    response = whoami(request)
    assert response.status_code == 200 and b"vera" in response.content
    call_command("apitoken", "revoke", token.prefix)
    assert (
        whoami(
            RequestFactory().get("/api/x", headers={"Authorization": f"Bearer {raw}"})
        ).status_code
        == 401
    )


def test_missing_or_bad_token_is_401_json() -> None:
    from django.contrib.auth.models import AnonymousUser

    request = RequestFactory().get("/api/x")
    request.user = AnonymousUser()
    response = whoami(request)
    assert response.status_code == 401 and b"authentication required" in response.content
    bad = whoami(RequestFactory().get("/api/x", headers={"Authorization": "Bearer nope"}))
    assert bad.status_code == 401
