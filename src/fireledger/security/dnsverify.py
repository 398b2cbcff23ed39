"""Target ownership by DNS TXT: the second verification method (decision 0173, designed in 0041).

For an origin that cannot serve the well-known challenge path (an API gateway, a port that routes
only POST), the tenant publishes the target's ``verification.response`` (the keyed response of
decision 0088, exactly as the HTTP method expects it) as a TXT record at
``_fireledger-verification.<host>``; ``POST /v1/targets/{id}/verify`` with ``{"method": "dns"}``
resolves that name and accepts when one TXT record's text (its strings concatenated, RFC 7208 §3.3
style) equals the response, compared in constant time. DNSSEC is not required: the response's HMAC
is the proof, and the record only shows who controls the name.

**Only https targets on the default port.** The record proves control of the *name*, not of an
address or a port: over https every later connection is bound to the name by TLS, so that is
enough; over plain http the dispatch pin of decision 0089 needs the addresses that answered a
challenge, which DNS cannot provide, so a plain-http target must use the HTTP method.

The lookup uses dnspython's asynchronous resolver: the system's configuration, or the servers of
``FIRELEDGER_DNS_NAMESERVER`` (:mod:`fireledger.verifysettings`); it gives up after
:data:`DNS_TIMEOUT_S`. The answer is a one-line cause, never a record's text.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

#: The label the TXT record is published under, in front of the target URL's host.
DNS_LABEL = "_fireledger-verification"
DNS_TIMEOUT_S = 5.0
#: At most this many TXT records are compared (a name with more is refused as ambiguous).
MAX_TXT_RECORDS = 32


def dns_name(target_url: str) -> str:
    """The name whose TXT record verifies ``target_url``: ``_fireledger-verification.<host>``."""
    host = (urlsplit(target_url).hostname or "").rstrip(".")
    return f"{DNS_LABEL}.{host}"


def dns_method_problem(target_url: str) -> str | None:
    """Why the DNS method cannot verify ``target_url`` (None: it can): it must be ``https`` with a host
    name (not an IP literal) and no explicit port other than 443."""
    parts = urlsplit(target_url)
    if parts.scheme != "https":
        return ("the dns method proves control of a name, not of the addresses a plain-http target is "
                "pinned to (decision 0089): verify this target with the http method")
    if parts.port not in (None, 443):
        return "the dns method verifies only https targets on the default port (443): use the http method"
    host = parts.hostname or ""
    if not host or host.replace(".", "").isdigit() or ":" in host:
        return "the dns method needs a host name, not an IP address: use the http method"
    return None


def _resolver(nameservers: Sequence[tuple[str, int]], timeout_s: float) -> dns.asyncresolver.Resolver:
    if nameservers:
        r = dns.asyncresolver.Resolver(configure=False)
        r.nameservers = [dns.nameserver.Do53Nameserver(address, port) for address, port in nameservers]
    else:
        r = dns.asyncresolver.Resolver()   # the system's configuration (/etc/resolv.conf)
    r.lifetime = timeout_s
    r.timeout = min(timeout_s, 2.0)
    return r


async def prove_by_dns(target_url: str, expected: str, nameservers: Sequence[tuple[str, int]] = (), *,
                       timeout_s: float = DNS_TIMEOUT_S) -> str | None:
    """None when a TXT record at :func:`dns_name` of ``target_url`` equals ``expected``; else a
    one-line cause (which name, what was wrong — never a record's text). ``nameservers``: the
    ``(address, port)`` servers to ask (empty: the system's)."""
    problem = dns_method_problem(target_url)
    if problem is not None:
        return problem
    name = dns_name(target_url)
    try:
        answer = await _resolver(nameservers, timeout_s).resolve(name, "TXT", search=False)
    except dns.resolver.NXDOMAIN:
        return f"{name} does not exist: publish verification.response as its TXT record"
    except dns.resolver.NoAnswer:
        return f"{name} has no TXT record: publish verification.response as its TXT record"
    except dns.exception.Timeout:
        return f"{name} could not be resolved within {timeout_s:g}s"
    except dns.exception.DNSException as exc:
        return f"{name} could not be resolved ({type(exc).__name__})"
    texts = [b"".join(rdata.strings) for rdata in answer][:MAX_TXT_RECORDS + 1]
    if len(texts) > MAX_TXT_RECORDS:
        return f"{name} has more than {MAX_TXT_RECORDS} TXT records"
    want = expected.encode("ascii", "replace")
    if any(hmac.compare_digest(t.strip(), want) for t in texts):
        return None
    return (f"no TXT record at {name} is the verification response "
            "(publish verification.response, not the token)")


__all__ = ["DNS_LABEL", "DNS_TIMEOUT_S", "dns_method_problem", "dns_name", "prove_by_dns"]
