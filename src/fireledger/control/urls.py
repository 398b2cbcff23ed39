"""Target URL validation at definition time (the dispatch plane checks again when it connects).

An IP literal host — also in the numeric spellings resolvers accept (``127.1``, ``2130706433``,
``0x7f.0.0.1``) and every IPv6 spelling that embeds an IPv4 address — is judged by the egress
guard's rule (:meth:`fireledger.security.egress.EgressPolicy.refusal`): metadata, unspecified,
multicast and site-local addresses always refused; loopback, private, link-local and other
non-global addresses (and ``localhost``, ``*.localhost``) refused unless the operator allows private
targets. The scheme must be ``https`` unless private targets are allowed (then ``http`` too). Host
names are not resolved here: a name that resolves to a private address is the dispatch plane's check.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from fireledger.security.egress import EgressPolicy

MAX_URL_LEN = 2048


def private_targets_allowed_by_env() -> bool:
    """``FIRELEDGER_ALLOW_PRIVATE_TARGETS=1`` (see :mod:`fireledger.settings`)."""
    from fireledger.settings import parse_allow_private_targets, process_env

    return parse_allow_private_targets(process_env())


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
    bare = host.rstrip(".").lower()
    if not allow_private and (bare == "localhost" or bare.endswith(".localhost")):
        return "refers to localhost; private targets are refused (operators may allow them)"
    ip = _ip_of(bare)
    if ip is not None:
        why = EgressPolicy(allow_private=allow_private).refusal(ip)
        if why is not None:
            return f"refers to {ip}, which {why}"
    if parts.scheme != "https" and not allow_private:
        return ("must be an https:// URL: plain http is accepted only where the operator allows private "
                "targets (FIRELEDGER_ALLOW_PRIVATE_TARGETS=1)")
    return None
