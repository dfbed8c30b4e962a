"""Sign-in, roles, read-only registry pages, health check and security headers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client

from audit.models import AuditEvent
from tests.conftest import PASSWORD, client_for, make_broker, make_channel, make_user

pytestmark = pytest.mark.django_db


def test_roles_exist_with_their_permissions() -> None:
    perms = {
        g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()}
        for g in Group.objects.prefetch_related("permissions__content_type")
    }
    assert set(perms) >= {"viewer", "oncall", "compliance", "registry_admin"}
    assert "channels_registry.view_channel" in perms["viewer"]
    assert "channels_registry.change_channel" not in perms["viewer"]
    assert "channels_registry.change_channel" in perms["registry_admin"]
    assert "audit.export_auditevent" in perms["compliance"]
    assert "audit.export_auditevent" not in perms["oncall"]


@pytest.mark.parametrize("url", ["/", "/channels/", "/channels/orders/", "/admin/"])
def test_anonymous_users_are_sent_to_sign_in(url: str) -> None:
    response = Client().get(url, follow=True)
    assert response.redirect_chain and "/login/" in response.redirect_chain[-1][0]


def test_login_and_logout_and_failures_are_audited(viewer: User) -> None:
    client = Client()
    assert client.post("/login/", {"username": "vera", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "vera", "password": PASSWORD}).status_code == 302
    assert client.post("/logout/").status_code == 302
    actions = list(AuditEvent.objects.values_list("action", "outcome"))
    assert actions == [
        ("auth.login_failed", "denied"),
        ("auth.login", "success"),
        ("auth.logout", "success"),
    ]


def test_failed_logins_are_rate_limited(viewer: User) -> None:
    client = Client()
    for _ in range(5):
        client.post("/login/", {"username": "vera", "password": "wrong"})
    response = client.post("/login/", {"username": "vera", "password": PASSWORD})
    assert response.status_code == 200
    assert "Too many failed sign-in attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session
    assert AuditEvent.objects.filter(action="auth.login_throttled").count() == 1


def test_outsider_without_a_role_is_refused(outsider: User) -> None:
    assert client_for(outsider).get("/channels/").status_code == 403


@pytest.mark.parametrize("spelling", ["vera ", " vera", "ｖｅｒａ", "VERA", "Vera\u3000"])
def test_throttle_counts_every_spelling_of_one_username(viewer: User, spelling: str) -> None:
    client = Client()
    for _ in range(5):
        client.post("/login/", {"username": "vera", "password": "wrong"})
    response = client.post("/login/", {"username": spelling, "password": PASSWORD})
    assert "Too many failed sign-in attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.parametrize("spelling", ["vera ", "ｖｅｒａ", "VERA"])
def test_spellings_sign_in_as_the_one_account(viewer: User, spelling: str) -> None:
    client = Client()
    assert client.post("/login/", {"username": spelling, "password": PASSWORD}).status_code == 302
    assert client.session["_auth_user_id"] == str(viewer.pk)
    # Failures under another spelling count against the same account.
    for _ in range(5):
        Client().post("/login/", {"username": spelling, "password": "wrong"})
    response = Client().post("/login/", {"username": "vera", "password": PASSWORD})
    assert "Too many failed sign-in attempts" in response.content.decode()


def test_user_without_a_role_is_told_which_role_to_ask_for(outsider: User) -> None:
    response = client_for(outsider).get("/", follow=True)
    assert response.status_code == 403
    html = response.content.decode()
    assert "has no role yet" in html and "<strong>viewer</strong> role" in html
    assert "olga" in html


def test_non_staff_user_opening_the_admin_gets_a_page_not_a_redirect_loop(viewer: User) -> None:
    client = client_for(viewer)
    response = client.get("/admin/", follow=True)
    assert response.status_code == 403
    assert len(response.redirect_chain) <= 2
    assert "registry_admin role and staff status" in response.content.decode()


def test_staff_user_reaches_the_admin_and_its_login_page_redirects(registry_admin: User) -> None:
    client = client_for(registry_admin)
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/login/?next=/admin/").status_code == 302


def test_channel_list_empty_state_explains_how_to_declare(viewer: User) -> None:
    page = client_for(viewer).get("/channels/").content.decode()
    assert "No channels declared yet" in page
    assert "registry import" in page


def test_channel_list_and_page_show_declaration_and_findings(viewer: User) -> None:
    make_channel(semantic="", description="<script>alert(1)</script>")
    client = client_for(viewer)
    page = client.get("/channels/").content.decode()
    assert "Orders" in page and "1 error" in page
    assert "Declare a channel" not in page  # viewers do not declare
    detail = client.get("/channels/orders/").content.decode()
    assert "The delivery semantic is not stated." in detail
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in detail
    assert "<script>alert(1)" not in detail
    assert "Edit declaration" not in detail


def test_channel_list_filters_and_htmx_partial(viewer: User) -> None:
    broker = make_broker()
    make_channel(broker)
    make_channel(broker, name="Billing", slug="billing", address="billing", owner_team="ledger")
    client = client_for(viewer)
    page = client.get("/channels/?team=ledger").content.decode()
    assert "Billing" in page and ">Orders<" not in page
    partial = client.get("/channels/?q=ord", headers={"HX-Request": "true"}).content.decode()
    assert "Orders" in partial and "Billing" not in partial
    assert "<html" not in partial


def test_healthz_reports_the_database() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "audit_keys": "ok"}


def test_security_headers_and_htmx_config(viewer: User) -> None:
    response = client_for(viewer).get("/channels/")
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-eval" not in csp
    assert "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    page = response.content.decode()
    for setting in [
        '"allowEval":false',
        '"allowScriptTags":false',
        '"selfRequestsOnly":true',
        '"historyCacheSize":0',
    ]:
        assert setting in page
    assert "hx-headers" in page and "X-CSRFToken" in page
    assert "<script>" not in page  # no inline scripts


def test_firstrun_creates_one_admin_with_a_random_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    call_command("firstrun")
    out = capsys.readouterr().out
    password = out.split("Password: ")[1].split()[0]
    assert len(password) >= 12
    assert Client().login(username="admin", password=password)
    call_command("firstrun")
    assert "Users exist already" in capsys.readouterr().out
    assert User.objects.count() == 1


def test_dotless_i_gets_no_fresh_throttle_counter() -> None:
    """Issue #27 item 3: PostgreSQL's case-insensitive match maps ``ı`` (U+0131) to ``I``, so
    ``sec_complıance`` signs in to ``sec_compliance``; its failures must share one counter."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the case mapping under test is PostgreSQL's UPPER()")
    make_user("sec_compliance", "compliance")
    dotless = "sec_compl\u0131ance"
    assert Client().post("/login/", {"username": dotless, "password": PASSWORD}).status_code == 302
    for _ in range(5):
        Client().post("/login/", {"username": "sec_compliance", "password": "wrong"})
    client = Client()
    response = client.post("/login/", {"username": dotless, "password": PASSWORD})
    assert "Too many failed sign-in attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session
    # And the other way round: failures under the dotless spelling throttle the plain one.
    cache.clear()
    for _ in range(5):
        Client().post("/login/", {"username": dotless, "password": "wrong"})
    response = Client().post("/login/", {"username": "SEC_COMPLIANCE", "password": PASSWORD})
    assert "Too many failed sign-in attempts" in response.content.decode()


def test_firstrun_names_the_port_and_make_demo_as_the_next_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    call_command("firstrun", "--port", "8001")
    out = capsys.readouterr().out
    assert "http://127.0.0.1:8001/login/" in out and "make demo" in out
