"""Every ``FIRELEDGER_*`` setting of the service, read in one place (issue 14, decision 0106).

:meth:`Settings.from_env` reads the environment once and checks every setting; a bad value raises :class:`SettingError`
(a ``ValueError``) whose message starts with the variable's name, e.g. ``FIRELEDGER_STOP_TIMEOUT_S: '0' is not a
number of seconds from 1 to 600``. The entry points (``fireledger serve|control|timing|dispatch`` and the operator
commands) build one ``Settings`` at start-up and pass it down (``Dispatcher.from_settings``,
``TimingNode.build(settings=...)``, ``service.run(..., settings=...)``); a bad value exits with status 2.

The parsers below (``parse_*``; the verification settings' in :mod:`fireledger.verifysettings`) are the only place
each setting's syntax, default and message are defined. The modules that own a setting keep a thin helper
(``stop_timeout_s()``, ``DispatchConfig.from_env()`` ...) for embedding and tests: it calls the same parser on the
mapping it is given, or on :func:`process_env` when given none. Only this module touches ``os.environ``.

Pure apart from :func:`process_env`: no I/O, no imports above the pure core.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fireledger.cores import default_dispatch_processes
from fireledger.domain.pacing import PACING_VARIABLES, Pacing
from fireledger.domain.policies import MISS_THRESHOLD_ENV, miss_threshold_from
from fireledger.errors import FireledgerError
from fireledger.verifysettings import VERIFICATION_VARIABLES, VerificationSettings

__all__ = [
    "LANE_NAMES", "LeaseSettings", "SettingError", "Settings", "parse_allow_private_targets", "parse_backfill_max",
    "parse_connect_timeout_s", "parse_declared_eps_us", "parse_dispatch_concurrency", "parse_dispatch_processes",
    "parse_flag", "parse_lane_text", "parse_log_level", "parse_max_connections", "parse_metrics_listen",
    "parse_over_quota_share", "parse_per_tenant_limit", "parse_public_url", "parse_replica", "parse_retention_days",
    "parse_seconds", "parse_stop_timeout_s", "parse_store_number", "parse_trusted_proxies", "process_env",
]

#: The dispatch lanes, in priority order (the values of ``fireledger.domain.model.Lane``).
LANE_NAMES: tuple[str, ...] = ("on-time", "catch-up", "backfill")


class SettingError(FireledgerError, ValueError):
    """A ``FIRELEDGER_*`` setting is malformed; the message starts with the variable's name."""


def process_env() -> Mapping[str, str]:
    """The process environment: the one place the package reads ``os.environ``."""
    return os.environ


# --- the parsers: one per setting, each a function of the environment mapping -------------------


def _text(env: Mapping[str, str], name: str) -> str:
    return (env.get(name) or "").strip()


def _number(text: str) -> float:
    """``float(text)``; NaN when it is not a number (the callers' range checks refuse NaN)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def _optional(env: Mapping[str, str], name: str) -> str | None:
    """A string setting; unset or empty is ``None`` (the callers' ``os.environ.get(...) or`` default)."""
    return env.get(name) or None


def parse_stop_timeout_s(env: Mapping[str, str]) -> float:
    """``FIRELEDGER_STOP_TIMEOUT_S`` (default 10): seconds from SIGTERM to exit, 1 to 600."""
    name = "FIRELEDGER_STOP_TIMEOUT_S"
    text = _text(env, name)
    if not text:
        return 10.0
    value = _number(text)
    if not 1 <= value <= 600:   # also refuses NaN
        raise SettingError(f"{name}: {text!r} is not a number of seconds from 1 to 600")
    return value


def parse_dispatch_processes(env: Mapping[str, str]) -> int:
    """``FIRELEDGER_DISPATCH_PROCESSES``: processes ``serve`` dispatches from, 1 to 64; unset or empty:
    ``min(usable cores, 2)`` (:func:`fireledger.cores.default_dispatch_processes`, decision 0239)."""
    text = (env.get("FIRELEDGER_DISPATCH_PROCESSES") or "").strip() or str(default_dispatch_processes())
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise SettingError(f"FIRELEDGER_DISPATCH_PROCESSES: {text!r} is not a whole number from 1 to 64")
    return int(text)


def parse_trusted_proxies(env: Mapping[str, str]) -> tuple[str, ...]:
    """``FIRELEDGER_TRUSTED_PROXIES``: comma-separated addresses or networks (empty: none)."""
    out = []
    for item in (p.strip() for p in (env.get("FIRELEDGER_TRUSTED_PROXIES") or "").split(",")):
        if not item:
            continue
        try:
            ipaddress.ip_network(item)   # strict, as uvicorn parses it: 10.0.0.0/8, not 10.0.0.1/8
        except ValueError:
            raise SettingError(f"FIRELEDGER_TRUSTED_PROXIES: {item!r} is not an IP address or network "
                               "(host bits must be zero)") from None
        out.append(item)
    return tuple(out)


def parse_max_connections(env: Mapping[str, str]) -> int | None:
    """``FIRELEDGER_MAX_CONNECTIONS``: a whole number ≥ 1; ``None`` when unset (the control plane
    then derives the cap from the open-file limit)."""
    name = "FIRELEDGER_MAX_CONNECTIONS"
    raw = _text(env, name)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise SettingError(f"{name}: must be a whole number ≥ 1, got {raw!r}")
    return int(raw)


def parse_public_url(env: Mapping[str, str]) -> str | None:
    """``FIRELEDGER_PUBLIC_URL``: ``http``/``https`` with a host; unset or empty is ``None``."""
    from urllib.parse import urlparse

    name = "FIRELEDGER_PUBLIC_URL"
    raw = _text(env, name)
    if not raw:
        return None
    parsed = urlparse(raw)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SettingError(f"{name}: {raw!r} is not an http:// or https:// URL with a host "
                           "(e.g. https://fireledger.example.com)")
    return raw


def parse_replica(env: Mapping[str, str]) -> str | None:
    """``FIRELEDGER_REPLICA``: a directory path or ``file://`` URL (returned as the path) for Litestream
    (decision 0126); unset: none. Usability is checked by ``serve`` (:mod:`fireledger.replication`)."""
    from urllib.parse import unquote, urlparse

    raw, parsed = _text(env, "FIRELEDGER_REPLICA"), urlparse(_text(env, "FIRELEDGER_REPLICA"))
    if "://" in raw and (parsed.scheme != "file" or parsed.netloc not in ("", "localhost") or not parsed.path):
        raise SettingError(f"FIRELEDGER_REPLICA: {raw!r} is not a directory path or a file:// URL "
                           "(e.g. /var/backups/fireledger or file:///var/backups/fireledger)")
    return (unquote(parsed.path) if "://" in raw else raw) or None


def parse_allow_private_targets(env: Mapping[str, str]) -> bool:
    """``FIRELEDGER_ALLOW_PRIVATE_TARGETS=1`` allows loopback and private targets; anything else does not."""
    return _text(env, "FIRELEDGER_ALLOW_PRIVATE_TARGETS") == "1"


def parse_backfill_max(env: Mapping[str, str]) -> int:
    """``FIRELEDGER_BACKFILL_MAX`` (1-100000), default 1000."""
    name = "FIRELEDGER_BACKFILL_MAX"
    raw = _text(env, name)
    if not raw:
        return 1000
    if not raw.isdigit() or not 1 <= int(raw) <= 100_000:
        raise SettingError(f"{name}: must be a whole number of fires 1-100000, got {raw!r}")
    return int(raw)


def parse_retention_days(env: Mapping[str, str]) -> int:
    """``FIRELEDGER_HISTORY_RETENTION_DAYS`` (1-3650), default 90."""
    name = "FIRELEDGER_HISTORY_RETENTION_DAYS"
    raw = env.get(name, "90")
    if not raw.isdigit() or not 1 <= int(raw) <= 3650:
        raise SettingError(f"{name}: must be a whole number of days 1-3650, got {raw!r}")
    return int(raw)


def parse_per_tenant_limit(env: Mapping[str, str], name: str, default: int) -> int:
    """A per-tenant count limit (``FIRELEDGER_MAX_*_PER_TENANT``): a whole number ≥ 1, ``default`` when unset;
    checked at start-up (decision 0106), read leniently by :mod:`fireledger.security.limits`."""
    raw = _text(env, name)
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise SettingError(f"{name}: must be a whole number ≥ 1, got {raw!r}")
    return int(raw)


def parse_log_level(env: Mapping[str, str]) -> str:
    """``FIRELEDGER_LOG_LEVEL`` (default ``info``): a :mod:`logging` level name, any case."""
    import logging

    raw = _text(env, "FIRELEDGER_LOG_LEVEL") or "info"
    if raw.upper() not in logging.getLevelNamesMapping():
        raise SettingError(f"FIRELEDGER_LOG_LEVEL: {raw!r} is not a log level (debug, info, warning, error)")
    return raw


def parse_declared_eps_us(env: Mapping[str, str]) -> int:
    """``FIRELEDGER_DECLARED_EPS_MS`` (default 5): the clock bound used when the kernel has none, in µs."""
    name = "FIRELEDGER_DECLARED_EPS_MS"
    raw = _text(env, name) or "5"
    ms = _number(raw)
    if not math.isfinite(ms) or ms < 0:
        raise SettingError(f"{name}: {raw!r} is not a number of milliseconds ≥ 0")
    return int(ms * 1000)


def parse_flag(env: Mapping[str, str], name: str) -> bool | None:
    """A ``1``/``0``/``auto`` switch; ``None`` for ``auto`` or unset (the caller's default)."""
    raw = _text(env, name).lower()
    if raw in ("", "auto"):
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingError(f"{name}: {raw!r} is not one of 1, 0, auto")


def parse_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds, ``default`` when unset."""
    raw = _text(env, name)
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise SettingError(f"{name}: {raw!r} is not a number of seconds") from None
    if v <= 0:
        raise SettingError(f"{name}: must be positive, got {raw}")
    return v


def parse_metrics_listen(env: Mapping[str, str]) -> tuple[str, int] | None:
    """``FIRELEDGER_METRICS_LISTEN``: ``HOST:PORT`` of the timing node's metrics, or ``None``."""
    listen = _text(env, "FIRELEDGER_METRICS_LISTEN")
    if not listen:
        return None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        raise SettingError(f"FIRELEDGER_METRICS_LISTEN: {listen!r} is not HOST:PORT")
    return host, int(port)


def parse_store_number(env: Mapping[str, str], name: str, default: float, *, minimum: float,
                       whole: bool = False) -> float:
    """A numeric store setting (``FIRELEDGER_PG_*``). The message names the variable; the store
    wraps it in its own ``StoreError``."""
    raw = _text(env, name)
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise SettingError(f"{name}: {raw!r} is not a {'whole ' if whole else ''}number") from None
    if value < minimum:
        raise SettingError(f"{name}: must be at least {minimum:g}, got {raw}")
    return value


def parse_dispatch_concurrency(env: Mapping[str, str]) -> int | None:
    """``FIRELEDGER_DISPATCH_CONCURRENCY``: attempts in flight in this process; ``None``: the default."""
    text = env.get("FIRELEDGER_DISPATCH_CONCURRENCY")
    if not text:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise SettingError("FIRELEDGER_DISPATCH_CONCURRENCY: must be an integer >= 1")
    return int(text)


def parse_connect_timeout_s(env: Mapping[str, str]) -> float:
    """``FIRELEDGER_CONNECT_TIMEOUT_S`` (default 5, finite, > 0; the attempt's timeout bounds it too): seconds
    a dispatch connection may take to open, and a written request to be acknowledged by TCP (decision 0117)."""
    name = "FIRELEDGER_CONNECT_TIMEOUT_S"
    value = parse_seconds(env, name, 5.0)
    if not math.isfinite(value):
        raise SettingError(f"{name}: must be a finite number of seconds")
    return value


def parse_over_quota_share(env: Mapping[str, str]) -> float | None:
    """``FIRELEDGER_OVER_QUOTA_SHARE``: 0 to 1; ``None``: the default."""
    text = env.get("FIRELEDGER_OVER_QUOTA_SHARE")
    if not text:
        return None
    share = _number(text)
    if not 0 <= share <= 1:   # also refuses NaN
        raise SettingError("FIRELEDGER_OVER_QUOTA_SHARE: must be a number between 0 and 1")
    return share


#: A lane override: ``(rate given, rate or None for unlimited, concurrency or None)``.
LaneOverride = tuple[bool, float | None, int | None]


def parse_lane_text(text: str) -> LaneOverride:
    """``rate=<fires/s|inf>,concurrency=<n>`` (either part optional). Raises ``ValueError`` without
    the variable's name (the caller prefixes it)."""
    rate_given, rate, concurrency = False, None, None
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not value:
            raise ValueError(f"{part.strip()!r} is not name=value (rate=…, concurrency=…)")
        if name == "rate":
            rate_given = True
            if value.lower() in ("inf", "unlimited"):
                rate = None
                continue
            try:
                rate = float(value)
            except ValueError:
                raise ValueError(f"rate: {value!r} is not a number of fires per second") from None
            if not math.isfinite(rate) or rate <= 0:
                raise ValueError("rate: must be > 0 (or inf)")
        elif name == "concurrency":
            if not value.isdigit() or int(value) < 1:
                raise ValueError("concurrency: must be an integer >= 1")
            concurrency = int(value)
        else:
            raise ValueError(f"{name!r} is not a lane setting (rate, concurrency)")
    return rate_given, rate, concurrency


def lane_variable(lane: str) -> str:
    """``FIRELEDGER_LANE_ON_TIME`` for ``on-time`` and so on."""
    return "FIRELEDGER_LANE_" + lane.upper().replace("-", "_")


def parse_lanes(env: Mapping[str, str]) -> dict[str, LaneOverride]:
    """The lanes overridden in ``env`` (``FIRELEDGER_LANE_<LANE>``), each checked."""
    out = {}
    for lane in LANE_NAMES:
        var = lane_variable(lane)
        text = env.get(var)
        if text:
            try:
                out[lane] = parse_lane_text(text)
            except ValueError as exc:
                raise SettingError(f"{var}: {exc}") from None
    return out


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Lease timing of the timing plane. Every field can be set from the environment:
    ``FIRELEDGER_<FIELD>`` upper-cased (e.g. ``FIRELEDGER_SESSION_TTL_S=3``)."""

    lease_ttl_s: float = 15.0        # a lease row's expiry after each renewal
    session_ttl_s: float = 3.0       # a node is dead this long after its last heartbeat
    cycle_s: float = 0.5             # heartbeat / renewal / balancing period
    guard_s: float = 0.5             # stop claiming this long (plus 2ε) before any expiry
    rotate_after_s: float = 300.0    # routine reassignment: a lease moves after 1-1.5× this
    rotate_batch: int = 2            # routine releases per cycle at most
    orphan_grace_s: float = 2.0      # a free partition offered to someone else is anyone's after this
    rejoin_after_s: float = 3.0      # a shedding node rejoins after this long with a healthy clock
    prune_after_s: float = 3600.0    # forget sessions silent for this long
    eps_ceiling_us: int = 100_000    # shed above this ε (invariant 4)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LeaseSettings:
        """Settings with ``FIRELEDGER_<FIELD>`` overrides; a bad value raises ``ValueError`` naming it."""
        env = process_env() if env is None else env
        values: dict[str, float | int] = {}
        for f in fields(cls):
            name = f"FIRELEDGER_{f.name.upper()}"
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            try:
                v: float | int = int(raw) if f.type == "int" else float(raw)
            except ValueError:
                raise SettingError(f"{name}: {raw!r} is not a number") from None
            if v <= 0 and f.name != "rotate_after_s":
                raise SettingError(f"{name}: must be positive, got {raw}")
            values[f.name] = v
        s = cls(**values)  # type: ignore[arg-type]
        if s.guard_s + s.cycle_s >= s.session_ttl_s:
            raise SettingError("FIRELEDGER_SESSION_TTL_S: must exceed FIRELEDGER_CYCLE_S + FIRELEDGER_GUARD_S "
                               f"({s.cycle_s} + {s.guard_s}), or a node could never claim")
        return s


def _checked(parse: Any, env: Mapping[str, str]) -> Any:
    """``parse(env)`` with its ``ValueError`` (naming the variable) as a :class:`SettingError`."""
    try:
        return parse(env)
    except ValueError as exc:
        raise SettingError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class Settings:
    """Every ``FIRELEDGER_*`` setting, checked (see the module docstring and docs/operations.md).

    ``None`` means "unset: the owner's default applies" where the default depends on something else
    (the engine, the state directory, the open-file limit, ``--listen``)."""

    # process and state
    state_dir: str | None = None                    # FIRELEDGER_STATE_DIR (./.fireledger)
    log_level: str = "info"                         # FIRELEDGER_LOG_LEVEL
    stop_timeout_s: float = 10.0                    # FIRELEDGER_STOP_TIMEOUT_S
    declared_eps_us: int = 5000                     # FIRELEDGER_DECLARED_EPS_MS (5 ms)
    # keys and secrets
    kek: str | None = field(default=None, repr=False)   # FIRELEDGER_KEK (never printed)
    kek_file: str | None = None                     # FIRELEDGER_KEK_FILE (<state dir>/kek.key)
    keyring: str | None = None                      # FIRELEDGER_KEYRING (<state dir>/keys.json)
    issuer: str | None = None                       # FIRELEDGER_ISSUER (http://<--listen>)
    # control plane
    trusted_proxies: tuple[str, ...] = ()           # FIRELEDGER_TRUSTED_PROXIES
    public_url: str | None = None                   # FIRELEDGER_PUBLIC_URL
    max_connections: int | None = None              # FIRELEDGER_MAX_CONNECTIONS (from the fd limit)
    allow_private_targets: bool = False             # FIRELEDGER_ALLOW_PRIVATE_TARGETS
    backfill_max: int = 1000                        # FIRELEDGER_BACKFILL_MAX
    max_triggers_per_tenant: int = 10_000           # FIRELEDGER_MAX_TRIGGERS_PER_TENANT
    max_targets_per_tenant: int = 1_000             # FIRELEDGER_MAX_TARGETS_PER_TENANT
    max_principals_per_tenant: int = 1_000          # FIRELEDGER_MAX_PRINCIPALS_PER_TENANT
    history_retention_days: int = 90                # FIRELEDGER_HISTORY_RETENTION_DAYS
    history_archive_dir: str | None = None          # FIRELEDGER_HISTORY_ARCHIVE_DIR (beside the store)
    verification: VerificationSettings = field(default_factory=VerificationSettings)   # fireledger.verifysettings
    # timing plane
    miss_threshold_us: int = 60_000_000             # FIRELEDGER_MISS_THRESHOLD_S (60 s)
    timing_leases: bool | None = None               # FIRELEDGER_TIMING_LEASES (auto: on PostgreSQL)
    shadow: bool | None = None                      # FIRELEDGER_SHADOW (auto: on)
    shadow_interval_s: float = 1.0                  # FIRELEDGER_SHADOW_INTERVAL_S
    metrics_listen: tuple[str, int] | None = None   # FIRELEDGER_METRICS_LISTEN
    leases: LeaseSettings = field(default_factory=LeaseSettings)   # FIRELEDGER_LEASE_TTL_S ... EPS_CEILING_US
    pacing: Pacing = field(default_factory=Pacing)  # FIRELEDGER_TIMING_GATHER_S ... DISPATCH_IDLE_S (0150)
    # dispatch plane
    dispatch_processes: int = field(default_factory=default_dispatch_processes)   # ..._PROCESSES: min(cores, 2)
    dispatch_concurrency: int | None = None         # FIRELEDGER_DISPATCH_CONCURRENCY (256)
    over_quota_share: float | None = None           # FIRELEDGER_OVER_QUOTA_SHARE (0.5)
    connect_timeout_s: float = 5.0                  # FIRELEDGER_CONNECT_TIMEOUT_S
    lanes: Mapping[str, LaneOverride] = field(default_factory=dict)   # FIRELEDGER_LANE_<LANE>
    internal_modules: str | None = None             # FIRELEDGER_INTERNAL_MODULES
    # store (PostgreSQL)
    pg_connect_timeout_s: int = 5                   # FIRELEDGER_PG_CONNECT_TIMEOUT_S
    pg_statement_timeout_ms: int = 30_000           # FIRELEDGER_PG_STATEMENT_TIMEOUT_MS
    replica: str | None = None                      # FIRELEDGER_REPLICA (none; SQLite, decision 0126)
    replica_sync_s: float = 1.0                     # FIRELEDGER_REPLICA_SYNC_S (the declared RPO)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read and check every setting from ``env`` (the process environment when ``None``).
        Raises :class:`SettingError` naming the first bad variable."""
        e: Mapping[str, str] = process_env() if env is None else env
        values: dict[str, Any] = {
            "state_dir": _optional(e, "FIRELEDGER_STATE_DIR"),
            "log_level": parse_log_level(e),
            "stop_timeout_s": parse_stop_timeout_s(e),
            "declared_eps_us": parse_declared_eps_us(e),
            "kek": _optional(e, "FIRELEDGER_KEK"),
            "kek_file": _optional(e, "FIRELEDGER_KEK_FILE"),
            "keyring": _optional(e, "FIRELEDGER_KEYRING"),
            "issuer": _optional(e, "FIRELEDGER_ISSUER"),
            "trusted_proxies": parse_trusted_proxies(e),
            "public_url": parse_public_url(e),
            "max_connections": parse_max_connections(e),
            "allow_private_targets": parse_allow_private_targets(e),
            "backfill_max": parse_backfill_max(e),
            "max_triggers_per_tenant": parse_per_tenant_limit(e, "FIRELEDGER_MAX_TRIGGERS_PER_TENANT", 10_000),
            "max_targets_per_tenant": parse_per_tenant_limit(e, "FIRELEDGER_MAX_TARGETS_PER_TENANT", 1_000),
            "max_principals_per_tenant": parse_per_tenant_limit(e, "FIRELEDGER_MAX_PRINCIPALS_PER_TENANT", 1_000),
            "history_retention_days": parse_retention_days(e),
            "history_archive_dir": _optional(e, "FIRELEDGER_HISTORY_ARCHIVE_DIR"),
            "verification": _checked(VerificationSettings.from_env, e),
            "miss_threshold_us": _checked(miss_threshold_from, e),
            "timing_leases": parse_flag(e, "FIRELEDGER_TIMING_LEASES"),
            "shadow": parse_flag(e, "FIRELEDGER_SHADOW"),
            "shadow_interval_s": parse_seconds(e, "FIRELEDGER_SHADOW_INTERVAL_S", 1.0),
            "metrics_listen": parse_metrics_listen(e),
            "leases": LeaseSettings.from_env(e),
            "pacing": _checked(Pacing.from_env, e),
            "dispatch_processes": parse_dispatch_processes(e),
            "dispatch_concurrency": parse_dispatch_concurrency(e),
            "over_quota_share": parse_over_quota_share(e),
            "connect_timeout_s": parse_connect_timeout_s(e),
            "lanes": parse_lanes(e),
            "internal_modules": _optional(e, "FIRELEDGER_INTERNAL_MODULES"),
            "pg_connect_timeout_s": int(parse_store_number(e, "FIRELEDGER_PG_CONNECT_TIMEOUT_S", 5, minimum=1,
                                                           whole=True)),
            "pg_statement_timeout_ms": int(parse_store_number(e, "FIRELEDGER_PG_STATEMENT_TIMEOUT_MS", 30_000,
                                                              minimum=0, whole=True)),
            "replica": parse_replica(e),
            "replica_sync_s": parse_seconds(e, "FIRELEDGER_REPLICA_SYNC_S", 1.0),
        }
        return cls(**values)


#: The variables :meth:`Settings.from_env` reads (docs/operations.md lists each with its default).
VARIABLES: tuple[str, ...] = (
    "FIRELEDGER_STATE_DIR", "FIRELEDGER_LOG_LEVEL", "FIRELEDGER_STOP_TIMEOUT_S", "FIRELEDGER_DECLARED_EPS_MS",
    "FIRELEDGER_KEK", "FIRELEDGER_KEK_FILE", "FIRELEDGER_KEYRING", "FIRELEDGER_ISSUER",
    "FIRELEDGER_TRUSTED_PROXIES", "FIRELEDGER_PUBLIC_URL", "FIRELEDGER_MAX_CONNECTIONS",
    "FIRELEDGER_ALLOW_PRIVATE_TARGETS", "FIRELEDGER_BACKFILL_MAX", "FIRELEDGER_MAX_TRIGGERS_PER_TENANT",
    "FIRELEDGER_MAX_TARGETS_PER_TENANT", "FIRELEDGER_MAX_PRINCIPALS_PER_TENANT",
    "FIRELEDGER_HISTORY_RETENTION_DAYS", "FIRELEDGER_HISTORY_ARCHIVE_DIR", MISS_THRESHOLD_ENV,
    "FIRELEDGER_TIMING_LEASES", "FIRELEDGER_SHADOW", "FIRELEDGER_SHADOW_INTERVAL_S", "FIRELEDGER_METRICS_LISTEN",
    *(f"FIRELEDGER_{f.name.upper()}" for f in fields(LeaseSettings)),
    "FIRELEDGER_DISPATCH_PROCESSES", "FIRELEDGER_DISPATCH_CONCURRENCY", "FIRELEDGER_OVER_QUOTA_SHARE",
    "FIRELEDGER_CONNECT_TIMEOUT_S", *(lane_variable(lane) for lane in LANE_NAMES), "FIRELEDGER_INTERNAL_MODULES",
    "FIRELEDGER_PG_CONNECT_TIMEOUT_S", "FIRELEDGER_PG_STATEMENT_TIMEOUT_MS",
    "FIRELEDGER_REPLICA", "FIRELEDGER_REPLICA_SYNC_S", *VERIFICATION_VARIABLES, *PACING_VARIABLES,
)
