"""Where outbound webhooks may connect: public addresses only, unless the operator allows more.

A destination URL is typed by a registry admin; without this check it could make the server
post to its own loopback services, the cloud metadata endpoint (169.254.169.254) or any host of
the private network. The check runs at connect time on the addresses the name resolves to now,
and the request then goes to exactly the address that was checked (a second lookup could
answer differently: DNS rebinding). Redirects are never followed.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_PORTS = {"http": 80, "https": 443}


class EgressRefused(Exception):
    """The URL's host is (or resolves to) an address webhooks may not reach."""


def _allowlist() -> tuple[set[str], list[ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    hosts: set[str] = set()
    networks = []
    for item in settings.DLO_WEBHOOK_ALLOW:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            hosts.add(item.lower().rstrip("."))
    return hosts, networks


def _public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    return address.is_global and not address.is_multicast


def pinned_target(url: str) -> tuple[str, str]:
    """``(url with the host replaced by its checked address, the original host)``.

    1. Resolve the host (an IP literal resolves to itself).
    2. Refuse unless every address is public, or allowed by ``DLO_WEBHOOK_ALLOW`` (networks in
       CIDR form, or host names).
    3. Return the URL pointing at the first address; the caller sends the original host as
       ``Host`` and as the TLS server name, so virtual hosting and certificates still work.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if parts.scheme not in DEFAULT_PORTS or not host:
        raise EgressRefused("not an http(s) URL with a host")
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise EgressRefused(f"cannot resolve {host}: {exc}") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    allowed_hosts, allowed_networks = _allowlist()
    for address in addresses:
        if host in allowed_hosts or _public(address):
            continue
        if any(address in network for network in allowed_networks):
            continue
        raise EgressRefused(
            f"{host} resolves to {address}, a loopback, link-local or private address; "
            "the operator can allow it in DLO_WEBHOOK_ALLOW"
        )
    first = addresses[0]
    literal = f"[{first}]" if first.version == 6 else str(first)
    netloc = f"{literal}:{port}"
    return urlunsplit(parts._replace(netloc=netloc)), parts.netloc.rpartition("@")[2]
