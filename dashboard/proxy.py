"""The client's address and scheme: the one place that decides who sent a request.

``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed only when the TCP peer is one of
``DLO_TRUSTED_PROXIES`` (addresses or networks; none by default). Then the address is the
right-most hop of ``X-Forwarded-For`` that is not itself a trusted proxy: every hop to its
right was written by a proxy we trust, everything to its left was written by the client and
may be forged. The login throttle, ``/metrics``' ``METRICS_ALLOWED_NETWORKS`` and the audit's
``source_ip`` all read :func:`client_address`; :class:`TrustedProxyMiddleware` (first in
``MIDDLEWARE``) stores its answer in ``REMOTE_ADDR`` and drops a forwarded scheme the peer may
not set, so ``SECURE_PROXY_SSL_HEADER`` and ``request.is_secure()`` see only a trusted one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Where the resolved address is kept on the request, and the TCP peer's own address.
RESOLVED_KEY = "dlo.client_address"
PEER_KEY = "dlo.peer_address"
# A forwarded chain longer than this is not read further (bounded work per request).
MAX_HOPS = 32
FORWARDED_HEADERS = (
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_FORWARDED_HOST",
    "HTTP_X_FORWARDED_PORT",
    "HTTP_FORWARDED",
)


def parse_networks(name: str, values: Iterable[str]) -> tuple[Network, ...]:
    """``values`` as networks (a bare address is a /32 or /128); a bad one fails loudly."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {value!r} is not an IP address or network."
            ) from None
    return tuple(networks)


def _address(raw: str) -> Address | None:
    text = raw.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "192.0.2.1:443"
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: Address, proxies: tuple[Network, ...]) -> bool:
    return any(address.version == net.version and address in net for net in proxies)


def resolve(peer: str, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str:
    """The client's address for a request from ``peer`` carrying ``forwarded_for``.

    1. A peer that is not a trusted proxy is the client, whatever the headers say.
    2. Otherwise walk ``X-Forwarded-For`` from the right, skipping trusted proxies; the first
       untrusted hop is the client. A hop that is not an address stops the walk there: the
       proxy to its right is the last one we can vouch for, so it is taken as the client.
    3. A chain of trusted proxies only: the left-most of them.
    """
    peer_address = _address(peer)
    if peer_address is None or not _trusted(peer_address, proxies) or not forwarded_for:
        return str(peer_address) if peer_address is not None else peer
    hops = [hop for hop in forwarded_for.split(",") if hop.strip()][-MAX_HOPS:]
    client = peer_address
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            break
        client = address
        if not _trusted(address, proxies):
            break
    return str(client)


def trusted_proxies() -> tuple[Network, ...]:
    return tuple(getattr(settings, "DLO_TRUSTED_PROXIES_NETWORKS", ()))


def peer_trusted(request: HttpRequest) -> bool:
    """Whether the TCP peer of ``request`` is a configured proxy."""
    peer = _address(str(request.META.get(PEER_KEY, request.META.get("REMOTE_ADDR", ""))))
    return peer is not None and _trusted(peer, trusted_proxies())


def client_address(request: HttpRequest) -> str | None:
    """The client's IP address (text), or ``None`` when the server gave no peer address."""
    meta: dict[str, Any] = request.META
    if RESOLVED_KEY not in meta:
        peer = str(meta.get("REMOTE_ADDR") or "")
        meta[PEER_KEY] = peer
        forwarded = meta.get("HTTP_X_FORWARDED_FOR")
        meta[RESOLVED_KEY] = resolve(peer, forwarded, trusted_proxies()) if peer else None
    resolved = meta[RESOLVED_KEY]
    return str(resolved) if resolved else None


class TrustedProxyMiddleware:
    """First in the stack: ``REMOTE_ADDR`` becomes :func:`client_address`, and the forwarded
    headers of a peer that is not a trusted proxy are removed, so nothing later (Django's
    ``SECURE_PROXY_SSL_HEADER``, ``is_secure()``, a view) can read a client's own claim."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        resolved = client_address(request)
        if not peer_trusted(request):
            for header in FORWARDED_HEADERS:
                request.META.pop(header, None)
        else:
            proto = str(request.META.get("HTTP_X_FORWARDED_PROTO", ""))
            if "," in proto:
                # Each proxy appends; the right-most value is what our own proxy was told.
                request.META["HTTP_X_FORWARDED_PROTO"] = proto.rsplit(",", 1)[1].strip()
        if resolved:
            request.META["REMOTE_ADDR"] = resolved
        return self.get_response(request)
