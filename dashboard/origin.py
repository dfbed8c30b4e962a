"""The exact-origin check of the board's websocket.

Channels' ``AllowedHostsOriginValidator`` compares only the Origin's host with
``ALLOWED_HOSTS``, so a page served from another port of the same host (another app, a
developer server) could open the board's socket with the viewer's cookie. Here the Origin must
be exactly this site's own origin, ``scheme://host:port`` as the browser addressed it (the
Host header, itself one of ``ALLOWED_HOSTS``), or one listed in ``CSRF_TRUSTED_ORIGINS`` —
the same rule Django's CSRF check applies to unsafe requests.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, or None for anything that is not one."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.username is not None or parts.query or parts.fragment:
        return None
    return scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme]


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    values = [value for key, value in scope.get("headers", []) if key.lower() == name]
    if len(values) != 1:  # absent, or sent twice: nothing to trust
        return None
    try:
        return bytes(values[0]).decode("ascii")
    except UnicodeDecodeError:
        return None


def origin_allowed(scope: dict[str, Any]) -> bool:
    """True when the handshake's Origin is this site's exact origin or a trusted one.

    1. The Origin must parse as ``http(s)://host[:port]``.
    2. A listed ``CSRF_TRUSTED_ORIGINS`` entry (no wildcards here) is accepted as is.
    3. Otherwise the Host header must be one of ``ALLOWED_HOSTS`` and the Origin must equal
       ``http(s)://<Host>`` with the scheme of this connection (ws → http, wss → https).
    """
    origin = _header(scope, b"origin")
    wanted = _origin_key(origin) if origin else None
    if wanted is None:
        return False
    trusted = {_origin_key(o) for o in settings.CSRF_TRUSTED_ORIGINS if "*" not in o}
    if wanted in trusted:
        return True
    host = _header(scope, b"host")
    if not host:
        return False
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    return wanted == _origin_key(f"{scheme}://{host}")


class ExactOriginValidator:
    """ASGI middleware: deny the websocket handshake unless ``origin_allowed``."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
