"""Dead letters and redrive (issue 17, decision 0148).

``GET  /v1/dead-letters``             reader   the tenant's fires that ended ``failed`` or ``unknown``
                                               (filters ``trigger_id``, ``from``/``to`` on the scheduled
                                               instant, ``cause`` contained; cursor paging)
``POST /v1/fires/{key}/redrive``      author   a further attempt of that fire under the SAME key
``POST /v1/dead-letters/redrive``     author   the same for every dead letter the filters select (at most
                                               ``limit``, oldest first); ``dry_run`` counts, changes nothing

A redrive is refused, writing nothing, with a 409 problem when the fire is not dead (``not-dead``:
pending, running or delivered), is older than the history retention (``past-retention``: it is
about to be archived and purged), or its trigger was deleted. Each redrive appends a ``fire.redrive``
audit row (actor, the fire's prior state, cause and attempts) in the transaction that makes it.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fireledger.domain.keys import FireKey
from fireledger.domain.model import Fire, Principal, TriggerState
from fireledger.domain.trust_records import AuditNote
from fireledger.retention import retention_days

from .auth import require
from .context import ApiContext, get_ctx
from .history import HistoryFire, history_item, parse_window
from .problems import ProblemError, invalid, not_found
from .schemas import Problem, _Body
from .views import instant

router = APIRouter(prefix="/v1", tags=["dead letters"], responses={401: {"model": Problem}, 403: {"model": Problem}})

_DAY_US = 86_400 * 1_000_000
#: The most fires one bulk redrive acts on.
BULK_MAX = 1000
_CURSOR = re.compile(r"^d:(-?\d{1,19}):([A-Za-z0-9_-]{1,100}):(\d{1,9})$")
_BAD_CURSOR = "is not a cursor returned by this list (pass `next` back unchanged)"


class DeadLetter(BaseModel):
    key: str
    trigger_id: str
    scheduled_instant: str
    state: str = Field(description="'failed' or 'unknown'.")
    cause: str | None = Field(description="Why it ended: the bound that ended its retries, a final status, …")
    finished_at: str | None
    attempts: int = Field(description="Attempts made, redrives included (GET /v1/fires/{key} lists them).")
    redriven_at: str | None
    kind: str
    lane: str
    version: int


class DeadLetterPage(BaseModel):
    items: list[DeadLetter]
    next: str | None


class BulkRedrive(_Body):
    trigger_id: str | None = Field(None, max_length=100, description="Only this trigger's dead letters.")
    from_: str | None = Field(None, alias="from", description="Scheduled at or after this instant (RFC 3339).")
    to: str | None = Field(None, description="Scheduled before this instant (RFC 3339).")
    cause: str | None = Field(None, min_length=1, max_length=200, description="Cause contains this text.")
    dry_run: bool = Field(False, strict=True, description="Count what would be redriven; change nothing.")
    limit: int = Field(BULK_MAX, ge=1, le=BULK_MAX, strict=True, description="Redrive at most this many, oldest first.")


class BulkRedriveResult(BaseModel):
    dry_run: bool
    count: int = Field(description="Dead letters redriven (dry run: that would be).")
    more: bool = Field(description="More dead letters match beyond `limit`: send the request again.")
    keys: list[str]


def _cursor(f: Fire) -> str:
    return base64.urlsafe_b64encode(f"d:{f.scheduled_us}:{f.trigger_id}:{f.seq}".encode()).decode().rstrip("=")


def _parse_cursor(text: str | None) -> tuple[int, str, int] | None:
    if text is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise invalid([("cursor", _BAD_CURSOR)]) from None
    m = _CURSOR.match(raw) if re.fullmatch(r"[A-Za-z0-9_-]+", text) else None
    if not m:
        raise invalid([("cursor", _BAD_CURSOR)])
    return int(m.group(1)), m.group(2), int(m.group(3))


def _item(f: Fire) -> dict[str, Any]:
    return {"key": str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)), "trigger_id": f.trigger_id,
            "scheduled_instant": instant(f.scheduled_us), "state": f.state.value, "cause": f.cause,
            "finished_at": instant(f.finished_us), "attempts": f.attempts, "redriven_at": instant(f.redriven_us),
            "kind": f.kind.value, "lane": f.lane.value, "version": f.version}


def _window(from_: str | None, to: str | None) -> tuple[int | None, int | None]:
    errors: list[tuple[str, str]] = []
    lo, hi = parse_window(from_, to, errors)
    if errors:
        raise invalid(errors)
    return lo, hi


def _retention_floor(ctx: ApiContext, now_us: int) -> int:
    """The oldest scheduled instant a redrive may touch: older fires are past the history retention."""
    return now_us - retention_days(ctx.settings) * _DAY_US


@router.get("/dead-letters", response_model=DeadLetterPage,
            summary="Fires that ended failed or unknown (dead letters), oldest scheduled instant first")
def list_dead_letters(trigger_id: str | None = Query(None, max_length=100),
                      from_: str | None = Query(None, alias="from", description="RFC 3339; scheduled at or after."),
                      to: str | None = Query(None, description="RFC 3339; scheduled before."),
                      cause: str | None = Query(None, min_length=1, max_length=200,
                                                description="Only dead letters whose cause contains this text."),
                      limit: int = Query(100, ge=1, le=1000), cursor: str | None = Query(None, max_length=300),
                      principal: Principal = Depends(require("reader")),
                      ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = _parse_cursor(cursor)
    lo, hi = _window(from_, to)
    rows = ctx.store.dispatch.dead_letters(principal.tenant_id, trigger_id=trigger_id, from_us=lo, to_us=hi,
                                           cause=cause, after=after, limit=limit + 1)
    page = rows[:limit]
    return {"items": [_item(f) for f in page], "next": _cursor(page[-1]) if len(rows) > limit else None}


def _conflict(slug: str, detail: str) -> ProblemError:
    return ProblemError(409, detail, slug=slug, title="Not redriven")


@router.post("/fires/{key}/redrive", response_model=HistoryFire,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Redrive a dead letter: a further attempt under the same key (never a new fire)")
def redrive_fire(key: str, principal: Principal = Depends(require("author")),
                 ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    try:
        fk = FireKey.parse(key)
    except ValueError:
        raise not_found("fire") from None
    fire = ctx.store.history.get_fire(fk) if fk.tenant_id == principal.tenant_id else None
    if fire is None:
        raise not_found("fire")
    now_us = ctx.now_us()
    floor = _retention_floor(ctx, now_us)
    if fire.state.value not in ("failed", "unknown"):
        raise _conflict("not-dead", f"the fire is {fire.state.value}: only a fire that ended failed or unknown "
                                    "can be redriven")
    if fire.scheduled_us < floor:
        raise _conflict("past-retention", "the fire is older than the history retention "
                                          f"({retention_days(ctx.settings)} days) and is not redriven")
    t = ctx.store.history.trigger_by_id(fk.trigger_id)
    if t is None or t.state == TriggerState.DELETED:
        raise _conflict("conflict", "the fire's trigger was deleted; its fires are not redriven")
    prior = {"fire_key": key, "state": fire.state.value, "cause": fire.cause, "attempts": fire.attempts}
    note = AuditNote(principal.tenant_id, principal.id, "fire.redrive", now_us, prior,
                     {"fire_key": key, "state": "pending", "attempt_base": fire.attempts})
    if not ctx.store.dispatch.redrive_fires([fk], now_us, not_before_us=floor, audit=note):
        raise _conflict("conflict", "the fire changed meanwhile; read it again")
    ctx.on_definition_change()     # wake the embedded dispatcher (it also polls)
    done = ctx.store.history.get_fire(fk)
    if done is None:
        raise not_found("fire")
    return history_item(done)


@router.post("/dead-letters/redrive", response_model=BulkRedriveResult,
             summary="Redrive the dead letters the filters select (dry_run: count them)")
def redrive_many(body: BulkRedrive, principal: Principal = Depends(require("author")),
                 ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    lo, hi = _window(body.from_, body.to)
    now_us = ctx.now_us()
    floor = _retention_floor(ctx, now_us)
    rows = ctx.store.dispatch.dead_letters(principal.tenant_id, trigger_id=body.trigger_id,
                                           from_us=floor if lo is None else max(lo, floor), to_us=hi,
                                           cause=body.cause, limit=body.limit + 1)
    chosen = [FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq) for f in rows[:body.limit]]
    more = len(rows) > body.limit
    if body.dry_run or not chosen:
        return {"dry_run": body.dry_run, "count": len(chosen), "more": more, "keys": [str(k) for k in chosen]}
    filters = body.model_dump(by_alias=True, exclude={"dry_run"})
    note = AuditNote(principal.tenant_id, principal.id, "fire.redrive", now_us, None,
                     {"filters": filters, "count": len(chosen), "fire_keys": [str(k) for k in chosen]})
    done = ctx.store.dispatch.redrive_fires(chosen, now_us, not_before_us=floor, audit=note)
    if done:
        ctx.on_definition_change()
    return {"dry_run": False, "count": len(done), "more": more, "keys": [str(k) for k in done]}


__all__ = ["BULK_MAX", "router"]
