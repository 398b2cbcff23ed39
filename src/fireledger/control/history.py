"""History as a product: fire history by tenant, trigger, time range and state; lateness
distributions; the story of one fire. Read only, never a payload (DESIGN.md invariants 11, 14).

Endpoints (role ``reader``):

=========================================  ==========================================================
``GET /v1/triggers/{id}/fires``            one trigger's fires (route in :mod:`.triggers`, logic here)
``GET /v1/fires``                          the tenant's fires across triggers (``?trigger_id=``)
``GET /v1/triggers/{id}/lateness``         p50/p90/p99/max and a histogram over a window
=========================================  ==========================================================

Filters: ``from`` / ``to`` (RFC 3339; half-open on the scheduled instant), ``state`` (one state or a
comma-separated list), ``order`` (``asc``, the default, or ``desc``), ``limit`` (≤ 1000) and
``cursor`` (the previous page's ``next``, passed back with the same filters).

Each item keeps the fire fields of the original listing and adds ``lateness_s`` (dispatched minus
scheduled; null while never dispatched) and, per attempt, ``duration_s`` (finished minus started).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from fireledger.domain.history_records import ALL_STATES
from fireledger.domain.keys import FireKey, from_us, to_us
from fireledger.domain.model import Fire, Principal, Trigger, TriggerVersion
from fireledger.observe.metrics import LATENESS_BUCKETS
from fireledger.recurrence import RecurrenceError, format_instant, load_zone, parse_instant
from fireledger.security.targets import LAPSED

from .auth import require
from .context import ApiContext, get_ctx
from .formats import (
    CURSOR_HINT,
    INSTANT_HINT,
    INSTANT_PATTERN,
    TENANT_CURSOR_PATTERN,
    InstantText,
    StateList,
    TenantCursor,
    cursor_query,
    instant_query,
    state_query,
)
from .problems import invalid, not_found
from .schemas import AttemptView, FireView, Problem
from .views import _dec, fire_cursor, fire_view, parse_fire_cursor

router = APIRouter(prefix="/v1", tags=["history"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

DAY_US = 86_400 * 1_000_000
#: Lateness summaries read at most this many fires (the most recent ones in the window).
LATENESS_CAP = 200_000
_INSTANT_HINT = INSTANT_HINT
_INSTANT = re.compile(INSTANT_PATTERN)


# --- response shapes ----------------------------------------------------------------------------


class HistoryAttempt(AttemptView):
    duration_s: float | None = Field(description="Finished minus started, seconds (null while running).")


class HistoryFire(FireView):
    lateness_s: float | None = Field(
        description="First dispatch minus scheduled instant, seconds (null: never dispatched).")
    warnings: list[str] = Field(default_factory=list, description=(
        "What the tenant must act on, one sentence each: an attempt refused (not sent) because the target's "
        "ownership verification had lapsed (verify the target again to resume delivery)."))
    attempts: list[HistoryAttempt]  # type: ignore[assignment]


class HistoryPage(BaseModel):
    items: list[HistoryFire]
    next: str | None


class LatenessBucket(BaseModel):
    le: float | None = Field(description="Upper bound in seconds (inclusive); null is +Inf.")
    count: int


class Lateness(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    trigger_id: str
    from_: str = Field(alias="from")
    to: str
    count: int = Field(description="Dispatched fires measured.")
    sampled: bool = Field(description=f"True when the window held more than {LATENESS_CAP} dispatched "
                                      "fires and only the most recent were measured.")
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    histogram: list[LatenessBucket]
    states: dict[str, int] = Field(description="Fires per state in the window, dispatched or not.")


# --- input --------------------------------------------------------------------------------------


def parse_window(from_: str | None, to: str | None, errors: list[tuple[str, str]]) -> tuple[int | None, int | None]:
    """``from`` / ``to`` as µs (None when absent); problems appended naming the field."""
    out: list[int | None] = []
    for field, text in (("from", from_), ("to", to)):
        if text is None:
            out.append(None)
            continue
        try:
            out.append(to_us(parse_instant(text, field)))
        except RecurrenceError:   # a form the pattern admits can still leave the calendar in UTC
            errors.append((field, "must be an instant within the years 0001-9999 in UTC" if _INSTANT.match(text)
                           else _INSTANT_HINT))
            out.append(None)
    lo, hi = out
    if lo is not None and hi is not None and hi <= lo:
        errors.append(("to", "must be later than `from`"))
    return lo, hi


def parse_states(text: str | None, errors: list[tuple[str, str]]) -> list[str] | None:
    """``state=delivered`` or ``state=expired,skipped``; None means every state."""
    if text is None:
        return None
    chosen = [s.strip() for s in text.split(",")]
    bad = [s for s in chosen if s not in ALL_STATES]
    if bad or not chosen:
        errors.append(("state", f"must be one or more of {', '.join(ALL_STATES)} (comma-separated)"))
        return None
    return chosen


_TENANT_CURSOR = re.compile(r"^g:(-?\d{1,18}):([A-Za-z0-9_-]{1,64}):(\d{1,9})$", re.ASCII)   # legacy form
_NEW_TENANT_CURSOR = re.compile(TENANT_CURSOR_PATTERN)


def tenant_cursor(f: Fire) -> str:
    return f"g.{f.scheduled_us}.{f.trigger_id}.{f.seq}"


def parse_tenant_cursor(cursor: str | None) -> tuple[int, str, int] | None:
    """``(scheduled_us, trigger_id, seq)`` the tenant's fire list continues after (None: first page)."""
    if cursor is None:
        return None
    if _NEW_TENANT_CURSOR.match(cursor):
        us, trigger_id, seq = cursor[2:].split(".")
        return int(us), trigger_id, int(seq)
    m = _TENANT_CURSOR.match(_dec(cursor))
    if not m:
        raise invalid([("cursor", CURSOR_HINT)])
    return int(m.group(1)), m.group(2), int(m.group(3))


# --- pages --------------------------------------------------------------------------------------


def fire_warnings(f: Fire) -> list[str]:
    """The warnings of a fire's history: each attempt refused because its target's verification lapsed
    (the refusal starts ``not sent: target verification lapsed``, :data:`~fireledger.security.targets.LAPSED`)."""
    return [f"attempt {a.number} was not sent: the target's ownership verification had lapsed; verify the "
            f"target again (POST /v1/targets/{{id}}/verify) to resume delivery ({a.error})"
            for a in f.attempt_list if a.error and LAPSED in a.error]


def history_item(f: Fire) -> dict[str, Any]:
    """One history item: the fire view (lateness and attempt durations included) and its
    :func:`fire_warnings`. Never a payload."""
    return {**fire_view(f), "warnings": fire_warnings(f)}


def _trigger_position(cursor: str | None, tenant_form: bool) -> tuple[int, int] | None:
    """Where one trigger's fires continue: its own list takes ``f.`` cursors; the tenant list filtered
    by ``trigger_id`` takes its ``g.`` cursors (and the base64url ``f:`` ones it issued before 0141)."""
    if not tenant_form or cursor is None:
        return parse_fire_cursor(cursor)
    if _NEW_TENANT_CURSOR.match(cursor):
        us, _, seq = cursor[2:].split(".")
        return int(us), int(seq)
    return parse_fire_cursor(cursor, legacy_only=True)


def fires_page(ctx: ApiContext, tenant_id: str, *, trigger_id: str | None, limit: int, cursor: str | None,
               from_: str | None, to: str | None, state: str | None, order: str,
               tenant_form: bool = False) -> dict[str, Any]:
    """A page of history for the tenant (or one of its triggers, already looked up by the caller).
    ``tenant_form``: the page is the tenant list's (``g.`` cursors, also when filtered by trigger)."""
    errors: list[tuple[str, str]] = []
    lo, hi = parse_window(from_, to, errors)
    states = parse_states(state, errors)
    if errors:
        raise invalid(errors)
    after: tuple[Any, ...] | None
    after = _trigger_position(cursor, tenant_form) if trigger_id is not None else parse_tenant_cursor(cursor)
    rows = ctx.store.history.history_fires(tenant_id, trigger_id=trigger_id, from_us=lo, to_us=hi, states=states,
                                   after=after, limit=limit + 1, descending=order == "desc")
    page = rows[:limit]
    nxt = None
    if len(rows) > limit:
        nxt = fire_cursor(page[-1]) if trigger_id is not None and not tenant_form else tenant_cursor(page[-1])
    return {"items": [history_item(f) for f in page], "next": nxt}


def _pct(sorted_values: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of a sorted, non-empty sequence."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def lateness_summary(values_us: Sequence[int], buckets: Sequence[float] = LATENESS_BUCKETS) -> dict[str, Any]:
    """p50/p90/p99/max (nearest rank, seconds) and a cumulative-free histogram: each bucket counts
    the values in ``(previous bound, le]``; the last bucket (``le`` null) counts the rest."""
    vals = sorted(values_us)
    out: dict[str, Any] = {"count": len(vals)}
    for name, p in (("p50_s", 50), ("p90_s", 90), ("p99_s", 99)):
        out[name] = _pct(vals, p) / 1e6 if vals else None
    out["max_s"] = vals[-1] / 1e6 if vals else None
    counts = [0] * (len(buckets) + 1)
    bounds_us = [int(round(b * 1e6)) for b in buckets]
    i = 0
    for v in vals:
        while i < len(bounds_us) and v > bounds_us[i]:
            i += 1
        counts[i] += 1
    out["histogram"] = [{"le": b, "count": n} for b, n in zip([*buckets, None], counts, strict=True)]
    return out


FIRST_INSTANT_US = to_us(datetime(1, 1, 1, tzinfo=UTC))


def trigger_lateness(ctx: ApiContext, tenant_id: str, trigger_id: str, from_: str | None,
                     to: str | None) -> dict[str, Any]:
    """The lateness distribution of one trigger over ``[from, to)`` (default: the last 24 hours)."""
    errors: list[tuple[str, str]] = []
    lo, hi = parse_window(from_, to, errors)
    if errors:
        raise invalid(errors)
    now = ctx.clock.now().latest_us
    hi = hi if hi is not None else now
    # The default start never goes before the calendar's first instant (a `to` early in year 1).
    lo = lo if lo is not None else max(hi - DAY_US, FIRST_INSTANT_US)
    if hi <= lo:
        raise invalid([("from", "must be earlier than `to` (default: now)")])
    values = ctx.store.history.lateness_us(tenant_id, trigger_id, lo, hi, cap=LATENESS_CAP + 1)
    sampled = len(values) > LATENESS_CAP
    summary = lateness_summary(values[:LATENESS_CAP])
    return {"trigger_id": trigger_id, "from": format_instant(from_us(lo)), "to": format_instant(from_us(hi)),
            "sampled": sampled, **summary,
            "states": ctx.store.history.state_counts(tenant_id, lo, hi, trigger_id=trigger_id)}


@router.get("/fires", response_model=HistoryPage, summary="The tenant's fires across triggers (never payloads)")
def tenant_fires(trigger_id: str | None = Query(None, max_length=100),
                 from_: InstantText | None = instant_query("RFC 3339; scheduled instant ≥ from", alias="from"),
                 to: InstantText | None = instant_query("RFC 3339; scheduled instant < to (later than from)"),
                 state: StateList | None = state_query(),
                 order: Literal["asc", "desc"] = Query("asc"),
                 limit: int = Query(100, ge=1, le=1000),
                 cursor: TenantCursor | None = cursor_query(),
                 principal: Principal = Depends(require("reader")),
                 ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    if trigger_id is not None and ctx.store.registry.get_trigger(principal.tenant_id, trigger_id) is None:
        raise not_found("trigger")
    return fires_page(ctx, principal.tenant_id, trigger_id=trigger_id, limit=limit, cursor=cursor,
                      from_=from_, to=to, state=state, order=order, tenant_form=True)


@router.get("/triggers/{trigger_id}/lateness", response_model=Lateness, responses={404: {"model": Problem}},
            summary="Lateness distribution of a trigger over a window (default: the last 24 h)")
def lateness(trigger_id: str,
             from_: InstantText | None = instant_query("RFC 3339; scheduled instant ≥ from (default: to − 24 h)",
                                               alias="from"),
             to: InstantText | None = instant_query("RFC 3339; scheduled instant < to (default: now; later than from)"),
             principal: Principal = Depends(require("reader")),
             ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    if ctx.store.registry.get_trigger(principal.tenant_id, trigger_id) is None:
        raise not_found("trigger")
    return trigger_lateness(ctx, principal.tenant_id, trigger_id, from_, to)


# --- the story of one fire ----------------------------------------------------------------------


def _secs(us: int) -> str:
    s = us / 1e6
    if abs(s) < 1:
        return f"{s * 1000:.1f} ms"
    if abs(s) < 120:
        return f"{s:.2f} s"
    return str(timedelta(seconds=round(s)))


def _when(us: int | None) -> str | None:
    return None if us is None else format_instant(from_us(us))


#: Lateness below this is "on time" in the story (the seed's p50 punctuality target is 1 s).
ON_TIME_US = 1_000_000

_CAUSE_EXPLAINED = (
    ("expired:", "It was missed (the scheduler could not decide it in time: an outage, a stalled timing "
                 "plane or a pause) and was older than the trigger's catch-up horizon when it was finally "
                 "decided, so it was recorded and never dispatched."),
    ("skipped: missed; fire-once-now", "It was missed; the missed-fire policy fire-once-now dispatches only "
                                       "the most recent missed instant within the horizon."),
    ("skipped: missed; missed-fire policy is skip", "It was missed; the policy skip dispatches no missed "
                                                    "instant."),
    ("range:", "Many missed instants were recorded as one range record to keep the ledger bounded."),
    ("skipped: overlap policy skip", "The overlap policy skip withheld it: the trigger's previous fire had not "
                                     "finished (no work outcome, not failed, and its outcome window not over)."),
    ("held: overlap policy queue", "The overlap policy queue holds it (committed, not dispatched) until the "
                                   "previous fire finishes; a newer instant would replace it."),
    ("superseded: overlap policy queue", "The overlap policy queue holds at most one pending fire: a newer "
                                         "instant replaced this one while the previous fire was still running."),
    ("overlap: released from hold", "It was held by the overlap policy queue and released once the previous "
                                    "fire finished, or, with no outcome, once its outcome window ended (then "
                                    "counted as finished)."),
    ("overlap: previous fire", "The previous fire reported no work outcome by the end of its outcome window: "
                               "the overlap policy counted it as finished and let this fire go (seed ADR-12), "
                               "so the two may have run at the same time."),
    ("overlap", "The overlap policy withheld it because the previous fire had not finished."),
    ("failed: HTTP", "The target answered with a final (non-retryable) status."),
    (f"not sent: {LAPSED}", "The target's ownership verification lapsed (it was not renewed before its expiry), "
                            "so the attempt was not sent; verify the target again to resume delivery."),
    ("failed: retries exhausted", "Every attempt failed with a retryable error and no attempt was left "
                                  "(the retry policy's max_attempts)."),
    ("failed: retries truncated at the trigger's next instant",
     "Every attempt failed with a retryable error and the next retry would have reached the trigger's next "
     "instant: a fire never retries into the next one."),
    ("failed: retries ended by retry.max_event_age",
     "Every attempt failed with a retryable error and the next retry would have come later than the retry "
     "policy's max_event_age allows."),
    ("unknown:", "The target did not answer before the attempt deadline and no attempt was left: the work "
                 "may or may not have run."),
)


def explain_cause(cause: str | None) -> str | None:
    """A sentence explaining a recorded cause (None when the cause is unknown to this version)."""
    if not cause:
        return None
    for prefix, text in _CAUSE_EXPLAINED:   # the cause's own head first (a note may follow it)
        if cause.startswith(prefix):
            return text
    for prefix, text in _CAUSE_EXPLAINED:
        if prefix in cause:
            return text
    return None


def fire_story(fire: Fire, trigger: Trigger | None = None, version: TriggerVersion | None = None,
               *, now_us: int | None = None) -> list[tuple[str | None, str]]:
    """The story of one fire as (instant, sentence) lines, oldest first: when it was due, who decided
    it and when, every attempt, and why it was late, skipped or expired. Never the payload."""
    f = fire
    lines: list[tuple[str | None, str]] = []
    sched = f"scheduled for {_when(f.scheduled_us)}"
    if version is not None:
        zone_name = str(version.schedule.get("zone") or "UTC")
        try:
            wall = from_us(f.scheduled_us).astimezone(load_zone(zone_name)).strftime("%Y-%m-%d %H:%M:%S %Z")
            sched += f" ({wall} in {zone_name})"
        except RecurrenceError:
            pass
    name = f" of trigger {trigger.name!r}" if trigger is not None else ""
    lines.append((_when(f.scheduled_us), f"{sched}: instant{name}, definition version {f.version}, "
                                         f"tzdata {f.tzdata_version}, kind {f.kind}, seq {f.seq}"))
    decided_late = f.decided_us - f.scheduled_us
    note = f.cause[f.cause.index("overlap:"):] if f.cause and "overlap:" in f.cause else None
    released = note is not None and note.startswith("overlap: released from hold")
    as_state = f.state if f.state in ("expired", "skipped", "held") else ("held" if released else "pending")
    bound = ("clock bound not recorded" if f.eps_us is None
             else f"clock bound ε = {_secs(f.eps_us)} ({f.eps_source or 'source not recorded'})")
    lines.append((_when(f.decided_us), f"decided by node {f.decided_by}, {_secs(decided_late)} after the "
                                       f"scheduled instant, into the {f.lane} lane, as {as_state}; {bound}"))
    if f.kind == "catch-up" and f.state not in ("expired", "skipped"):
        lines.append((None, "caught up after it was missed: it keeps its original scheduled instant"))
    if f.state in ("expired", "skipped"):
        lines.append((None, f"not dispatched: {f.cause}"))
        why = explain_cause(f.cause)
        if why:
            lines.append((None, why))
    elif f.state == "held":
        lines.append((None, f"held, not dispatched yet: {f.cause}"))
        why = explain_cause(f.cause)
        if why:
            lines.append((None, why))
    elif note is not None:
        lines.append((None, f"overlap decision: {note}"))
        why = explain_cause(note)
        if why:
            lines.append((None, why))
    lines.extend(_attempt_lines(f, version))
    lines.extend((None, f"warning: {w}") for w in fire_warnings(f))
    if f.dispatched_us is not None:
        late = f.dispatched_us - f.scheduled_us
        if late <= ON_TIME_US:
            lines.append((None, f"first dispatched {_secs(late)} after the scheduled instant: on time"))
        else:
            parts = []
            if decided_late > ON_TIME_US:
                parts.append(f"the timing plane decided it {_secs(decided_late)} late (no timing process was "
                             "running, it was shedding on a wide clock bound, or it was behind)")
            waited = f.dispatched_us - f.decided_us
            if waited > ON_TIME_US:
                parts.append(f"it waited {_secs(waited)} in the {f.lane} lane for the dispatch plane (backlog, "
                             "rate limits, jitter, or no dispatch process was running)")
            lines.append((None, f"first dispatched {_secs(late)} late: " + ("; ".join(parts) or "see above")))
    elif f.state == "pending" and f.next_attempt_us is not None:
        age = "" if now_us is None else f" ({_secs(max(0, now_us - f.next_attempt_us))} ago)"
        lines.append((None, f"waiting for its first attempt, due at {_when(f.next_attempt_us)}{age}"))
    if f.state in ("delivered", "failed", "unknown"):
        tail = f": {f.cause}" if f.cause else ""
        lines.append((_when(f.finished_us), f"ended {f.state}{tail}"))
        why = explain_cause(f.cause) if f.state != "delivered" else None
        if why:
            lines.append((None, why))
    elif f.state == "pending" and f.attempt_list:
        lines.append((None, f"waiting for attempt {f.attempts + 1} at {_when(f.next_attempt_us)}"))
    return lines


def _attempt_lines(f: Fire, version: TriggerVersion | None) -> list[tuple[str | None, str]]:
    """The attempts of a fire, the redrive before the attempts it made (decision 0148), and the retry
    policy its attempts followed (decision 0147)."""
    lines: list[tuple[str | None, str]] = []
    for a in f.attempt_list:
        if f.redriven_us is not None and a.number == f.attempt_base + 1:
            lines.append((_when(f.redriven_us), f"redriven after {f.attempt_base} attempts: a further attempt "
                                                "under the same key, with the retry policy counted afresh"))
        took = "" if a.finished_us is None else f" after {_secs(a.finished_us - a.started_us)}"
        status = f" (HTTP {a.http_status})" if a.http_status is not None else ""
        result = a.result or "still running"
        err = f"; error: {a.error}" if a.error else ""
        lines.append((_when(a.started_us), f"attempt {a.number} on node {a.node}: {result}{status}{took}{err}"))
    if f.redriven_us is not None and f.attempts == f.attempt_base:
        lines.append((_when(f.redriven_us), f"redriven after {f.attempt_base} attempts: waiting for a further "
                                            "attempt under the same key"))
    if version is not None and f.attempt_list:
        p = version.policies
        age = ("no event-age bound" if p.max_event_age_s is None
               else f"event age at most {_secs(p.max_event_age_s * 1_000_000)}")
        lo, hi = _secs(int(p.min_backoff_s * 1_000_000)), _secs(int(p.max_backoff_s * 1_000_000))
        lines.append((None, f"retry policy of version {version.version}: {p.max_attempts} attempts, backoff "
                            f"{lo} doubling to {hi}, {age}, never past the next instant"))
    return lines


def fire_key(f: Fire) -> str:
    return str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))


__all__ = [
    "HistoryFire",
    "HistoryPage",
    "Lateness",
    "explain_cause",
    "fire_story",
    "fire_warnings",
    "fires_page",
    "history_item",
    "lateness_summary",
    "parse_states",
    "parse_window",
    "router",
    "trigger_lateness",
]
