from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from alerts import views as alert_views
from dashboard import views
from dashboard.api import api_not_found
from dashboard.board import page as board

admin.site.site_header = "Dead Letter Office — registry"
admin.site.site_title = "Dead Letter Office"
admin.site.login = views.admin_login  # type: ignore[method-assign,assignment]

urlpatterns = [
    path("", board.board, name="home"),
    path("login/", views.login_view, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("channels/", include("channels_registry.urls")),
    path("dead-letters/", include("dlq.urls")),
    path("audit/", include("audit.urls")),
    path("api/dead-letters/", include("dlq.triage.api")),
    path("api/replay-plans/", include("dlq.plans.plan_api")),
    path("api/audit-events/", include("audit.api")),
    path("api/audit/", include("audit.log_api")),
    # The schema answers scripts (a token; 401 without). The docs page is for the browser: DRF
    # views skip LoginRequiredMiddleware, so it asks for the sign-in page itself.
    path("api/schema/", SpectacularAPIView.as_view(), name="api_schema"),
    path(
        "api/docs/",
        login_required(SpectacularSwaggerSplitView.as_view(url_name="api_schema")),
        name="api_docs",
    ),
    re_path(r"^api/.*/$", api_not_found),  # after every API route: unknown ones 404 as JSON
    path("alerts/", include("alerts.urls")),
    path("metrics", alert_views.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
]
