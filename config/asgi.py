"""ASGI entry point: HTTP through Django, websockets through Channels (origin and auth checked)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from config.routing import websocket_urlpatterns  # noqa: E402
from config.startup import settle_heap  # noqa: E402
from dashboard.body_limit import BodyLimitMiddleware, install_daphne_limit  # noqa: E402
from dashboard.origin import ExactOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(django_asgi_app),
        "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
# Daphne (the Dockerfile's server, and runserver) reads bodies before any middleware runs.
install_daphne_limit()
# Last: everything the server loads at start-up is out of the collector's way (see startup).
settle_heap()
