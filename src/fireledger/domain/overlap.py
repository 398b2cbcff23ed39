"""Overlap policy (seed ADR-12, DESIGN.md invariant 9) as pure functions.

The timing plane asks, before it commits a new on-time or caught-up fire of a trigger whose
overlap policy is ``skip`` or ``queue``: *is the previous fire still running?* The previous fire is
the trigger's most recent fire that was, or will be, dispatched (any kind; not ``skipped``,
``expired`` or ``held``). It is **finished** when

* it ``failed``; or
* a work outcome was reported for it (the signed callback); or
* its outcome window has ended: the window starts at its first dispatch and lasts the
  ``outcome_window`` of its version. A ``delivered`` or ``unknown`` fire with no outcome past that
  end is *counted as finished*, and the decision that relied on it says so in its cause.

``pending`` and ``dispatching`` fires are running (the dispatch plane still owns them), and so is a
``delivered``/``unknown`` fire without an outcome inside its window.

``skip`` records the new fire ``skipped`` with the cause; ``queue`` records it ``held`` (committed,
never claimed by dispatch) and supersedes an older held fire (at most one is held per trigger); the
timing plane releases a held fire (→ ``pending``) once its previous fire has finished. ``allow``
never asks. Nothing here reads a clock or a store: every branch is tested with plain values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from .keys import FireKey, from_us
from .model import Decision, FireState, FireUpdate, NewFire, OverlapPolicy

__all__ = [
    "HeldRef",
    "OverlapPlan",
    "PreviousFire",
    "Status",
    "Verdict",
    "apply_overlap",
    "overlap_plan",
    "previous_status",
    "release_plan",
]


def _iso(us: int) -> str:
    """RFC 3339 UTC, exact (as the API formats instants)."""
    dt = from_us(us)
    frac = f".{dt.microsecond:06d}" if dt.microsecond else ""
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


@dataclass(frozen=True, slots=True)
class PreviousFire:
    """What the overlap check needs to know about a trigger's previous fire.

    ``key``: its fire key (string form, for causes); ``dispatched_us``: its first dispatch (None:
    never dispatched); ``has_outcome``: a work outcome was reported; ``window_s``: the outcome
    window of the version it was decided under."""

    key: str
    state: FireState
    dispatched_us: int | None
    has_outcome: bool
    window_s: int

    @property
    def window_end_us(self) -> int | None:
        """End of the outcome window (None while never dispatched)."""
        if self.dispatched_us is None:
            return None
        return self.dispatched_us + self.window_s * 1_000_000


@dataclass(frozen=True, slots=True)
class HeldRef:
    """The fire a trigger currently holds under ``queue`` (at most one)."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int

    def __str__(self) -> str:
        return str(FireKey(self.tenant_id, self.trigger_id, self.scheduled_us, self.seq))


@dataclass(frozen=True, slots=True)
class Status:
    """Whether a previous fire is running at an instant, and why, in words for a cause."""

    running: bool
    by_window: bool      # finished only because its window ended without an outcome
    reason: str


class Verdict(StrEnum):
    PROCEED = "proceed"                # dispatch as usual
    PROCEED_NOTED = "proceed-noted"    # dispatch; the previous was counted as finished (recorded)
    SKIP = "skip"                      # record skipped with the cause
    HOLD = "hold"                      # record held with the cause (queue)


@dataclass(frozen=True, slots=True)
class OverlapPlan:
    verdict: Verdict
    cause: str | None = None


_RUNNING_STATES = (FireState.PENDING, FireState.DISPATCHING)
_NOT_PREVIOUS = (FireState.SKIPPED, FireState.EXPIRED, FireState.HELD)


def previous_status(prev: PreviousFire, at_us: int) -> Status:
    """Is ``prev`` running at ``at_us``? (See the module docstring for the rule.)"""
    if prev.state in _NOT_PREVIOUS:
        # Never dispatched and never will be (or not yet allowed to be): not a previous fire.
        return Status(False, False, f"it is {prev.state.value}")
    if prev.state == FireState.FAILED:
        return Status(False, False, "it failed")
    if prev.has_outcome:
        return Status(False, False, "its work outcome was reported")
    end = prev.window_end_us
    if prev.state in _RUNNING_STATES:
        if prev.dispatched_us is None:
            return Status(True, False, f"{prev.state.value}, not yet dispatched")
        return Status(True, False, f"{prev.state.value}, first dispatched {_iso(prev.dispatched_us)}")
    # delivered / unknown without an outcome: running until the end of its window.
    if end is None:
        # Cannot happen (a delivered or unknown fire was dispatched); no window can be waited for.
        return Status(False, True, f"{prev.state.value} with no dispatch instant and no outcome")
    if at_us < end:
        return Status(True, False, f"{prev.state.value}, no outcome; its window ends {_iso(end)}")
    return Status(False, True, f"had no outcome by the end of its window ({_iso(end)})")


def overlap_plan(prev: PreviousFire | None, policy: OverlapPolicy, at_us: int) -> OverlapPlan:
    """The overlap verdict for a new fire decided at ``at_us`` whose previous fire is ``prev``."""
    if policy == OverlapPolicy.ALLOW or prev is None:
        return OverlapPlan(Verdict.PROCEED)
    st = previous_status(prev, at_us)
    if not st.running:
        if st.by_window:
            return OverlapPlan(Verdict.PROCEED_NOTED,
                               f"overlap: previous fire {prev.key} {st.reason}; counted as finished")
        return OverlapPlan(Verdict.PROCEED)
    if policy == OverlapPolicy.SKIP:
        return OverlapPlan(Verdict.SKIP,
                           f"skipped: overlap policy skip; previous fire {prev.key} still running ({st.reason})")
    return OverlapPlan(Verdict.HOLD,
                       f"held: overlap policy queue; previous fire {prev.key} still running ({st.reason})")


def release_plan(prev: PreviousFire | None, policy: OverlapPolicy, at_us: int) -> OverlapPlan:
    """Should a held fire be released at ``at_us``? PROCEED/PROCEED_NOTED (with the release note
    as cause) or HOLD. ``policy`` is the trigger's current one: amended to ``allow``, a held fire
    is released at once; ``skip`` or ``queue`` release it once its previous fire has finished."""
    if policy == OverlapPolicy.ALLOW:
        return OverlapPlan(Verdict.PROCEED, "overlap: released from hold; the overlap policy is now allow")
    if prev is None:
        return OverlapPlan(Verdict.PROCEED, "overlap: released from hold; no previous fire is recorded")
    st = previous_status(prev, at_us)
    if st.running:
        return OverlapPlan(Verdict.HOLD)
    if st.by_window:
        return OverlapPlan(Verdict.PROCEED_NOTED, f"overlap: released from hold; previous fire {prev.key} "
                                                  f"{st.reason}; counted as finished")
    return OverlapPlan(Verdict.PROCEED, f"overlap: released from hold; previous fire {prev.key} finished "
                                        f"({st.reason})")


def _key(f: NewFire) -> str:
    return str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))


def _superseded(newer: str) -> str:
    return f"superseded: overlap policy queue holds one pending fire; {newer} replaced it"


def apply_overlap(decision: Decision, prev: PreviousFire | None, held: HeldRef | None,
                  policy: OverlapPolicy, window_s: int, at_us: int) -> Decision:
    """Apply the overlap policy to a decision's dispatchable fires, oldest first.

    ``prev``/``held``: the trigger's previous fire and its held fire as committed; ``window_s``:
    the outcome window of the deciding version (a fire this decision lets through becomes the
    previous fire of the next one in the same decision: running, since it is not yet dispatched).
    Fires already skipped or expired by the missed-fire policy pass unchanged. A new fire that
    proceeds or is held supersedes the fire held before it (``queue`` holds at most one pending
    fire; the newer instant wins): a committed held fire through a compare-and-set update in the
    decision, an earlier fire of the same decision by recording it skipped.
    """
    if policy == OverlapPolicy.ALLOW:
        return decision
    fires = list(decision.fires)
    order = sorted(range(len(fires)), key=lambda i: (fires[i].scheduled_us, fires[i].seq))
    updates: list[FireUpdate] = list(decision.updates)
    held_db: HeldRef | None = held
    held_new: int | None = None     # index in ``fires`` of a fire held by this decision
    cur = prev

    def supersede(newer: str) -> None:
        nonlocal held_db, held_new
        if held_new is not None:
            fires[held_new] = replace(fires[held_new], state=FireState.SKIPPED, cause=_superseded(newer))
            held_new = None
        if held_db is not None:
            updates.append(FireUpdate(held_db.tenant_id, held_db.trigger_id, held_db.scheduled_us, held_db.seq,
                                      FireState.HELD, FireState.SKIPPED, _superseded(newer), at_us))
            held_db = None

    for i in order:
        f = fires[i]
        if f.state != FireState.PENDING:
            continue
        plan = overlap_plan(cur, policy, at_us)
        if plan.verdict in (Verdict.PROCEED, Verdict.PROCEED_NOTED):
            supersede(_key(f))
            fires[i] = f if plan.cause is None else replace(f, cause=plan.cause)
            cur = PreviousFire(_key(f), FireState.PENDING, None, False, window_s)
        elif plan.verdict == Verdict.SKIP:
            fires[i] = replace(f, state=FireState.SKIPPED, cause=plan.cause, not_before_us=None)
        else:
            supersede(_key(f))
            fires[i] = replace(f, state=FireState.HELD, cause=plan.cause, not_before_us=None)
            held_new = i
    return replace(decision, fires=tuple(fires), updates=tuple(updates))
