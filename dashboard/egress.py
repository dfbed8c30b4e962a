"""Where outbound webhooks may connect: public addresses only, unless the operator allows more.
Used by alert destinations and the audit checkpoint webhook alike (a web helper, below both).

A destination URL is typed by a registry admin; without this check it could make the server
post to its own loopback services, the cloud metadata endpoint (169.254.169.254) or any host of
the private network. The check runs at connect time on the addresses the name resolves to now,
and the request then goes to exactly the address that was checked (a second lookup could
answer differently: DNS rebinding). Redirects are never followed. An IPv6 address that carries
an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-translated ``::ffff:0:a.b.c.d``,
IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::a.b.c.d``, 6to4 ``2002:AABB:CCDD::``, Teredo)
is judged by the IPv4 address inside it as well: a NAT64 gateway or a 6to4 relay would take the
request there.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DEFAULT_PORTS = {"http": 80, "https": 443}


def shown_url(url: str) -> str:
    """``url`` safe to display: no user info, and a query (which may carry a token) shown as
    ``?…``. Text that does not parse as a URL is not shown at all."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(an unreadable URL)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "…" if parts.query else "", ""))


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


#: Prefixes whose last 32 bits are an IPv4 address the packet ends up at.
_EMBEDDING_LAST_32 = (
    ipaddress.ip_network("64:ff9b::/96"),  # NAT64 well-known prefix (RFC 6052)
    ipaddress.ip_network("::ffff:0:0:0/96"),  # IPv4-translated (SIIT, RFC 7915)
    ipaddress.ip_network("::/96"),  # IPv4-compatible (deprecated, RFC 4291)
)
#: Local-use NAT64 (RFC 8215): the IPv4 address may sit at several offsets, and the network
#: translating it is the operator's own. Never a public destination.
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (see the module docstring), else None."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address (de-obfuscated)
    if any(address in network for network in _EMBEDDING_LAST_32):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return False
        inner = embedded_ipv4(address)
        if inner is not None:
            # ::ffff:127.0.0.1 is loopback, 64:ff9b::a00:1 reaches 10.0.0.1, and so on.
            return _public(inner) and (address.is_global or address.ipv4_mapped is not None)
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
