"""Limits on every input (DESIGN.md §5): sizes, counts and complexity, each problem naming its field.

Already enforced elsewhere: request bodies ≤ 1 MiB (the API guard), payloads ≤ 64 KiB encoded, cron
expressions ≤ 256 characters with a bounded search, durations and zones validated by the recurrence
compiler, URLs by :mod:`fireledger.control.urls`, list pages ≤ 1000 and cursors ≤ 300 characters.
This module adds names, schedule strings, cron list items, payload nesting, and per-tenant counts.
Per-tenant counts are checked before the insert (not under a lock): concurrent creates may pass the
limit by at most their number.
"""

from __future__ import annotations

from typing import Any

from fireledger.settings import parse_per_tenant_limit, process_env

MAX_NAME_CHARS = 200
MAX_SCHEDULE_STRING = 256
MAX_SCHEDULE_KEYS = 8
MAX_CRON_ITEMS = 100
MAX_PAYLOAD_DEPTH = 32
MAX_PAYLOAD_KEYS = 10_000


def _env_int(name: str, default: int) -> int:
    """The limit from the environment; lenient (a malformed value is the default), as it always was:
    ``fireledger serve``/``control`` refuse a malformed one at start-up (:mod:`fireledger.settings`)."""
    try:
        return parse_per_tenant_limit(process_env(), name, default)
    except ValueError:
        return default


def max_triggers_per_tenant() -> int:
    """Live triggers per tenant (``FIRELEDGER_MAX_TRIGGERS_PER_TENANT``, default 10 000)."""
    return _env_int("FIRELEDGER_MAX_TRIGGERS_PER_TENANT", 10_000)


def max_targets_per_tenant() -> int:
    """Live targets per tenant (``FIRELEDGER_MAX_TARGETS_PER_TENANT``, default 1 000)."""
    return _env_int("FIRELEDGER_MAX_TARGETS_PER_TENANT", 1_000)


def max_principals_per_tenant() -> int:
    """Principals per tenant, revoked ones included (``FIRELEDGER_MAX_PRINCIPALS_PER_TENANT``, 1 000)."""
    return _env_int("FIRELEDGER_MAX_PRINCIPALS_PER_TENANT", 1_000)


def max_quota_fires_per_s() -> int:
    """The highest ``fires_per_s`` a tenant may give itself through the API
    (``FIRELEDGER_MAX_QUOTA_FIRES_PER_S``, default 1 000; the operator command is not bounded)."""
    return _env_int("FIRELEDGER_MAX_QUOTA_FIRES_PER_S", 1_000)


def max_quota_inflight() -> int:
    """The highest ``inflight`` a tenant may give itself through the API
    (``FIRELEDGER_MAX_QUOTA_INFLIGHT``, default 1 000; the operator command is not bounded)."""
    return _env_int("FIRELEDGER_MAX_QUOTA_INFLIGHT", 1_000)


def name_problem(text: str) -> str | None:
    """The problem with a display name (trigger, principal, tenant), or None."""
    if not text.strip():
        return "must not be blank"
    if len(text) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters"
    if any(not ch.isprintable() for ch in text):
        return "must not contain control characters"
    return None


def schedule_problems(schedule: dict[str, Any], prefix: str = "schedule") -> list[tuple[str, str]]:
    """Size and complexity problems of a schedule object (its meaning is the compiler's); the specs
    of a union (``schedule.specs``, at most 16 looked at) each as a schedule of their own."""
    out: list[tuple[str, str]] = []
    if len(schedule) > MAX_SCHEDULE_KEYS:
        out.append((prefix, f"has {len(schedule)} fields; at most {MAX_SCHEDULE_KEYS} are allowed"))
        return out
    specs = schedule.get("specs") if prefix == "schedule" else None
    if isinstance(specs, list):
        for i, spec in enumerate(specs[:16]):
            if isinstance(spec, dict):
                out.extend(schedule_problems(spec, f"schedule.specs[{i}]"))
    for key, value in schedule.items():
        field = f"{prefix}.{key}" if len(str(key)) <= 40 else prefix
        if isinstance(value, str) and len(value) > MAX_SCHEDULE_STRING:
            out.append((field, f"must be at most {MAX_SCHEDULE_STRING} characters"))
    cron = schedule.get("cron")
    if isinstance(cron, str) and len(cron) <= MAX_SCHEDULE_STRING:
        items = sum(len(part.split(",")) for part in cron.split())
        if items > MAX_CRON_ITEMS:
            out.append((f"{prefix}.cron", f"has {items} list items; at most {MAX_CRON_ITEMS} are allowed"))
    return out


def payload_problem(obj: Any) -> str | None:
    """Nesting and size-of-structure problems of a payload (never quoting it), or None."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    keys = 0
    while stack:
        value, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            return f"is nested more than {MAX_PAYLOAD_DEPTH} levels deep"
        if isinstance(value, dict):
            keys += len(value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            keys += len(value)
            stack.extend((v, depth + 1) for v in value)
        if keys > MAX_PAYLOAD_KEYS:
            return f"has more than {MAX_PAYLOAD_KEYS} members and elements"
    return None


def trigger_input_problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    """Limit problems of the trigger fields present in ``values`` (a create or amend body)."""
    out: list[tuple[str, str]] = []
    if isinstance(values.get("name"), str):
        why = name_problem(values["name"])
        if why:
            out.append(("name", why))
    if isinstance(values.get("schedule"), dict):
        out.extend(schedule_problems(values["schedule"]))
    if "payload" in values:
        why = payload_problem(values["payload"])
        if why:
            out.append(("payload", why))
    return out


__all__ = ["MAX_CRON_ITEMS", "MAX_NAME_CHARS", "MAX_PAYLOAD_DEPTH", "MAX_SCHEDULE_STRING", "max_principals_per_tenant",
           "max_targets_per_tenant", "max_triggers_per_tenant", "name_problem", "payload_problem",
           "schedule_problems", "trigger_input_problems"]


def trigger_limit_problem(store: object, tenant_id: str) -> str | None:
    """Why the tenant may not create another trigger (the per-tenant count), or None."""
    limit = max_triggers_per_tenant()
    count = store.registry.count_live_triggers(tenant_id)  # type: ignore[attr-defined]
    if count >= limit:
        return f"the tenant has {count} live triggers, the limit is {limit}; delete some first"
    return None
