"""The checks a definition passes before it is stored, moved from the API handlers so that every
caller of the registry gets the same problems naming the same fields (the API's problem details are
built from them unchanged).

Each check appends ``(field, problem)`` pairs to an ``errors`` list instead of raising, so one
request reports every bad field at once. Nothing here writes; only :func:`target_problem` reads
(the target's trust state).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.keys import from_us, to_us
from fireledger.domain.model import MissedFirePolicy, OverlapPolicy, Policies, TriggerVersion
from fireledger.recurrence import (
    OneShotRecurrence,
    Recurrence,
    RecurrenceError,
    compile_spec,
    parse_duration,
)
from fireledger.security.targets import target_write_problem

Errors = list[tuple[str, str]]

MAX_PAYLOAD_BYTES = 64 * 1024
#: Fields whose change needs the ``policy`` role as well as ``author`` (invariant 13); a change of any
#: of them is audited (``trigger.policy``) with the prior and new values.
POLICY_FIELDS = frozenset({"missed_fire_policy", "catchup_horizon", "overlap_policy", "outcome_window"})
#: Every field of a definition, as the API names them.
DEFINITION_FIELDS = (frozenset({"name", "schedule", "target_id", "payload", "jitter", "timeout", "retry",
                                "dead_letter_target_id"})
                     | POLICY_FIELDS)
_CRON_FIELDS = frozenset({"second", "minute", "hour", "day-of-month", "month", "day-of-week", "year"})
_SCHEDULE_STRINGS = ("cron", "every", "at", "zone", "anchor", "not_before", "not_after")
_ONE_S = timedelta(seconds=1)
#: field: (minimum, maximum, whole seconds only)
_DURATIONS: dict[str, tuple[timedelta, timedelta, bool]] = {
    "catchup_horizon": (timedelta(0), timedelta(hours=24), True),
    "outcome_window": (_ONE_S, timedelta(days=7), True),
    "jitter": (timedelta(0), timedelta(hours=1), True),
    "timeout": (_ONE_S, timedelta(minutes=15), False),
    "retry.min_backoff": (_ONE_S, timedelta(hours=1), False),
    "retry.max_backoff": (_ONE_S, timedelta(hours=1), False),
    "retry.max_event_age": (timedelta(minutes=1), timedelta(hours=24), True),
}
#: ``retry.max_attempts``: attempts in all, the first included (EventBridge Scheduler allows 0–185 retries).
MAX_ATTEMPTS_RANGE = (1, 185)
_RETRY_FIELDS = ("max_attempts", "min_backoff", "max_backoff", "max_event_age")


def schedule_error(exc: RecurrenceError) -> tuple[str, str]:
    """Name the field as the client wrote it: cron sub-field problems belong to ``schedule.cron``."""
    field = exc.field if exc.field.startswith("schedule") else f"schedule.{exc.field}"
    sub = field.removeprefix("schedule.")
    if sub in _CRON_FIELDS:
        return "schedule.cron", f"{sub}: {exc.problem}"
    return field, exc.problem


def compile_schedule(schedule: dict[str, Any], now_us: int, errors: Errors) -> Recurrence | None:
    """The API schedule object compiled (None, with problems in ``errors``, when it does not)."""
    specs = schedule.get("specs")
    parts = ([("schedule", schedule)] if not isinstance(specs, list)
             else [("schedule", schedule)] + [(f"schedule.specs[{i}]", s) for i, s in enumerate(specs)
                                               if isinstance(s, dict)])
    bad: Errors = []
    for where, part in parts:
        bad += [(f"{where}.{k}", "must be a string") for k in _SCHEDULE_STRINGS
                if k in part and not isinstance(part[k], str)]
        if "anchor" in part and "every" not in part:
            bad.append((f"{where}.anchor", "applies only to an interval schedule (every)"))
    if bad:
        errors.extend(bad)
        return None
    try:
        # An interval without an anchor starts at creation, truncated to the whole second, so its
        # instants (and fire keys) carry no stray microseconds.
        return compile_spec(schedule, default_anchor=from_us(now_us - now_us % 1_000_000))
    except RecurrenceError as exc:
        errors.append(schedule_error(exc))
        return None


def next_instant(rec: Recurrence, after_us: int, errors: Errors) -> int | None:
    """The first instant strictly after ``after_us``; a schedule with none is refused."""
    try:
        nxt = next_us(rec, after_us)
    except RecurrenceError as exc:
        errors.append(schedule_error(exc))
        return None
    if nxt is None:
        if isinstance(rec, OneShotRecurrence) and to_us(rec.at) <= after_us:
            errors.append(("schedule.at", "is in the past"))
        elif rec.window.not_after is not None and to_us(rec.window.not_after) <= after_us:
            errors.append(("schedule.not_after", "is in the past: the schedule has no instant after now"))
        else:
            errors.append(("schedule", "has no instant after now"))
    return nxt


def _duration_s(field: str, text: str, errors: Errors) -> float | None:
    lo, hi, whole = _DURATIONS[field]
    try:
        d = parse_duration(text, field, minimum=lo, maximum=hi)
    except RecurrenceError as exc:
        errors.append((exc.field, exc.problem))
        return None
    if whole and d % _ONE_S:
        errors.append((field, "must be a whole number of seconds"))
        return None
    return d.total_seconds()


def policies(values: dict[str, Any], base: Policies, errors: Errors) -> Policies:
    """``base`` with the policy, jitter and timeout fields present in ``values`` (API names and forms)."""
    changes: dict[str, Any] = {}
    if "missed_fire_policy" in values:
        changes["missed_fire"] = MissedFirePolicy(values["missed_fire_policy"])
    if "overlap_policy" in values:
        changes["overlap"] = OverlapPolicy(values["overlap_policy"])
    for field, attr in (("catchup_horizon", "catchup_horizon_s"), ("outcome_window", "outcome_window_s"),
                        ("jitter", "jitter_s"), ("timeout", "timeout_s")):
        if field in values:
            secs = _duration_s(field, values[field], errors)
            if secs is not None:
                changes[attr] = secs if attr == "timeout_s" else int(secs)
    if values.get("retry") is not None:   # a create without one: None (the defaults)
        changes.update(retry(values["retry"], base, errors))
    if "dead_letter_target_id" in values:   # None: no dead-letter target (checked by the caller, 0178)
        changes["dead_letter_target_id"] = values["dead_letter_target_id"]
    return replace(base, **changes)


def retry(obj: Any, base: Policies, errors: Errors) -> dict[str, Any]:
    """The :class:`Policies` changes of a ``retry`` object (decision 0147): its fields present replace
    ``base``'s (an amendment may send one of them), ``max_event_age: null`` removes the age bound.
    Problems name ``retry.<field>``; ``min_backoff`` may not exceed ``max_backoff`` (as they result)."""
    if not isinstance(obj, dict):
        errors.append(("retry", "must be an object with max_attempts, min_backoff, max_backoff, max_event_age"))
        return {}
    unknown = sorted(set(obj) - set(_RETRY_FIELDS))
    errors.extend((f"retry.{k}", "is not a retry field (max_attempts, min_backoff, max_backoff, max_event_age)")
                  for k in unknown)
    out: dict[str, Any] = {}
    if "max_attempts" in obj:
        n, (lo, hi) = obj["max_attempts"], MAX_ATTEMPTS_RANGE
        if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
            errors.append(("retry.max_attempts", f"must be a whole number from {lo} to {hi} (attempts in all, "
                                                 "the first included)"))
        else:
            out["max_attempts"] = n
    for sub, attr in (("min_backoff", "min_backoff_s"), ("max_backoff", "max_backoff_s"),
                      ("max_event_age", "max_event_age_s")):
        if sub not in obj or (sub == "max_event_age" and obj[sub] is None):
            if sub in obj:
                out[attr] = None
            continue
        secs = _duration_s(f"retry.{sub}", obj[sub], errors)
        if secs is not None:
            out[attr] = int(secs) if sub == "max_event_age" else secs
    lo_s = out.get("min_backoff_s", base.min_backoff_s)
    hi_s = out.get("max_backoff_s", base.max_backoff_s)
    if ("min_backoff_s" in out or "max_backoff_s" in out) and lo_s > hi_s:
        field = "retry.min_backoff" if "min_backoff_s" in out else "retry.max_backoff"
        errors.append((field, f"min_backoff ({lo_s:g}s) must not exceed max_backoff ({hi_s:g}s)"))
    return out


def payload(obj: Any, errors: Errors) -> bytes:
    """Encode the payload (never echoed: problems name only the field and the size)."""
    try:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        errors.append(("payload", "must be plain JSON (no NaN or Infinity)"))
        return b""
    if len(data) > MAX_PAYLOAD_BYTES:
        errors.append(("payload", f"is {len(data)} bytes when encoded; the limit is {MAX_PAYLOAD_BYTES} (64 KiB)"))
    return data


def name(text: str, errors: Errors) -> str:
    if not text.strip():
        errors.append(("name", "must not be blank"))
    elif any(not ch.isprintable() for ch in text):
        errors.append(("name", "must not contain control characters"))
    return text


def target_problem(store: Any, tenant_id: str, target_id: str, now_us: int, errors: Errors) -> None:
    """Invariant 12: only a verified, unexpired target of this tenant (another's reads as missing)."""
    problem = target_write_problem(store, tenant_id, target_id, now_us)
    if problem:
        errors.append(("target_id", problem))


def dead_letter_target_problem(store: Any, tenant_id: str, target_id: str | None, now_us: int,
                               errors: Errors) -> None:
    """Decision 0178: a dead-letter target is, like any target, a verified, unexpired target of this
    tenant (invariant 12), of kind ``http`` or ``queue`` (an ``internal`` callable takes no history)."""
    if target_id is None:
        return
    problem = target_write_problem(store, tenant_id, target_id, now_us)
    if problem is None:
        trust = store.trust.target_trust(target_id)
        if trust is not None and trust.kind not in ("http", "queue"):
            problem = "must be an http or queue target"
    if problem:
        errors.append(("dead_letter_target_id", problem))


def calendar_problems(store: Any, tenant_id: str, rec: Recurrence, errors: Errors) -> None:
    """Every calendar a schedule names must be one of the tenant's (decision 0156)."""
    for i, cal in enumerate(rec.calendars):
        if store.registry.get_calendar(tenant_id, cal) is None:
            errors.append((f"schedule.calendars[{i}]", f"names no calendar of this tenant ({cal!r}); create it "
                                                       "with POST /v1/calendars first"))


def stored_recurrence(v: TriggerVersion, errors: Errors) -> Recurrence | None:
    """The compiled recurrence of a stored version; a schedule that no longer compiles (a tzdata
    change, decision 0087) is a problem naming ``schedule``: the client must send a new one."""
    try:
        return recurrence_of(v)
    except RecurrenceError as exc:
        errors.append(("schedule", f"the stored schedule no longer compiles ({exc.field}: {exc.problem}); "
                                   "send a new schedule"))
        return None


__all__ = ["DEFINITION_FIELDS", "MAX_PAYLOAD_BYTES", "POLICY_FIELDS", "Errors", "calendar_problems",
           "compile_schedule", "dead_letter_target_problem", "name",
           "next_instant", "payload", "policies", "retry", "schedule_error", "stored_recurrence", "target_problem"]
