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

The work of one plan is bounded too (decision 0093): at most :data:`ENUMERATION_CAP` instants are
enumerated before the horizon's edge (the rest of an expired range is jumped over, counted as "more
than"), and at most :data:`ENUMERATION_CAP` from it. A plan that reaches the second cap is *partial*:
it decides its instants and advances the row to the first instant it did not decide, still due, so
the next cycle goes on from there (``fire-once-now`` fires nothing in a partial plan: a more recent
missed instant follows). A tenant's every-second trigger with a 24 h horizon thus costs each cycle
a bounded slice, never 86,400 instants in one plan and one transaction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
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
#: Instants enumerated per plan at most before the horizon's edge (beyond it the expired range is
#: counted as "more than"), and at most again from the edge (beyond it the plan is partial).
ENUMERATION_CAP = 2_000

NextFn = Callable[[int], int | None]


@dataclass(frozen=True, slots=True)
class PlanContext:
    """Everything a plan depends on besides the due row and its recurrence."""

    earliest_us: int
    decided_by: str
    tzdata_version: str
    miss_threshold_us: int = DEFAULT_MISS_THRESHOLD_US
    record_cap: int = DEFAULT_RECORD_CAP
    eps_us: int | None = None        # the clock bound the decider read, recorded on every fire
    eps_source: str | None = None


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
    first = row.next_us
    if earliest - first <= ctx.miss_threshold_us:
        # The hot path: one instant, on time (the general loop below decides the same, slower).
        following = next_fn(first)
        if following is None or following > earliest:
            nb = dispatch_not_before_us(row.trigger_id, first, policies.jitter_s, following)
            only = NewFire(
                tenant_id=row.tenant_id, trigger_id=row.trigger_id, scheduled_us=first, seq=0,
                version=row.version, kind=FireKind.SCHEDULED, lane=Lane.ON_TIME, state=FireState.PENDING,
                decided_us=earliest, tzdata_version=ctx.tzdata_version, decided_by=ctx.decided_by,
                not_before_us=None if nb is None else max(nb, earliest), eps_us=ctx.eps_us,
                eps_source=ctx.eps_source)
            return Decision(Advance(row.trigger_id, first, row.version, following, row.version), (only,))
    return plan_general(row, next_fn, policies, ctx)


def plan_general(row: DueRow, next_fn: NextFn, policies: Policies, ctx: PlanContext) -> Decision:
    """:func:`plan_due` without its one-instant-on-time shortcut (the tests hold them equal)."""
    earliest = ctx.earliest_us
    horizon_us = policies.catchup_horizon_s * 1_000_000
    instants, new_next, overflow, partial = _instants_due(row.next_us, earliest, horizon_us, next_fn)

    def fire(us: int, kind: FireKind, lane: Lane, state: FireState, cause: str | None = None) -> NewFire:
        return NewFire(
            tenant_id=row.tenant_id, trigger_id=row.trigger_id, scheduled_us=us, seq=0,
            version=row.version, kind=kind, lane=lane, state=state, decided_us=earliest,
            tzdata_version=ctx.tzdata_version, decided_by=ctx.decided_by, cause=cause,
            eps_us=ctx.eps_us, eps_source=ctx.eps_source,
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
        keep = within[-1] if within and not on_time and not partial else None
        for u in within:
            if u == keep:
                fires.append(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.PENDING))
            else:
                quiet.append(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.SKIPPED,
                                  "skipped: missed; fire-once-now fires only the most recent missed instant"))
    else:
        quiet.extend(fire(u, FireKind.CATCH_UP, Lane.CATCH_UP, FireState.SKIPPED,
                          "skipped: missed; missed-fire policy is skip") for u in within)
    for i, u in enumerate(on_time):
        f = fire(u, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING)
        following = on_time[i + 1] if i + 1 < len(on_time) else new_next
        nb = dispatch_not_before_us(row.trigger_id, u, policies.jitter_s, following)
        fires.append(f if nb is None else replace(f, not_before_us=max(nb, earliest)))

    quiet = _bounded_quiet(quiet, ctx.record_cap, overflow)
    advance = Advance(row.trigger_id, row.next_us, row.version, new_next, row.version)
    all_fires = sorted([*quiet, *fires], key=lambda f: f.scheduled_us)
    return Decision(advance, tuple(all_fires))


def _instants_due(next_us: int, earliest: int, horizon_us: int,
                  next_fn: NextFn) -> tuple[list[int], int | None, bool, bool]:
    """The instants from ``next_us`` up to ``earliest`` and the first one after them (None: the
    schedule ended): ``(instants, new_next, overflow, partial)``.

    At most :data:`ENUMERATION_CAP` instants are listed from the start. When the cap is hit inside
    the expired range (older than ``earliest − horizon_us``) the rest of that range is jumped over
    (``overflow``) and enumeration resumes at the horizon's edge, again capped; when a cap stops
    before ``earliest`` (``partial``), ``new_next`` is the first instant not listed, so the next
    plan continues from there."""
    instants: list[int] = []
    t: int | None = next_us
    overflow = False    # the expired range was jumped over, not enumerated to its end
    partial = False     # instants up to ``earliest`` remain for the next plan
    while t is not None and t <= earliest:
        if len(instants) >= ENUMERATION_CAP:
            if instants[-1] < earliest - horizon_us:
                overflow = True
            else:
                partial = True
            break
        instants.append(t)
        t = next_fn(t)
    if overflow:
        # Skip the rest of a very long gap without enumerating it: resume from the horizon's edge.
        t = next_fn(earliest - horizon_us - 1)
        more = 0
        while t is not None and t <= earliest:
            if more >= ENUMERATION_CAP:
                partial = True
                break
            instants.append(t)
            more += 1
            t = next_fn(t)
    return instants, t, overflow, partial


def _bounded_quiet(quiet: list[NewFire], record_cap: int, overflow: bool) -> list[NewFire]:
    """The non-dispatch records, at most ``record_cap`` of them: beyond the cap the newest
    ``record_cap − 1`` are kept individually and one range record at the oldest instant counts
    the rest (its cause names the range and the first cause). When instants were jumped over
    (``overflow``) the count says "more than" — or, under the cap, the oldest record's cause says
    that earlier instants were not enumerated."""
    if len(quiet) > record_cap:
        # Keep the newest individually; one range record (at the oldest instant) counts the rest.
        quiet.sort(key=lambda f: f.scheduled_us)
        rest, keep_rows = quiet[: len(quiet) - record_cap + 1], quiet[len(quiet) - record_cap + 1:]
        n = f"more than {len(rest)}" if overflow else str(len(rest))
        first, last = rest[0], rest[-1]
        summary = replace(first, cause=(
            f"range: {n} missed instants from {_iso(first.scheduled_us)} to {_iso(last.scheduled_us)} "
            f"recorded as one; first cause: {first.cause}"))
        return [summary, *keep_rows]
    if overflow and quiet:
        first = quiet[0]
        quiet[0] = replace(first, cause=f"{first.cause}; more instants before it were not enumerated")
    return quiet


# --- settings and replays (pause/resume gaps, policy dry-runs: decisions 0063-0065) -----------

#: Environment variable of the timing plane's miss threshold (seconds; decision 0064).
MISS_THRESHOLD_ENV = "FIRELEDGER_MISS_THRESHOLD_S"
#: The largest miss threshold accepted (the largest catch-up horizon).
MAX_MISS_THRESHOLD_US = 24 * 3600 * 1_000_000


def miss_threshold_from(env: Mapping[str, str]) -> int:
    """The miss threshold in µs from ``env`` (``FIRELEDGER_MISS_THRESHOLD_S``, default 60 s).

    Pure: the caller passes the environment mapping. Raises ``ValueError`` naming the variable when it is not
    a number of seconds in (0, 86400].
    """
    raw = env.get(MISS_THRESHOLD_ENV, "").strip()
    if not raw:
        return DEFAULT_MISS_THRESHOLD_US
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{MISS_THRESHOLD_ENV}: {raw!r} is not a number of seconds") from None
    us = round(seconds * 1_000_000) if math.isfinite(seconds) else -1   # NaN, inf: refused below
    if not 0 < us <= MAX_MISS_THRESHOLD_US:
        raise ValueError(f"{MISS_THRESHOLD_ENV}: must be more than 0 and at most 86400 seconds, got {raw}")
    return us


_RANGE = re.compile(r"^range: (more than )?(\d+) missed instants")


def record_weight(cause: str | None) -> tuple[int, bool]:
    """How many instants one fire record stands for: a range record counts its range (the second
    value is True when the range says "more than N": N is then a lower bound); any other record 1."""
    if cause:
        m = _RANGE.match(cause)
        if m:
            return int(m.group(2)), m.group(1) is not None
    return 1, False


@dataclass(frozen=True, slots=True)
class GapCounts:
    """What one plan recorded, counted by instant (range records weigh their count).

    ``dispatched`` counts instants released for dispatch (both lanes): a recorded fire counts there
    whatever its later delivery state. ``lower_bound`` is True when a range record said "more than".
    """

    dispatched: int = 0
    caught_up: int = 0
    on_time: int = 0
    skipped: int = 0
    expired: int = 0
    records: int = 0
    lower_bound: bool = False

    @property
    def instants(self) -> int:
        return self.dispatched + self.skipped + self.expired


def count_records(records: Iterable[tuple[str, str, str | None]]) -> GapCounts:
    """Count ``(state, lane, cause)`` of one plan's fire records (recorded or replayed alike)."""
    dispatched = caught_up = on_time = skipped = expired = n = 0
    bound = False
    for state, lane, cause in records:
        n += 1
        weight, more = record_weight(cause)
        bound = bound or more
        if state == FireState.EXPIRED.value:
            expired += weight
        elif state == FireState.SKIPPED.value:
            skipped += weight
        else:
            dispatched += weight
            if lane == Lane.CATCH_UP.value:
                caught_up += weight
            else:
                on_time += weight
    return GapCounts(dispatched, caught_up, on_time, skipped, expired, n, bound)


@dataclass(frozen=True, slots=True)
class Gap:
    """A recorded plan that missed instants: its first instant and the instant it was decided at,
    for the trigger version it was decided under."""

    tenant_id: str
    trigger_id: str
    version: int
    first_us: int
    decided_us: int


def replay_gap(gap: Gap, next_fn: NextFn, policies: Policies, ctx: PlanContext) -> Decision:
    """What :func:`plan_due` decides for ``gap`` under ``policies``: the same calls the timing loop
    made (the due row at the gap's first instant, decided at ``gap.decided_us``; partial plans
    followed to the end, as the loop's next cycles would), nothing stored.
    ``ctx.earliest_us`` is replaced by the gap's decision instant."""
    row = DueRow(gap.trigger_id, gap.tenant_id, 0, gap.first_us, gap.version)
    at = replace(ctx, earliest_us=gap.decided_us)
    d = plan_due(row, next_fn, policies, at)
    fires = list(d.fires)
    while d.advance.new_next_us is not None and d.advance.new_next_us <= gap.decided_us:   # partial plans
        row = replace(row, next_us=d.advance.new_next_us)
        d = plan_due(row, next_fn, policies, at)
        fires.extend(d.fires)
    return Decision(replace(d.advance, expected_next_us=gap.first_us), tuple(fires))


def replay_counts(gap: Gap, next_fn: NextFn, policies: Policies, ctx: PlanContext) -> GapCounts:
    """:func:`replay_gap`, counted like a recorded plan (:func:`count_records`)."""
    d = replay_gap(gap, next_fn, policies, ctx)
    return count_records((f.state.value, f.lane.value, f.cause) for f in d.fires)
