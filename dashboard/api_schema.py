"""drf-spectacular's description of the bearer-token scheme (imported by ``DashboardConfig``:
an extension registers itself when its module is imported)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "dashboard.api.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "manage.py apitoken create"}
