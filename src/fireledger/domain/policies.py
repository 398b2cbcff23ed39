"""Pure policies: given a due row, its recurrence and the clock's earliest bound, return a plan.

The timing loop only applies plans (one transaction per batch). Nothing here reads a clock, touches
a store or sleeps, so every branch is tested with plain values.

Missed-fire handling (DESIGN.md invariant 7): an instant is *missed* when it was due more than
``miss_threshold_us`` before the decision (an outage, a pause, a stopped cluster). Missed instants
older than the catch-up horizon are recorded ``expired`` and never dispatched, whatever the policy;
within the horizon ``fire-all`` fires each (catch-up lane, original instant kept), ``fire-once-now``
fires only the most recent (others ``skipped``), ``skip`` fires none. Instants not missed fire in
the on-time lane. The record stays bounded: at most ``record_cap`` individual rows per plan, then one
range record carrying the count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .keys import from_us
from .model import (
    Advance,
    Decision,
    DueRow,
    FireKind,
    FireState,
    Lane,
    MissedFirePolicy,
    NewFire,
    Policies,
)
from .smearing import dispatch_not_before_us

#: Lateness beyond which an instant counts as missed rather than merely late.
DEFAULT_MISS_THRESHOLD_US = 60_000_000
#: Individual non-dispatch rows per plan before the rest collapse into one range record.
DEFAULT_RECORD_CAP = 100
#: Instants enumerated per plan at most; beyond it the expired range is counted as "more than".
ENUMERATION_CAP = 10_000

NextFn = Callable[[int], int | None]


@dataclass(frozen=True, slots=True)
class PlanContext:
    """Everything a plan depends on besides the due row and its recurrence."""

    earliest_us: int
    decided_by: str
    tzdata_version: str
    miss_threshold_us: int = DEFAULT_MISS_THRESHOLD_US
    record_cap: int = DEFAULT_RECORD_CAP


def _iso(us: int) -> str:
    return from_us(us).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fmt_s(us: int) -> str:
    s = us // 1_000_000
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def plan_due(row: DueRow, next_fn: NextFn, policies: Policies, ctx: PlanContext) -> Decision:
    """Plan one due row whose instant is ≤ ``ctx.earliest_us``.

    ``next_fn(after_us)`` is the recurrence's pure next-instant function. The returned decision
    advances the row to the first instant after ``earliest_us`` (or retires it) and carries every
    fire record for the instants in between, each with a state and, for non-dispatch, a cause.
    """
    earliest = ctx.earliest_us
    horizon_us = policies.catchup_horizon_s * 1_000_000
    instants: list[int] = []
    t: int | None = row.next_us
    overflow = False
    while t is not None and t <= earliest:
        if len(instants) >= ENUMERATION_CAP:
            overflow = True
            break
        instants.append(t)
        t = next_fn(t)
    if overflow:
        # Skip the rest of a very long gap without enumerating it: resume from the horizon's edge.
        t = next_fn(earliest - horizon_us - 1) if instants[-1] < earliest - horizon_us else t
        while t is not None and t <= earliest:
            instants.append(t)
            t = next_fn(t)
    new_next = t

    def fire(us: int, kind: FireKind, lane: Lane, state: FireState, cause: str | None = None) -> NewFire:
        return NewFire(
            tenant_id=row.tenant_id, trigger_id=row.trigger_id, scheduled_us=us, seq=0,
            version=row.version, kind=kind, lane=lane, state=state, decided_us=earliest,
            tzdata_version=ctx.tzdata_version, decided_by=ctx.decided_by, cause=cause,
        )

    on_time = [u for u in instants if earliest - u <= ctx.miss_threshold_us]
    missed = [u for u in instants if earliest - u > ctx.miss_threshold_us]
    expired = [u for u in missed if earliest - u > horizon_us]
    within = [u for u in missed if earliest - u <= horizon_us]

    fires: list[NewFire] = []
    quiet: list[NewFire] = []  # non-dispatch records, bounded below
    horizon_txt = _fmt_s(horizon_us)
    for u in expired:
        quiet.append(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.EXPIRED,
                          f"expired: missed and older than the catch-up horizon ({horizon_txt})"))
    policy = policies.missed_fire
    if policy == MissedFirePolicy.FIRE_ALL:
        fires.extend(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.PENDING) for u in within)
    elif policy == MissedFirePolicy.FIRE_ONCE_NOW:
        keep = within[-1] if within and not on_time else None
        for u in within:
            if u == keep:
                fires.append(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.PENDING))
            else:
                quiet.append(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.SKIPPED,
                                  "skipped: missed; fire-once-now fires only the most recent missed instant"))
    else:
        quiet.extend(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.SKIPPED,
                          "skipped: missed; missed-fire policy is skip") for u in within)
    for u in on_time:
        f = fire(u, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING)
        nb = dispatch_not_before_us(row.trigger_id, u, policies.jitter_s)
        fires.append(f if nb is None else replace(f, not_before_us=max(nb, earliest)))

    if len(quiet) > ctx.record_cap:
        # Keep the newest individually; one range record (at the oldest instant) counts the rest.
        quiet.sort(key=lambda f: f.scheduled_us)
        rest, keep_rows = quiet[: len(quiet) - ctx.record_cap + 1], quiet[len(quiet) - ctx.record_cap + 1:]
        n = f"more than {len(rest)}" if overflow else str(len(rest))
        first, last = rest[0], rest[-1]
        summary = replace(first, cause=(
            f"range: {n} missed instants from {_iso(first.scheduled_us)} to {_iso(last.scheduled_us)} "
            f"recorded as one; first cause: {first.cause}"))
        quiet = [summary, *keep_rows]
    elif overflow and quiet:
        first = quiet[0]
        quiet[0] = replace(first, cause=f"{first.cause}; more instants before it were not enumerated")

    advance = Advance(row.trigger_id, row.next_us, row.version, new_next, row.version)
    all_fires = sorted([*quiet, *fires], key=lambda f: f.scheduled_us)
    return Decision(advance, tuple(all_fires))
