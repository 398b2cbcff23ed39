"""The target-verification settings (decisions 0170-0174), read by :class:`fireledger.settings.Settings`
(as its ``verification`` field) from the same environment mapping; kept apart because settings.py is
at the house's size limit. Imports nothing of fireledger (the settings layer).

=====================================  =========  ==========================================================
``FIRELEDGER_VERIFICATION_VALIDITY_S``  2592000    how long a proved verification lasts (30 days, decision
                                                   0041); 5 s (demos, tests) to 400 days
``FIRELEDGER_REVERIFY_WINDOW_S``        604800     the control plane re-verifies a target automatically
                                                   during the last this-many seconds (7 days) before its
                                                   expiry; less than the validity
``FIRELEDGER_DNS_NAMESERVER``           (system)   ``HOST[:PORT]`` (comma-separated for several) the DNS
                                                   TXT method asks instead of the system's resolvers
=====================================  =========  ==========================================================

A bad value raises ``ValueError`` whose message starts with the variable's name (``Settings`` turns
it into its ``SettingError``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

DAY_S = 86_400
VALIDITY_ENV = "FIRELEDGER_VERIFICATION_VALIDITY_S"
WINDOW_ENV = "FIRELEDGER_REVERIFY_WINDOW_S"
NAMESERVER_ENV = "FIRELEDGER_DNS_NAMESERVER"
#: The variables read here (docs/operations.md lists each).
VERIFICATION_VARIABLES = (VALIDITY_ENV, WINDOW_ENV, NAMESERVER_ENV)


@dataclass(frozen=True, slots=True)
class VerificationSettings:
    """How long a verification lasts, when it is renewed, and which DNS server the TXT method asks."""

    validity_s: float = 30 * DAY_S                   # FIRELEDGER_VERIFICATION_VALIDITY_S
    reverify_window_s: float = 7 * DAY_S             # FIRELEDGER_REVERIFY_WINDOW_S
    nameservers: tuple[tuple[str, int], ...] = ()    # FIRELEDGER_DNS_NAMESERVER (empty: the system's)

    @property
    def retry_s(self) -> float:
        """How long a target whose re-verification failed waits before the next try: 1/28 of the
        window (6 hours of the default 7 days: 28 tries before the verification lapses)."""
        return self.reverify_window_s / 28

    @property
    def pass_every_s(self) -> float:
        """How often the control plane's re-verification job runs: 1/20 of the window, at most 60 s."""
        return min(60.0, self.reverify_window_s / 20)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> VerificationSettings:
        """Read and check the three variables; ``ValueError`` naming the first bad one."""
        validity = _seconds(env, VALIDITY_ENV, 30 * DAY_S, 5, 400 * DAY_S)
        window = _seconds(env, WINDOW_ENV, min(7 * DAY_S, validity / 2), 1, 400 * DAY_S)
        if window >= validity:
            raise ValueError(f"{WINDOW_ENV}: {window:g} must be less than {VALIDITY_ENV} ({validity:g})")
        return cls(validity, window, parse_nameservers(env.get(NAMESERVER_ENV) or ""))


def _seconds(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a number of seconds") from None
    if not low <= v <= high:
        raise ValueError(f"{name}: {raw!r} is not a number of seconds from {low:.0f} to {high:.0f}")
    return v


def parse_nameservers(text: str) -> tuple[tuple[str, int], ...]:
    """``HOST[:PORT]`` items (comma-separated; IPv6 as ``[addr]:port``) as ``(address, port)`` pairs;
    each host must be an IP address (a resolver's own address cannot be looked up). Port 53 when
    absent. ``ValueError`` naming :data:`NAMESERVER_ENV` for anything else."""
    out: list[tuple[str, int]] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        host, port = item, "53"
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ("53" if not rest else "x")
        elif item.count(":") == 1:
            host, port = item.split(":")
        try:
            address = str(ipaddress.ip_address(host))
            number = int(port)
        except ValueError:
            raise ValueError(f"{NAMESERVER_ENV}: {item!r} is not IP[:PORT]") from None
        if not 0 < number < 65536:
            raise ValueError(f"{NAMESERVER_ENV}: {item!r} has no valid port")
        out.append((address, number))
    return tuple(out)


__all__ = ["NAMESERVER_ENV", "VALIDITY_ENV", "VERIFICATION_VARIABLES", "WINDOW_ENV", "VerificationSettings",
           "parse_nameservers"]
