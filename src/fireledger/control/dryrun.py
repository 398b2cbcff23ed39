"""Dry runs: what a definition or a policy change *would* do, computed by the code that does it, with
nothing stored (decision 0065).

* ``POST /v1/triggers/dry-run`` (role ``author``, and ``policy`` for policy fields — exactly as
  create): the create body is checked by create's own code (:func:`.triggers.validate_create`, the
  same problems naming the same fields) and answered with the normalised definition and the next
  ``count`` instants from the recurrence compiler the timing loop uses. For each instant it says
  whether jitter smearing applies (a whole-minute instant with a jitter window) and the window its
  dispatch would start in: the offset inside the window is derived from the trigger's id, which only
  create assigns, so a dry run gives the window, not the offset.
* ``POST /v1/triggers/{id}/policy/dry-run`` (role ``reader``: it reads the trigger's history and
  changes nothing) with the body of ``PATCH /v1/triggers/{id}/policy``: the trigger's last recorded
  gap — the most recent plan that missed instants (its ``catch-up`` fires share one decision
  instant) — what was recorded for it (counted by instant: a range record weighs its count), and
  what the proposed policies would have recorded, from the same pure planner
  (:func:`fireledger.domain.policies.replay_gap` calls ``plan_due``) over the same gap: the due row at
  the first missed instant, decided at the recorded decision instant, under the version it was
  decided under. ``replay_matches_record`` replays the recorded policies as well: False means the
  record cannot be reproduced (history purged in between, or this process runs with another miss
  threshold than the timing plane did), so the prediction is not to be trusted either. The overlap
  policy (decision 0060) decides from the fires live at the time: it is not replayed (the message
  says so for a trigger whose overlap policy is not ``allow``).
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from fireledger.definitions import next_us, recurrence_for
from fireledger.domain.keys import to_us
from fireledger.domain.model import Fire, OverlapPolicy, Policies, Principal
from fireledger.domain.policies import (
    Gap,
    GapCounts,
    PlanContext,
    count_records,
    miss_threshold_from,
    replay_counts,
)
from fireledger.domain.smearing import is_popular
from fireledger.recurrence import TZDATA_VERSION
from fireledger.registry import checks
from fireledger.security.digests import payload_digest

from . import triggers
from .auth import require
from .context import ApiContext, get_ctx
from .policy import PolicyPatch
from .problems import ProblemError, invalid, problem
from .schemas import PreviewItem, Problem, RetryView, TriggerCreate
from .views import duration_s, instant, policy_fields

router = APIRouter(prefix="/v1/triggers", tags=["triggers"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

_US = 1_000_000


# --- response shapes --------------------------------------------------------------------------


class DryRunDefinition(BaseModel):
    """The definition create would store (normalised; never the payload itself)."""

    name: str
    schedule: dict[str, Any]
    target_id: str
    missed_fire_policy: str
    catchup_horizon: str
    overlap_policy: str
    outcome_window: str
    jitter: str
    timeout: str
    retry: RetryView | None = None
    payload_bytes: int = Field(description="Size of the encoded payload (the payload is never echoed).")
    payload_digest: str | None = Field(None, description="The payload's keyed digest, as GET /v1/triggers/{id} "
                                                         "shows the stored one's (decision 0186).")
    tzdata_version: str


class DryRunItem(PreviewItem):
    smeared: bool = Field(description="Jitter smearing applies: a whole-minute instant and a jitter window.")
    dispatch_window_end: str | None = Field(
        description="When smeared: dispatch starts at the instant plus a fixed per-trigger offset, before "
                    "this instant (the offset comes from the id create assigns). Else null: at the instant.")


class DryRunCreate(BaseModel):
    stored: bool = Field(description="Always false: a dry run stores nothing.")
    definition: DryRunDefinition
    next_instant: str | None
    items: list[DryRunItem]
    tzdata_version: str
    notes: list[str]


class CountsView(BaseModel):
    """Instants of one plan by what became of them (a range record counts its range)."""

    instants: int
    dispatched: int = Field(description="Released for dispatch (either lane), whatever came of the delivery.")
    caught_up: int = Field(description="Of the dispatched: in the catch-up lane (missed instants).")
    on_time: int = Field(description="Of the dispatched: in the on-time lane (late, not missed).")
    skipped: int
    expired: int
    records: int = Field(description="Fire records the plan writes (range records included).")
    lower_bound: bool = Field(description="A range record said 'more than N': the counts are at least these.")


class PlanPolicies(BaseModel):
    missed_fire_policy: str
    catchup_horizon: str


class PlanOutcome(BaseModel):
    policies: PlanPolicies
    counts: CountsView


class GapView(BaseModel):
    first_missed_instant: str
    decided_at: str
    version: int = Field(description="The definition version the gap was decided under.")


class PolicyDryRun(BaseModel):
    stored: bool = Field(description="Always false: a dry run stores nothing.")
    trigger_id: str
    gap: GapView | None
    message: str
    recorded: PlanOutcome | None
    proposed: PlanOutcome | None
    replay_matches_record: bool | None
    miss_threshold: str


# --- POST /v1/triggers/dry-run ----------------------------------------------------------------


def _only_post(_request: Request) -> Response:
    """Any other method on ``/v1/triggers/dry-run`` is 405 (without this route ``GET`` would reach
    ``GET /v1/triggers/{trigger_id}`` and look up a trigger called "dry-run")."""
    return problem(405, "method not allowed on this resource", slug="method-not-allowed", headers={"Allow": "POST"})


# Registered ahead of /v1/triggers/{trigger_id} (app.py includes this router first); not an API
# operation, so not in the OpenAPI document. Authentication is the guard middleware's, as everywhere.
router.add_route("/v1/triggers/dry-run", _only_post, methods=["GET", "PUT", "PATCH", "DELETE", "OPTIONS"],
                 include_in_schema=False)


@router.post("/dry-run", response_model=DryRunCreate,
             summary="Dry-run a create: the same checks and the next N instants (with jitter windows) "
                     "from the timing loop's compiler; stores nothing")
def dry_run_create(body: TriggerCreate, count: int = Query(10, ge=1, le=1000),
                   principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    triggers._check_policy_role(principal, body.model_fields_set)
    now_us = ctx.now_us()
    checked = triggers.validate_create(ctx, principal, body, now_us)
    jitter_us = checked.policies.jitter_s * _US
    items = []
    for item in triggers.preview_items(checked.rec, now_us, count):
        at = _parse_instant(item["instant"])
        smeared = jitter_us > 0 and is_popular(at)
        items.append({**item, "smeared": smeared,
                      "dispatch_window_end": instant(at + jitter_us) if smeared else None})
    notes = ["nothing was stored: POST /v1/triggers with the same body creates the trigger"]
    if "every" in body.schedule and "anchor" not in body.schedule:
        notes.append("an interval without an anchor starts at the dry run's instant; create with the "
                     "returned schedule (which carries the anchor) to get exactly these instants")
    return {
        "stored": False,
        "definition": {"name": checked.name, "schedule": checked.rec.spec(), "target_id": body.target_id,
                       **policy_fields(checked.policies), "payload_bytes": len(checked.payload),
                       "payload_digest": payload_digest(ctx.store, principal.tenant_id, checked.payload),
                       "tzdata_version": TZDATA_VERSION},
        "next_instant": instant(checked.next_us),
        "items": items,
        "tzdata_version": TZDATA_VERSION,
        "notes": notes,
    }


def _parse_instant(text: str) -> int:
    return to_us(datetime.fromisoformat(text.replace("Z", "+00:00")))


# --- POST /v1/triggers/{id}/policy/dry-run ----------------------------------------------------


def miss_threshold_us() -> int:
    """The miss threshold of this process (``FIRELEDGER_MISS_THRESHOLD_S``; ``ValueError`` naming the
    variable when malformed — ``create_app`` calls this so a bad setting stops the start)."""
    from fireledger.settings import process_env

    return miss_threshold_from(process_env())


def _miss_threshold_us(ctx: ApiContext) -> int:
    if ctx.settings is not None:   # read and checked at start-up
        return ctx.settings.miss_threshold_us
    try:
        return miss_threshold_us()
    except ValueError as exc:   # an operator's setting, named (never request data)
        raise ProblemError(500, f"this process is misconfigured: {exc}", slug="misconfigured") from None


def _counts(c: GapCounts) -> dict[str, Any]:
    return {"instants": c.instants, "dispatched": c.dispatched, "caught_up": c.caught_up, "on_time": c.on_time,
            "skipped": c.skipped, "expired": c.expired, "records": c.records, "lower_bound": c.lower_bound}


def _plan_policies(p: Policies) -> dict[str, str]:
    return {"missed_fire_policy": p.missed_fire.value, "catchup_horizon": duration_s(p.catchup_horizon_s)}


def _gap_of(fires: list[Fire]) -> Gap:
    first = fires[0]
    return Gap(first.tenant_id, first.trigger_id, first.version, min(f.scheduled_us for f in fires),
               first.decided_us)


@router.post("/{trigger_id}/policy/dry-run", response_model=PolicyDryRun, responses={404: {"model": Problem}},
             summary="Dry-run a policy change against the trigger's last recorded gap: what was recorded and "
                     "what the proposed missed-fire policy / horizon would have recorded; stores nothing")
def dry_run_policy(trigger_id: str, body: PolicyPatch, principal: Principal = Depends(require("reader")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    found = triggers._lookup(ctx, principal, trigger_id)
    fields = body.model_fields_set
    errors: list[tuple[str, str]] = []
    proposed = checks.policies({f: getattr(body, f) for f in fields}, found.version.policies, errors)
    if errors:
        raise invalid(errors)
    threshold_us = _miss_threshold_us(ctx)
    out: dict[str, Any] = {"stored": False, "trigger_id": found.trigger.id, "gap": None, "recorded": None,
                           "proposed": None, "replay_matches_record": None,
                           "miss_threshold": duration_s(threshold_us / _US)}
    fires = ctx.store.registry.last_gap_fires(principal.tenant_id, found.trigger.id)
    gap_version = ctx.store.registry.get_version(found.trigger.id, fires[0].version) if fires else None
    if not fires or gap_version is None:
        out["message"] = ("no gap recorded: this trigger has never missed an instant (no catch-up, skipped "
                          "or expired fire in its history), so there is nothing to replay")
        return out
    gap = _gap_of(fires)
    rec = recurrence_for(gap_version.trigger_id, gap_version.version, gap_version.schedule)
    ctx_plan = PlanContext(earliest_us=gap.decided_us, decided_by="dry-run", tzdata_version=TZDATA_VERSION,
                           miss_threshold_us=threshold_us)
    next_fn = partial(next_us, rec)
    recorded = count_records((f.state, f.lane, f.cause) for f in fires)
    replayed = replay_counts(gap, next_fn, gap_version.policies, ctx_plan)
    would = replay_counts(gap, next_fn, proposed, ctx_plan)
    out.update(
        gap={"first_missed_instant": instant(gap.first_us), "decided_at": instant(gap.decided_us),
             "version": gap.version},
        recorded={"policies": _plan_policies(gap_version.policies), "counts": _counts(recorded)},
        proposed={"policies": _plan_policies(proposed), "counts": _counts(would)},
        replay_matches_record=_same(replayed, recorded),
        message=(f"the last gap: {recorded.instants} instants from {instant(gap.first_us)}, decided at "
                 f"{instant(gap.decided_us)}; the proposed policies would have dispatched "
                 f"{would.dispatched} ({would.caught_up} caught up), skipped {would.skipped} and expired "
                 f"{would.expired}, where {recorded.dispatched}, {recorded.skipped} and {recorded.expired} were "
                 "recorded. Nothing was stored."),
    )
    if gap_version.policies.overlap != OverlapPolicy.ALLOW:
        out["message"] += (f" The overlap policy ({gap_version.policies.overlap.value}) decides from the fires live at "
                           "the time and is not replayed: its skipped or held instants may differ.")
    return out


def _same(a: GapCounts, b: GapCounts) -> bool:
    return (a.dispatched, a.caught_up, a.on_time, a.skipped, a.expired) == (
        b.dispatched, b.caught_up, b.on_time, b.skipped, b.expired)


__all__ = ["miss_threshold_us", "router"]
