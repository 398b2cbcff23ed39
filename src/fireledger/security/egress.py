"""Egress guard: where the service may open an outbound connection (DESIGN.md §4, invariant 12).

Every outbound HTTP connection the service makes passes the same two checks — a dispatch attempt
through the attempt runner's own HTTP/1.1 client (:mod:`fireledger.dispatch.wire`, which uses both
pieces directly), a verification challenge through :func:`guarded_connector` (an
``aiohttp.TCPConnector`` built from them):

* a resolver (:class:`GuardedResolver`) that resolves the host **once** and refuses the whole name
  when *any* of its addresses is refused; the connection is then opened only to the addresses this
  resolution returned (the attempt is pinned to them: no second lookup can rebind the name);
* a socket factory (:func:`guarded_socket_factory`) that checks the address each socket is actually
  opened to — this also covers IP-literal URLs, which skip the resolver.

What is refused (:meth:`EgressPolicy.refusal`):

* always: cloud metadata addresses (``169.254.169.254``, ``fd00:ec2::254``, …), the unspecified
  address (``0.0.0.0``, ``::``), multicast and broadcast, and the deprecated IPv6 site-local range
  ``fec0::/10``;
* unless the operator allows private targets (``FIRELEDGER_ALLOW_PRIVATE_TARGETS=1``; tests and
  local demos set it): every address that is not globally routable — loopback, private ranges,
  link-local, shared address space, documentation and reserved ranges;
* an IPv6 address that embeds an IPv4 address (:func:`embedded_ipv4`: IPv4-mapped, IPv4-compatible,
  SIIT-translated, 6to4, Teredo, NAT64 ``64:ff9b::/96`` and local-use NAT64 ``64:ff9b:1::/48``) is
  refused whenever an address it embeds is, for that address's reason;
* plain ``http`` (:meth:`EgressPolicy.scheme_refusal`) unless private targets are allowed: without
  TLS nothing binds the connection to the name whose ownership was proved.

A refusal raises :class:`EgressRefused`, a ``ValueError``: the HTTP sender classifies it as a final
``failed`` attempt whose error names the host and the reason (never a payload). Redirects are never
followed by the callers (``allow_redirects=False``), and no proxy from the environment is used.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from fireledger.errors import FireledgerError

IP = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Instance-metadata endpoints of the common clouds: never a target, whatever the operator allows.
METADATA_ADDRESSES: frozenset[IP] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",   # AWS, GCP, Azure, OpenStack, DigitalOcean, …
    "169.254.170.2",     # AWS ECS task metadata
    "169.254.169.123",   # AWS time sync
    "100.100.100.200",   # Alibaba Cloud
    "192.0.0.192",       # Oracle Cloud (legacy)
    "fd00:ec2::254",     # AWS IPv6 metadata
))


#: How an address refused whatever the operator allows is described (callers match "always refused").
_ALWAYS = "(always refused, even where private targets are allowed)"


class EgressRefused(FireledgerError, ValueError):
    """An outbound connection the egress policy refuses; the message names host, address and why."""


def private_allowed_by_env() -> bool:
    """``FIRELEDGER_ALLOW_PRIVATE_TARGETS=1``: the operator allows loopback and private targets."""
    from fireledger.settings import parse_allow_private_targets, process_env

    return parse_allow_private_targets(process_env())


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")            # RFC 6052 well-known prefix
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")     # RFC 8215 local-use prefix
_COMPAT = ipaddress.IPv6Network("::/96")                   # IPv4-compatible (deprecated, RFC 4291)
_SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")           # IPv4-translated (SIIT, RFC 2765)
_SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")           # deprecated site-local (RFC 3879)


def _v4(bits: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(bits & 0xFFFFFFFF)


def _rfc6052(ip: ipaddress.IPv6Address, prefix_len: int) -> ipaddress.IPv4Address:
    """The IPv4 address embedded after a ``prefix_len``-bit NAT64 prefix (RFC 6052 §2.2: bits 64-71
    are the reserved "u" octet and hold no address bits)."""
    n = int(ip)
    if prefix_len == 96:
        return _v4(n)
    octets = [(n >> (120 - 8 * i)) & 0xFF for i in range(16)]   # octets[0] is the first
    start = prefix_len // 8
    picked = [o for i, o in enumerate(octets) if i >= start and i != 8][:4]
    return ipaddress.IPv4Address(bytes(picked))


def embedded_ipv4(ip: IP) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address an IPv6 spelling may route or translate to: IPv4-mapped
    (``::ffff:0:0/96``), IPv4-compatible (``::/96``, except ``::`` and ``::1``), SIIT IPv4-translated
    (``::ffff:0:0:0/96``), 6to4 (``2002::/16``), Teredo (``2001::/32``: server and client), NAT64
    (``64:ff9b::/96``) and local-use NAT64 (``64:ff9b:1::/48``: the address may sit after a /48, /56,
    /64 or /96 prefix, so each position is returned). Empty for an address that embeds none."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in _NAT64 or ip in _SIIT:
        return [_v4(int(ip))]
    if ip in _NAT64_LOCAL:
        found = [a for a in dict.fromkeys(_rfc6052(ip, n) for n in (96, 64, 56, 48)) if not a.is_unspecified]
        return found or [_v4(0)]
    if ip in _COMPAT and int(ip) > 1:
        return [_v4(int(ip))]
    return []


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Which addresses outbound connections may reach. ``allow_private`` admits non-global
    addresses (loopback, private, link-local, …) but never metadata, unspecified or multicast."""

    allow_private: bool = False

    @classmethod
    def from_env(cls) -> EgressPolicy:
        return cls(allow_private=private_allowed_by_env())

    def refusal(self, address: str | IP) -> str | None:
        """Why a connection to ``address`` is refused, or None when it is allowed. A string that is
        not an IP address is refused (callers pass resolved addresses)."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
        except ValueError:
            return "is not an IP address"
        refused = [(inner, why) for inner in embedded_ipv4(ip) if (why := self.refusal(inner)) is not None]
        if refused:   # the gravest reason first: an always-refused address wins over a private one
            inner, why = next((r for r in refused if "always refused" in r[1]), refused[0])
            return f"embeds {inner}, which {why}"
        if isinstance(ip, ipaddress.IPv6Address) and ip in _NAT64:
            return None   # the well-known NAT64 prefix translates to the (allowed) IPv4 address above
        if ip in METADATA_ADDRESSES:
            return f"is a cloud metadata address {_ALWAYS}"
        if ip.is_unspecified:
            return f"is the unspecified address {_ALWAYS}"
        if ip.is_multicast or (isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address(
                "255.255.255.255")):
            return f"is a multicast or broadcast address {_ALWAYS}"
        if isinstance(ip, ipaddress.IPv6Address) and ip in _SITE_LOCAL:
            return f"is a deprecated site-local address {_ALWAYS}"
        if (ip.is_global and not ip.is_reserved) or self.allow_private:
            return None
        kind = ("a loopback" if ip.is_loopback else "a link-local" if ip.is_link_local
                else "a private" if ip.is_private else "not a globally routable")
        return f"is {kind} address; private targets are refused (operators may allow them)"

    def scheme_refusal(self, scheme: str) -> str | None:
        """Why a connection with URL scheme ``scheme`` is refused, or None: only ``https`` unless the
        operator allows private targets (then ``http`` too)."""
        if scheme == "https" or (scheme == "http" and self.allow_private):
            return None
        return ("plain http is refused: targets must use https (operators who allow private targets "
                "may use http)") if scheme == "http" else f"the scheme {scheme!r} is refused"

    def check_scheme(self, url_or_host: str, scheme: str) -> None:
        """Raise :class:`EgressRefused` when ``scheme`` is refused (see :meth:`scheme_refusal`)."""
        why = self.scheme_refusal(scheme)
        if why is not None:
            raise EgressRefused(f"egress refused: {url_or_host}: {why}")

    def check(self, host: str, address: str | IP) -> None:
        """Raise :class:`EgressRefused` when ``address`` (of ``host``) is refused."""
        why = self.refusal(address)
        if why is not None:
            shown = f"{host} ({address})" if str(host) != str(address) else str(address)
            raise EgressRefused(f"egress refused: {shown} {why}")


class GuardedResolver(AbstractResolver):
    """Resolves through ``inner`` once and refuses the name when any address is refused."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._inner = inner
        self._own_inner = inner is None

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if self._inner is None:
            self._inner = aiohttp.ThreadedResolver()
        results = await self._inner.resolve(host, port, family)
        if not results:
            raise OSError(f"{host} resolves to no address")
        for r in results:
            self.policy.check(host, r["host"])
        return results

    async def close(self) -> None:
        if self._inner is not None and self._own_inner:
            await self._inner.close()


def guarded_socket_factory(policy: EgressPolicy) -> Any:
    """An aiohappyeyeballs socket factory that refuses sockets to refused addresses."""

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _canon, sockaddr = addr_info
        policy.check(str(sockaddr[0]), str(sockaddr[0]))
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


def guarded_connector(policy: EgressPolicy | None = None, *, resolver: AbstractResolver | None = None,
                      **kwargs: Any) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` (``kwargs`` as for it) whose every connection obeys ``policy`` (default:
    :meth:`EgressPolicy.from_env`). Must be created inside the running event loop."""
    policy = policy if policy is not None else EgressPolicy.from_env()
    return aiohttp.TCPConnector(resolver=GuardedResolver(policy, resolver),
                                socket_factory=guarded_socket_factory(policy), **kwargs)


__all__ = ["METADATA_ADDRESSES", "EgressPolicy", "EgressRefused", "GuardedResolver", "embedded_ipv4",
           "guarded_connector", "guarded_socket_factory", "private_allowed_by_env"]
