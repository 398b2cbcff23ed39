"""``/v1/triggers`` and ``/v1/fires``: definitions, their lifecycle, preview and fire history.

Every definition change writes a new immutable version (or a state change) and the trigger's single
due row in one store transaction (invariant 5), then calls ``on_definition_change`` so an embedded
timing loop wakes at once. Schedules are compiled by :mod:`fireledger.recurrence` — the same code as
the timing loop — and stored *normalised* (``rec.spec()``: an interval carries its anchor), so every
later computation from a version is deterministic.

``POST /v1/triggers/{id}/run`` commits one ``manual`` fire now (its own key: the request's instant
with sequence 1, so it never collides with a scheduled fire of the same instant) and audits it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.keys import FireKey, from_us, new_id, to_us
from fireledger.domain.model import (
    FireKind,
    FireState,
    Lane,
    MissedFirePolicy,
    NewFire,
    OverlapPolicy,
    Policies,
    Principal,
    Trigger,
    TriggerState,
    TriggerVersion,
)
from fireledger.domain.partition import partition_of
from fireledger.recurrence import (
    TZDATA_VERSION,
    OneShotRecurrence,
    Recurrence,
    RecurrenceError,
    compile_spec,
    format_instant,
    load_zone,
    parse_duration,
    preview,
)
from fireledger.security.envelope import seal_payload
from fireledger.security.limits import trigger_input_problems, trigger_limit_problem
from fireledger.security.targets import target_write_problem

from . import history
from .audit import record_policy_change
from .auth import check_role, require
from .context import ApiContext, get_ctx
from .problems import ProblemError, conflict, invalid, not_found
from .schemas import (
    Preview,
    Problem,
    TriggerCreate,
    TriggerPage,
    TriggerPatch,
    TriggerView,
)
from .views import fire_view, id_cursor, parse_fire_cursor, parse_id_cursor, trigger_view

log = logging.getLogger("fireledger.control")


router = APIRouter(prefix="/v1/triggers", tags=["triggers"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})
fires_router = APIRouter(prefix="/v1/fires", tags=["history"],
                         responses={401: {"model": Problem}, 403: {"model": Problem}})

MAX_PAYLOAD_BYTES = 64 * 1024
#: Fields whose change needs the ``policy`` role as well as ``author`` (invariant 13).
POLICY_FIELDS = frozenset({"missed_fire_policy", "catchup_horizon", "overlap_policy", "outcome_window"})
_CRON_FIELDS = frozenset({"second", "minute", "hour", "day-of-month", "month", "day-of-week"})
_SCHEDULE_STRINGS = ("cron", "every", "at", "zone", "anchor", "not_before", "not_after")
_ONE_S = timedelta(seconds=1)
#: field: (minimum, maximum, whole seconds only)
_DURATIONS: dict[str, tuple[timedelta, timedelta, bool]] = {
    "catchup_horizon": (timedelta(0), timedelta(hours=24), True),
    "outcome_window": (_ONE_S, timedelta(days=7), True),
    "jitter": (timedelta(0), timedelta(hours=1), True),
    "timeout": (_ONE_S, timedelta(minutes=15), False),
}


# --- validation -------------------------------------------------------------------------------


def _schedule_error(exc: RecurrenceError) -> tuple[str, str]:
    """Name the field as the client wrote it: cron sub-field problems belong to ``schedule.cron``."""
    field = exc.field if exc.field.startswith("schedule") else f"schedule.{exc.field}"
    sub = field.removeprefix("schedule.")
    if sub in _CRON_FIELDS:
        return "schedule.cron", f"{sub}: {exc.problem}"
    return field, exc.problem


def _compile(schedule: dict[str, Any], now_us: int, errors: list[tuple[str, str]]) -> Recurrence | None:
    bad = [(f"schedule.{k}", "must be a string") for k in _SCHEDULE_STRINGS
           if k in schedule and not isinstance(schedule[k], str)]
    if "anchor" in schedule and "every" not in schedule:
        bad.append(("schedule.anchor", "applies only to an interval schedule (every)"))
    if bad:
        errors.extend(bad)
        return None
    try:
        # An interval without an anchor starts at creation, truncated to the whole second, so its
        # instants (and fire keys) carry no stray microseconds.
        return compile_spec(schedule, default_anchor=from_us(now_us - now_us % 1_000_000))
    except RecurrenceError as exc:
        errors.append(_schedule_error(exc))
        return None


def _next_instant(rec: Recurrence, after_us: int, errors: list[tuple[str, str]]) -> int | None:
    """The first instant strictly after ``after_us``; a schedule with none is refused."""
    try:
        nxt = next_us(rec, after_us)
    except RecurrenceError as exc:
        errors.append(_schedule_error(exc))
        return None
    if nxt is None:
        if isinstance(rec, OneShotRecurrence) and to_us(rec.at) <= after_us:
            errors.append(("schedule.at", "is in the past"))
        elif rec.window.not_after is not None and to_us(rec.window.not_after) <= after_us:
            errors.append(("schedule.not_after", "is in the past: the schedule has no instant after now"))
        else:
            errors.append(("schedule", "has no instant after now"))
    return nxt


def _duration_s(field: str, text: str, errors: list[tuple[str, str]]) -> float | None:
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


def _policies(values: dict[str, Any], base: Policies, errors: list[tuple[str, str]]) -> Policies:
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
    return replace(base, **changes)


def _payload(obj: dict[str, Any], errors: list[tuple[str, str]]) -> bytes:
    """Encode the payload (never echoed: problems name only the field and the size)."""
    try:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        errors.append(("payload", "must be plain JSON (no NaN or Infinity)"))
        return b""
    if len(data) > MAX_PAYLOAD_BYTES:
        errors.append(("payload", f"is {len(data)} bytes when encoded; the limit is {MAX_PAYLOAD_BYTES} (64 KiB)"))
    return data


def _name(text: str, errors: list[tuple[str, str]]) -> str:
    if not text.strip():
        errors.append(("name", "must not be blank"))
    elif any(not ch.isprintable() for ch in text):
        errors.append(("name", "must not contain control characters"))
    return text


def _check_target(ctx: ApiContext, tenant_id: str, target_id: str, errors: list[tuple[str, str]]) -> None:
    # Invariant 12: only a verified, unexpired target of this tenant (another's reads as missing).
    problem = target_write_problem(ctx.store, tenant_id, target_id, ctx.now_us())
    if problem:
        errors.append(("target_id", problem))


def _check_policy_role(principal: Principal, fields: set[str]) -> None:
    if fields & POLICY_FIELDS:
        check_role(principal, "policy", fields=sorted(fields & POLICY_FIELDS))


def _stored(v: TriggerVersion, errors: list[tuple[str, str]]) -> Recurrence | None:
    """The compiled recurrence of a stored version; a schedule that no longer compiles (a tzdata
    change, decision 0087) is a problem naming ``schedule``: the client must send a new one."""
    try:
        return recurrence_of(v)
    except RecurrenceError as exc:
        errors.append(("schedule", f"the stored schedule no longer compiles ({exc.field}: {exc.problem}); "
                                   "send a new schedule"))
        return None


@dataclass(frozen=True)
class _Lookup:
    trigger: Trigger
    version: TriggerVersion


def _lookup(ctx: ApiContext, principal: Principal, trigger_id: str) -> _Lookup:
    """The tenant's trigger and its current version; another tenant's trigger is simply absent."""
    t = ctx.store.get_trigger(principal.tenant_id, trigger_id)
    if t is None:
        raise not_found("trigger")
    v = ctx.store.get_version(t.id, t.current_version)
    if v is None or v.tenant_id != principal.tenant_id:
        raise not_found("trigger")
    return _Lookup(t, v)


def _changed(ctx: ApiContext) -> None:
    try:
        ctx.on_definition_change()
    except Exception as exc:  # the change is committed; a failed wake-up only delays the loop
        log.warning("on_definition_change failed: %s", type(exc).__name__)


def _view(ctx: ApiContext, principal: Principal, trigger_id: str) -> dict[str, Any]:
    found = _lookup(ctx, principal, trigger_id)
    return trigger_view(found.trigger, found.version)


@dataclass(frozen=True)
class CreateChecked:
    """A create body that passed every check, compiled (shared by create and its dry-run)."""

    name: str
    rec: Recurrence
    payload: bytes
    policies: Policies
    next_us: int | None


def validate_create(ctx: ApiContext, principal: Principal, body: TriggerCreate, now_us: int) -> CreateChecked:
    """Every check ``POST /v1/triggers`` makes of its body at ``now_us`` (a problem naming each bad
    field), and the compiled result; stores nothing. ``POST /v1/triggers/dry-run`` calls the same."""
    errors: list[tuple[str, str]] = trigger_input_problems({"schedule": body.schedule, "payload": body.payload})
    name = _name(body.name, errors)
    rec = _compile(body.schedule, now_us, errors)
    _check_target(ctx, principal.tenant_id, body.target_id, errors)
    payload = _payload(body.payload, errors)
    policies = _policies(body.model_dump(include=set(POLICY_FIELDS) | {"jitter", "timeout"}), Policies(), errors)
    nxt = _next_instant(rec, now_us, errors) if rec is not None else None
    if errors or rec is None:
        raise invalid(errors)
    return CreateChecked(name, rec, payload, policies, nxt)


# --- definitions ------------------------------------------------------------------------------


@router.post("", status_code=201, response_model=TriggerView, summary="Create a trigger")
def create_trigger(body: TriggerCreate, response: Response, principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    _check_policy_role(principal, body.model_fields_set)
    over = trigger_limit_problem(ctx.store, principal.tenant_id)
    if over:
        raise ProblemError(409, over, slug="limit-reached")
    now_us = ctx.now_us()
    checked = validate_create(ctx, principal, body, now_us)
    name, rec, payload, policies, nxt = checked.name, checked.rec, checked.payload, checked.policies, checked.next_us
    tid = new_id("tr")
    trigger = Trigger(id=tid, tenant_id=principal.tenant_id, name=name, state=TriggerState.ACTIVE,
                      current_version=1, partition=partition_of(tid, ctx.store.partition_count()),
                      created_us=now_us, updated_us=now_us)
    version = TriggerVersion(trigger_id=tid, version=1, tenant_id=principal.tenant_id, schedule=rec.spec(),
                             target_id=body.target_id,
                             payload=seal_payload(ctx.store, principal.tenant_id, tid, 1, payload),
                             policies=policies, tzdata_version=TZDATA_VERSION, created_us=now_us)
    ctx.store.create_trigger(trigger, version, nxt)
    record_policy_change(ctx, principal, tid, None, policies, body.model_fields_set, now_us)
    _changed(ctx)
    response.headers["Location"] = f"/v1/triggers/{tid}"
    return trigger_view(replace(trigger, next_us=nxt), version)


@router.get("", response_model=TriggerPage, summary="List triggers (by id, paged)")
def list_triggers(limit: int = Query(100, ge=1, le=1000), cursor: str | None = Query(None, max_length=300),
                  principal: Principal = Depends(require("reader")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = parse_id_cursor(cursor)
    rows = ctx.store.list_triggers(principal.tenant_id, after=after, limit=limit + 1)
    page = rows[:limit]
    items = []
    for t in page:
        v = ctx.store.get_version(t.id, t.current_version)
        if v is not None:
            items.append(trigger_view(t, v))
    return {"items": items, "next": id_cursor(page[-1].id) if len(rows) > limit else None}


@router.get("/{trigger_id}", response_model=TriggerView, responses={404: {"model": Problem}})
def get_trigger(trigger_id: str, principal: Principal = Depends(require("reader")),
                ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    return _view(ctx, principal, trigger_id)


@router.patch("/{trigger_id}", response_model=TriggerView,
              responses={404: {"model": Problem}, 409: {"model": Problem}},
              summary="Amend a trigger: a new version, its next instant recomputed at once")
def amend_trigger(trigger_id: str, body: TriggerPatch, principal: Principal = Depends(require("author")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    fields = set(body.model_fields_set)
    _check_policy_role(principal, fields)
    found = _lookup(ctx, principal, trigger_id)
    trigger, old = found.trigger, found.version
    if not fields:
        raise invalid([("body", "names no field to change")])
    now_us = ctx.now_us()
    errors: list[tuple[str, str]] = trigger_input_problems(
        {f: getattr(body, f) for f in fields & {"schedule", "payload"}})
    name = _name(body.name, errors) if "name" in fields else trigger.name
    rec = _compile(body.schedule, now_us, errors) if "schedule" in fields else _stored(old, errors)
    target_id = old.target_id
    if "target_id" in fields:
        target_id = body.target_id
        _check_target(ctx, principal.tenant_id, target_id, errors)
    payload = _payload(body.payload, errors) if "payload" in fields else old.payload
    policies = _policies({f: getattr(body, f) for f in fields if f in POLICY_FIELDS | {"jitter", "timeout"}},
                         old.policies, errors)
    nxt: int | None = None
    if rec is not None:
        if "schedule" in fields:
            nxt = _next_instant(rec, now_us, errors)
        elif trigger.next_us is not None:
            # Same schedule: keep the pending instant (it may be due and not yet decided; recomputing
            # from now would silently drop it). The timing loop decides it under the new version.
            nxt = trigger.next_us
        else:
            nxt = next_us(rec, now_us)
    if errors or rec is None:
        raise invalid(errors)
    version = TriggerVersion(trigger_id=trigger.id, version=trigger.current_version + 1,
                             tenant_id=trigger.tenant_id, schedule=rec.spec(), target_id=target_id,
                             payload=seal_payload(ctx.store, trigger.tenant_id, trigger.id,
                                                  trigger.current_version + 1, payload)
                             if "payload" in fields else payload,  # kept: sealed at an earlier version
                             policies=policies, tzdata_version=TZDATA_VERSION, created_us=now_us)
    if not ctx.store.amend_trigger(trigger, version, name, nxt, now_us):
        raise conflict(f"the trigger changed meanwhile (version {trigger.current_version} is no longer "
                       "current); read it again and retry")
    record_policy_change(ctx, principal, trigger.id, old.policies, policies, fields, now_us)
    _changed(ctx)
    return _view(ctx, principal, trigger.id)


@router.delete("/{trigger_id}", status_code=204, response_class=Response,
               responses={404: {"model": Problem}, 409: {"model": Problem}})
def delete_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> Response:
    for _ in range(3):
        found = _lookup(ctx, principal, trigger_id)
        if ctx.store.set_trigger_state(found.trigger, TriggerState.DELETED, None, ctx.now_us()):
            _changed(ctx)
            return Response(status_code=204)
    raise conflict("the trigger kept changing; retry")


@router.post("/{trigger_id}/pause", response_model=TriggerView,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Pause: the trigger keeps its definition but has no next instant; the pause is "
                     "recorded so that resume can decide the paused instants by the missed-fire policy")
def pause_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    found = _lookup(ctx, principal, trigger_id)
    if found.trigger.state != TriggerState.ACTIVE:
        raise conflict(f"the trigger is {found.trigger.state.value}, not active")
    # Records the resume point: the pause instant, or just before an instant still undecided (0063).
    if ctx.store.pause_trigger(found.trigger, ctx.now_us()) is None:
        raise conflict("the trigger changed meanwhile; read it again and retry")
    _changed(ctx)
    return _view(ctx, principal, trigger_id)


@router.post("/{trigger_id}/resume", response_model=TriggerView,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Resume: the instants that fell while paused are decided like after an outage — older "
                     "than the catch-up horizon recorded expired, within it by the missed-fire policy "
                     "(fire-all / fire-once-now / skip), each non-dispatch with its cause in the history")
def resume_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    found = _lookup(ctx, principal, trigger_id)
    if found.trigger.state != TriggerState.PAUSED:
        raise conflict(f"the trigger is {found.trigger.state.value}, not paused")
    now_us = ctx.now_us()
    paused, point = ctx.store.resume_point(principal.tenant_id, trigger_id)
    if not paused:
        raise conflict("the trigger changed meanwhile; read it again and retry")
    # The due row restarts at the first instant of the current version after the resume point: the
    # timing plane then plans the paused gap by the missed-fire policy and horizon (decision 0063).
    # A trigger paused before resume points were recorded restarts after now, as it used to.
    try:
        nxt = next_us(recurrence_of(found.version), now_us if point is None else point)
    except RecurrenceError as exc:
        raise conflict(f"the trigger's schedule no longer compiles ({exc.field}: {exc.problem}); amend it with "
                       "a new schedule, then resume") from None
    if not ctx.store.resume_trigger(found.trigger, point, nxt, now_us):
        raise conflict("the trigger changed meanwhile; read it again and retry")
    _changed(ctx)
    return _view(ctx, principal, trigger_id)


@router.post("/{trigger_id}/run", status_code=201,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Run now: commit one manual fire (kind manual, its own key), dispatched at once")
def run_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    found = _lookup(ctx, principal, trigger_id)
    if found.trigger.state != TriggerState.ACTIVE:
        raise conflict(f"the trigger is {found.trigger.state.value}, not active")
    # The clock's earliest bound: dispatching at once can never precede the fire's own instant.
    iv = ctx.clock.now()
    now_us = iv.earliest_us
    fire = NewFire(tenant_id=principal.tenant_id, trigger_id=trigger_id, scheduled_us=now_us, seq=1,
                   version=found.trigger.current_version, kind=FireKind.MANUAL, lane=Lane.ON_TIME,
                   state=FireState.PENDING, decided_us=now_us, tzdata_version=TZDATA_VERSION,
                   decided_by=f"control:{principal.id}", eps_us=iv.eps_us, eps_source=iv.source)
    if not ctx.store.insert_fires([fire]):
        raise conflict("a manual fire was already recorded for this instant; retry")
    key = FireKey(principal.tenant_id, trigger_id, now_us, 1)
    ctx.store.append_audit(principal.tenant_id, principal.id, "trigger.run", now_us, None,
                           {"trigger_id": trigger_id, "fire_key": str(key)})
    _changed(ctx)
    stored = ctx.store.get_fire(key)
    assert stored is not None
    return history.history_item(stored)


@router.get("/{trigger_id}/preview", response_model=Preview, responses={404: {"model": Problem}},
            summary="The next N instants after now, computed by the timing loop's own code")
def preview_trigger(trigger_id: str, count: int = Query(10, ge=1, le=1000),
                    principal: Principal = Depends(require("reader")),
                    ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    found = _lookup(ctx, principal, trigger_id)
    items = preview_items(recurrence_of(found.version), ctx.now_us(), count)
    return {"items": items, "tzdata_version": found.version.tzdata_version}


def preview_items(rec: Recurrence, after_us: int, count: int) -> list[dict[str, Any]]:
    """The next ``count`` instants of ``rec`` strictly after ``after_us`` with their wall time and DST
    note — the recurrence's own ``next_after``, as the timing loop uses (also the create dry-run's)."""
    try:
        occurrences = preview(rec, from_us(after_us), count)
    except RecurrenceError as exc:
        raise invalid([_schedule_error(exc)]) from None
    zone = load_zone(rec.zone_name)
    items = []
    for occ in occurrences:
        wall = occ.wall if occ.wall is not None else occ.instant.astimezone(zone)
        items.append({"instant": format_instant(occ.instant),
                      "local": wall.replace(tzinfo=None).isoformat(), "dst": occ.note})
    return items


# --- history ----------------------------------------------------------------------------------


@router.get("/{trigger_id}/fires", response_model=history.HistoryPage, responses={404: {"model": Problem}},
            summary="Fires of a trigger, oldest first by default (never their payloads)")
def list_fires(trigger_id: str, limit: int = Query(100, ge=1, le=1000),
               cursor: str | None = Query(None, max_length=300),
               from_: str | None = Query(None, alias="from", max_length=64,
                                         description="RFC 3339; scheduled instant ≥ from"),
               to: str | None = Query(None, max_length=64, description="RFC 3339; scheduled instant < to"),
               state: str | None = Query(None, max_length=200, description="state or comma-separated states"),
               order: Literal["asc", "desc"] = Query("asc"),
               principal: Principal = Depends(require("reader")),
               ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    parse_fire_cursor(cursor)
    found = _lookup(ctx, principal, trigger_id)
    return history.fires_page(ctx, principal.tenant_id, trigger_id=found.trigger.id, limit=limit, cursor=cursor,
                              from_=from_, to=to, state=state, order=order)


@fires_router.get("/{key}", response_model=history.HistoryFire, responses={404: {"model": Problem}},
                  summary="One fire by its key")
def get_fire(key: str, principal: Principal = Depends(require("reader")),
             ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    try:
        fk = FireKey.parse(key)
    except ValueError:
        raise not_found("fire") from None
    if fk.tenant_id != principal.tenant_id:
        raise not_found("fire")
    fire = ctx.store.get_fire(fk)
    if fire is None:
        raise not_found("fire")
    return fire_view(fire)


__all__ = ["MAX_PAYLOAD_BYTES", "POLICY_FIELDS", "ProblemError", "fires_router", "router"]
