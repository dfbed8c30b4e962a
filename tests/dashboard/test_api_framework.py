"""The JSON API on Django REST framework: tokens, CSRF for sessions (issue 12, item 3), the
OpenAPI schema and its docs page, and bad filters answered with 400 (issue 12, item 10)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.middleware.csrf import get_token
from django.test import Client, RequestFactory

from dashboard.models import ApiToken
from dlq.models import ReplayPlan
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db

PLANS = "/api/replay-plans/"
# What a cross-site <form enctype="text/plain"> can send: name=value, shaped to parse as JSON.
FORGED = '{"kind": "discard", "channel": "orders", "reason": "x", "pad": "=1"}'


def bearer(user: User) -> dict[str, str]:
    return {"Authorization": f"Bearer {ApiToken.issue(user, 'test')[1]}"}


def _entries() -> None:
    store(make_channel(), letter(), letter())


def test_a_forged_text_plain_form_with_the_session_cookie_is_refused(oncall: User) -> None:
    _entries()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(oncall)
    response = browser.post(PLANS, FORGED, content_type="text/plain")
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]
    # Nor does a JSON body without the CSRF token get through on the session.
    response = browser.post(PLANS, FORGED, content_type="application/json")
    assert response.status_code == 403
    assert not ReplayPlan.objects.exists()


def test_a_session_write_with_the_csrf_token_works(oncall: User) -> None:
    _entries()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(oncall)
    token = get_token(RequestFactory().get("/"))
    browser.cookies["csrftoken"] = token
    response = browser.post(
        PLANS, FORGED, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert response.status_code == 201, response.content
    assert ReplayPlan.objects.get().requested_by_username == "otto"


def test_the_same_write_with_a_token_needs_no_csrf_token(oncall: User) -> None:
    _entries()
    script = Client(enforce_csrf_checks=True)
    response = script.post(PLANS, FORGED, content_type="application/json", headers=bearer(oncall))
    assert response.status_code == 201, response.content
    plan = ReplayPlan.objects.get()
    assert plan.kind == "discard" and plan.total == 2
    # A token with a non-JSON body is refused by type, not parsed.
    refused = script.post(PLANS, FORGED, content_type="text/plain", headers=bearer(oncall))
    assert refused.status_code == 415 and "error" in refused.json()
    assert ReplayPlan.objects.count() == 1


def test_a_bad_token_is_401_even_with_a_session(oncall: User) -> None:
    browser = Client()
    browser.force_login(oncall)
    assert browser.get(PLANS).status_code == 200
    response = browser.get(PLANS, headers={"Authorization": "Bearer dlo_nope"})
    assert response.status_code == 401 and response.json() == {"error": "invalid or revoked token"}
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_schema_describes_every_endpoint_and_needs_credentials(viewer: User) -> None:
    assert Client().get("/api/schema/").status_code == 401
    response = Client().get("/api/schema/?format=json", headers=bearer(viewer))
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == {
        "/api/dead-letters/",
        "/api/replay-plans/",
        "/api/replay-plans/{id}/",
        "/api/audit-events/",
        "/api/audit/checkpoints/latest/",
        "/api/audit/consistency/",
        "/api/audit/cosignatures/",
    }
    create = schema["paths"]["/api/replay-plans/"]["post"]
    assert {"201", "400", "401", "403", "415"} <= set(create["responses"])
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_docs_page_loads_its_assets_locally_without_inline_script(viewer: User) -> None:
    assert Client().get("/api/docs/").status_code == 302  # to the sign-in page
    browser = Client()
    browser.force_login(viewer)
    page = browser.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, flags=re.S)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources and all(s.startswith("/") for s in sources), sources
    init = browser.get("/api/docs/?script=")
    assert init.status_code == 200 and "SwaggerUIBundle" in init.content.decode()
    assert "javascript" in init["Content-Type"]


# Issue 12, item 10 (the API half): NUL bytes and times with no UTC equivalent are 400s.

ODD_TIME = "9999-12-31T23:59:59-14:00"
BAD_QUERIES = [
    ("/api/dead-letters/", "channel=or%00ders"),
    ("/api/dead-letters/", "reason=x%00"),
    ("/api/dead-letters/", "q=abc%00def"),
    ("/api/dead-letters/", "key=%00"),
    ("/api/dead-letters/", f"since={ODD_TIME}"),
    ("/api/dead-letters/", "until=0001-01-01T00:00:00%2B05:00"),
    ("/api/dead-letters/", "status=%00"),
    ("/api/replay-plans/", "status=new%00"),
    ("/api/replay-plans/", "after=%00"),
    ("/api/audit-events/", "actor=%00"),
    ("/api/audit-events/", f"until={ODD_TIME}"),
]


@pytest.mark.parametrize(("url", "query"), BAD_QUERIES)
def test_a_nul_byte_or_an_odd_time_in_a_filter_is_a_400(
    compliance: User, oncall: User, url: str, query: str
) -> None:
    _entries()
    user = compliance if url.startswith("/api/audit") else oncall
    response = Client().get(f"{url}?{query}", headers=bearer(user))
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] and body["fields"]


@pytest.mark.parametrize(
    "body",
    [
        {"filter": {"channel": "orders\x00"}},
        {"filter": {"since": ODD_TIME}},
        {"channel": "x\x00"},
        {"ids": [2**70]},
        # Found by Schemathesis: DRF's fields coerce, the schema promises JSON types.
        {"reason": 0},
        {"preview": 1},
        {"ids": ["1"]},
        {"rate": "20"},
        {"canary_size": True},
        {"filter": {"channel": 1.5}},
    ],
)
def test_a_plan_request_with_a_nul_byte_an_odd_time_or_a_wrong_type_is_a_400(
    oncall: User, body: dict[str, Any]
) -> None:
    _entries()
    response = Client().post(
        PLANS, json.dumps({"kind": "discard", "reason": "r", **body}),
        content_type="application/json",
        headers=bearer(oncall),
    )  # fmt: skip
    assert response.status_code == 400, response.content
    assert not ReplayPlan.objects.exists()


def test_an_unknown_api_path_is_a_json_404(viewer: User) -> None:
    for url in ("/api/replay-plans/null,null/", "/api/nothing/here/"):
        response = Client().get(url, headers=bearer(viewer))
        assert response.status_code == 404 and response.json() == {"error": "no such API endpoint"}
