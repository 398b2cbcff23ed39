"""``/v1/triggers`` and ``/v1/fires``: definitions, their lifecycle, preview and fire history.

The handlers check roles and shape HTTP; every act is the definitions service's
(:class:`fireledger.registry.Registry`): a new immutable version (or a state change), the trigger's
single due row and the act's audit row in one store transaction (invariant 5), then
``on_definition_change`` so an embedded timing loop wakes at once. Its refusals become problem
details in the app's handler (:func:`.problems.from_registry`). Schedules are compiled by
:mod:`fireledger.recurrence` — the same code as the timing loop — and stored *normalised*
(``rec.spec()``: an interval carries its anchor), so every later computation from a version is
deterministic.

``POST /v1/triggers/{id}/run`` commits one ``manual`` fire now (its own key: the request's instant
with sequence 1, so it never collides with a scheduled fire of the same instant) and its audit row
in one transaction.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel

from fireledger.definitions import recurrence_of
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import Principal
from fireledger.recurrence import Recurrence, RecurrenceError, format_instant, load_zone, preview
from fireledger.registry import Current, Definition, Registry
from fireledger.registry.checks import MAX_PAYLOAD_BYTES, POLICY_FIELDS, schedule_error
from fireledger.security.digests import stored_payload_digest

from . import history
from .auth import check_role, require
from .context import ApiContext, get_ctx
from .formats import (
    FireCursor,
    IdCursor,
    InstantText,
    StateList,
    cursor_query,
    instant_query,
    state_query,
)
from .problems import ProblemError, invalid, not_found
from .schemas import (
    Preview,
    Problem,
    TriggerCreate,
    TriggerPage,
    TriggerPatch,
    TriggerView,
)
from .views import id_cursor, parse_fire_cursor, parse_id_cursor, trigger_view

log = logging.getLogger("fireledger.control")


router = APIRouter(prefix="/v1/triggers", tags=["triggers"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})
fires_router = APIRouter(prefix="/v1/fires", tags=["history"],
                         responses={401: {"model": Problem}, 403: {"model": Problem}})

#: A create body that passed every check (shared by create and its dry-run).
CreateChecked = Definition


def _registry(ctx: ApiContext) -> Registry:
    return Registry(ctx.store, on_change=ctx.on_definition_change)


def _check_policy_role(principal: Principal, fields: set[str]) -> None:
    if fields & POLICY_FIELDS:
        check_role(principal, "policy", fields=sorted(fields & POLICY_FIELDS))


def _lookup(ctx: ApiContext, principal: Principal, trigger_id: str) -> Current:
    """The tenant's trigger and its current version; another tenant's trigger is simply absent."""
    return _registry(ctx).current(principal.tenant_id, trigger_id)


def _tview(ctx: ApiContext, t: Any, v: Any) -> dict[str, Any]:
    """A trigger as the API shows it, with its payload's digest (decision 0186; never the payload)."""
    return {**trigger_view(t, v), "payload_digest": stored_payload_digest(ctx.store, t.tenant_id, t.id, v.version,
                                                                          v.payload)}


def _view(ctx: ApiContext, principal: Principal, trigger_id: str) -> dict[str, Any]:
    found = _lookup(ctx, principal, trigger_id)
    return _tview(ctx, found.trigger, found.version)


def validate_create(ctx: ApiContext, principal: Principal, body: TriggerCreate, now_us: int) -> Definition:
    """Every check ``POST /v1/triggers`` makes of its body at ``now_us`` (a problem naming each bad
    field), and the compiled result; stores nothing. ``POST /v1/triggers/dry-run`` calls the same."""
    return _registry(ctx).check_create(principal.tenant_id, body.model_dump(), now_us)


# --- definitions ------------------------------------------------------------------------------


@router.post("", status_code=201, response_model=TriggerView, summary="Create a trigger")
def create_trigger(body: TriggerCreate, response: Response, principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    _check_policy_role(principal, body.model_fields_set)
    made = _registry(ctx).create(principal.tenant_id, principal.id, body.model_dump(), now_us=ctx.now_us(),
                                 explicit=body.model_fields_set)
    response.headers["Location"] = f"/v1/triggers/{made.trigger.id}"
    return _tview(ctx, made.trigger, made.version)


@router.get("", response_model=TriggerPage, summary="List triggers (by id, paged)")
def list_triggers(limit: int = Query(100, ge=1, le=1000), cursor: IdCursor | None = cursor_query(),
                  principal: Principal = Depends(require("reader")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = parse_id_cursor(cursor)
    rows = ctx.store.registry.list_triggers(principal.tenant_id, after=after, limit=limit + 1)
    page = rows[:limit]
    items = []
    for t in page:
        v = ctx.store.registry.get_version(t.id, t.current_version)
        if v is not None:
            items.append(_tview(ctx, t, v))
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
    values = {f: getattr(body, f) for f in fields}
    if isinstance(values.get("retry"), BaseModel):   # only the retry fields sent (absent: unchanged)
        values["retry"] = values["retry"].model_dump(exclude_unset=True)
    done = _registry(ctx).amend(principal.tenant_id, principal.id, trigger_id, values, now_us=ctx.now_us())
    return _tview(ctx, done.trigger, done.version)


@router.delete("/{trigger_id}", status_code=204, response_class=Response,
               responses={404: {"model": Problem}, 409: {"model": Problem}})
def delete_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> Response:
    _registry(ctx).delete(principal.tenant_id, trigger_id, now_us=ctx.now_us())
    return Response(status_code=204)


@router.post("/{trigger_id}/pause", response_model=TriggerView,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Pause: the trigger keeps its definition but has no next instant; the pause is "
                     "recorded so that resume can decide the paused instants by the missed-fire policy")
def pause_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    done = _registry(ctx).pause(principal.tenant_id, trigger_id, now_us=ctx.now_us(), actor=principal.id)
    return _tview(ctx, done.trigger, done.version)


@router.post("/{trigger_id}/resume", response_model=TriggerView,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Resume: the instants that fell while paused are decided like after an outage — older "
                     "than the catch-up horizon recorded expired, within it by the missed-fire policy "
                     "(fire-all / fire-once-now / skip), each non-dispatch with its cause in the history")
def resume_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    done = _registry(ctx).resume(principal.tenant_id, trigger_id, now_us=ctx.now_us(), actor=principal.id)
    return _tview(ctx, done.trigger, done.version)


@router.post("/{trigger_id}/run", status_code=201,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Run now: commit one manual fire (kind manual, its own key), dispatched at once")
def run_trigger(trigger_id: str, principal: Principal = Depends(require("author")),
                ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    # The clock's earliest bound: dispatching at once can never precede the fire's own instant.
    fire = _registry(ctx).run(principal.tenant_id, principal.id, trigger_id, now=ctx.clock.now(),
                              decided_by=f"control:{principal.id}")
    return history.history_item(fire)


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
        raise invalid([schedule_error(exc)]) from None
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
               cursor: FireCursor | None = cursor_query(),
               from_: InstantText | None = instant_query("RFC 3339; scheduled instant ≥ from", alias="from"),
               to: InstantText | None = instant_query("RFC 3339; scheduled instant < to (later than from)"),
               state: StateList | None = state_query(),
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
    fire = ctx.store.history.get_fire(fk)
    if fire is None:
        raise not_found("fire")
    return history.history_item(fire)


__all__ = ["MAX_PAYLOAD_BYTES", "POLICY_FIELDS", "CreateChecked", "ProblemError", "fires_router", "router",
           "validate_create"]
