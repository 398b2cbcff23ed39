"""Target URL validation at definition time (the dispatch plane checks again when it connects).

Refused unless the operator allows private targets: ``localhost`` (and ``*.localhost``), and any IP
literal host that is loopback, private, link-local, multicast, unspecified or reserved — including
the numeric spellings resolvers accept (``127.1``, ``2130706433``, ``0x7f.0.0.1``) and IPv4-mapped
IPv6 addresses. Host names are not resolved here: a name that resolves to a private address is the
dispatch plane's check.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from urllib.parse import urlsplit

MAX_URL_LEN = 2048


def private_targets_allowed_by_env() -> bool:
    return os.environ.get("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "").strip() == "1"


def _ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    h = host.strip("[]")
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    # inet_aton accepts the legacy numeric forms getaddrinfo also accepts (127.1, 0x7f000001, …).
    if h and all(c in "0123456789abcdefxABCDEFX." for c in h) and h[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    return None


def _is_private(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None and _is_private(mapped):
            return True
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
            or ip.is_unspecified or ip.is_reserved)


def check_target_url(url: str, *, allow_private: bool) -> str | None:
    """The problem with ``url`` as an HTTP target, or None when it is acceptable."""
    if len(url) > MAX_URL_LEN:
        return f"must be at most {MAX_URL_LEN} characters"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return "must not contain whitespace or control characters"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises ValueError for a bad port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not host:
        return "must have a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (user:password@); targets authenticate by signature"
    if allow_private:
        return None
    bare = host.rstrip(".").lower()
    if bare == "localhost" or bare.endswith(".localhost"):
        return "refers to localhost; private targets are refused (operators may allow them)"
    ip = _ip_of(bare)
    if ip is not None and _is_private(ip):
        return (f"refers to a loopback, private or link-local address ({ip}); private targets are "
                "refused (operators may allow them)")
    return None
