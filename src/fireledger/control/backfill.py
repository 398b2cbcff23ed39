"""``POST /v1/triggers/{id}/backfill`` (the privileged surface, role ``backfill``): fires for a declared
past window of one trigger. The rules are :mod:`fireledger.backfill`'s (shared with the operator
command); this module is the HTTP surface.

Body ``{"from": RFC 3339, "to": RFC 3339, "dry_run": false, "skip_delivered": false}``. Answers
``201`` with the counts (``created``, ``already_present``, ``skipped_delivered``) and, per instant (up
to 1000), its key and outcome; ``dry_run: true`` answers ``200`` with the same plan and stores
nothing. Bad input or a window over the bound (``FIRELEDGER_BACKFILL_MAX``): ``422`` naming the
field, nothing stored. An author without the ``backfill`` role: ``403`` naming the role, audited.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from fireledger.backfill import max_fires_from_env
from fireledger.domain.keys import to_us
from fireledger.domain.model import Principal
from fireledger.recurrence import RecurrenceError, parse_instant
from fireledger.registry import Registry

from .auth import require
from .context import ApiContext, get_ctx
from .formats import instant_field
from .problems import invalid
from .schemas import Problem

log = logging.getLogger("fireledger.control")

router = APIRouter(prefix="/v1/triggers", tags=["privileged"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})


class BackfillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False)

    from_: str = instant_field("RFC 3339: the window's start (included).", alias="from",
                               example="2026-03-01T00:00:00Z")
    to: str = instant_field("RFC 3339: the window's end (excluded); later than from, not after now.",
                            example="2026-03-02T00:00:00Z")
    dry_run: StrictBool = Field(False, description="List what would be created; store nothing.")
    skip_delivered: StrictBool = Field(False, description="Leave out instants that already hold a delivered "
                                                          "fire (of any kind).")


class BackfillItemView(BaseModel):
    instant: str
    key: str
    outcome: str = Field(description="create (dry run) | created | present (a backfill fire of this instant "
                                     "exists already) | skipped-delivered")


class BackfillView(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    trigger_id: str
    version: int = Field(description="The trigger version whose schedule gave the instants.")
    from_: str = Field(alias="from")
    to: str
    dry_run: bool
    kind: str
    lane: str
    instants: int = Field(description="Instants of the schedule in [from, to).")
    created: int = Field(description="Fires committed (dry run: that would be).")
    already_present: int
    skipped_delivered: int
    max_fires: int = Field(description="The maximum instants per backfill (FIRELEDGER_BACKFILL_MAX).")
    items: list[BackfillItemView]
    items_truncated: bool = Field(description="True when more instants than the listed items (1000).")


def _instant(text: str, field: str, errors: list[tuple[str, str]]) -> int | None:
    try:
        return to_us(parse_instant(text, field))
    except (RecurrenceError, OverflowError, ValueError):   # the pattern passed: UTC left the calendar
        errors.append((field, "must be an instant within the years 0001-9999 in UTC"))
        return None


def _max_fires(ctx: ApiContext) -> int:
    """``FIRELEDGER_BACKFILL_MAX``: from the process's settings, else the environment."""
    return ctx.settings.backfill_max if ctx.settings is not None else max_fires_from_env()


@router.post("/{trigger_id}/backfill", status_code=201, response_model=BackfillView, response_model_by_alias=True,
             responses={200: {"model": BackfillView, "description": "Dry run: the plan, nothing stored"},
                        404: {"model": Problem}, 409: {"model": Problem}},
             summary="Backfill: commit backfill fires for a past window (privileged, audited)")
def backfill_trigger(trigger_id: str, body: BackfillRequest, response: Response,
                     principal: Principal = Depends(require("backfill")),
                     ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    reg = Registry(ctx.store, on_change=ctx.on_definition_change)
    found = reg.current(principal.tenant_id, trigger_id)
    errors: list[tuple[str, str]] = []
    lo = _instant(body.from_, "from", errors)
    hi = _instant(body.to, "to", errors)
    if errors or lo is None or hi is None:
        raise invalid(errors)
    # The clock's earliest bound: every instant of the window is then certainly in the past.
    res = reg.backfill(found, lo, hi, now=ctx.clock.now(), actor=principal.id, decided_by=f"control:{principal.id}",
                       dry_run=body.dry_run, skip_delivered=body.skip_delivered, max_fires=_max_fires(ctx))
    if body.dry_run:
        response.status_code = 200
    return res.as_json()


__all__ = ["BackfillRequest", "BackfillView", "router"]
