"""Project-level views: sign-in, health check."""

from __future__ import annotations

import os

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dashboard.auth import RateLimitedAuthenticationForm

login_view = login_not_required(
    auth_views.LoginView.as_view(
        authentication_form=RateLimitedAuthenticationForm, redirect_authenticated_user=True
    )
)


@never_cache
@login_not_required
def admin_login(request: HttpRequest) -> HttpResponseBase:
    """The registry admin's sign-in. A signed-in account the admin refuses (no staff status)
    gets a page saying so: redirecting it to the sign-in, which redirects signed-in users
    back to the admin, would loop forever."""
    if request.user.is_authenticated and not admin.site.has_permission(request):
        return TemplateResponse(
            request,
            "403.html",
            {
                "exception": "The registry admin is for registry admins: your account needs "
                "the registry_admin role and staff status. Ask a registry admin to grant both."
            },
            status=403,
        )
    return login_view(request)


@require_GET
@never_cache
@login_not_required
def healthz(request: HttpRequest) -> JsonResponse:
    """200 with the database reachable, 503 otherwise. Says nothing secret."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        database = "ok"
    except Exception as exc:  # any database failure is reported, not raised
        database = f"error: {type(exc).__name__}"
    audit_keys = _audit_keys()
    status = 200 if database == "ok" and audit_keys == "ok" else 503
    return JsonResponse(
        {
            "status": "ok" if status == 200 else "degraded",
            "database": database,
            "audit_keys": audit_keys,
        },
        status=status,
    )


def _audit_keys() -> str:
    """Whether this process can read the audit trail's signing and MAC keys (production
    refuses to start without them configured; a key file gone since then fails here). Names
    the setting, never the path or the content."""
    if not settings.PRODUCTION:
        return "ok"  # development: the audit page says what is missing
    for name in ("DLO_AUDIT_SIGNING_KEY", "DLO_AUDIT_MAC_KEY"):
        if not os.access(getattr(settings, name), os.R_OK):
            return f"error: {name} unreadable"
    return "ok"


@require_GET
@login_not_required
def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """Browsers ask for /favicon.ico on pages (the admin's) that do not link an icon."""
    return HttpResponsePermanentRedirect(static("dlo/favicon.svg"))
