"""``/v1/calendars``: a tenant's named exclusion calendars (decision 0156).

A calendar lists dates, date ranges and cron-shaped exclusions, each in a zone
(:mod:`fireledger.recurrence.calendar`); a trigger names the calendars it skips in
``schedule.calendars``, and each instant one of them excludes is recorded ``skipped`` with the
calendar entry as its cause — never delivered. Writes need the ``author`` role (as triggers) and are
audited in their own transaction (``calendar.create`` / ``calendar.update`` / ``calendar.delete``:
the entries before and after); reads need ``reader``. A calendar still named by a live trigger is not
deleted (409 naming the triggers). Replacing a calendar changes no fire already decided: only the
decisions after it see the new entries (decision 0157).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from fireledger.domain.calendar_records import CalendarRecord
from fireledger.domain.model import Principal
from fireledger.recurrence import RecurrenceError, compile_calendar
from fireledger.recurrence.calendar import MAX_ENTRIES

from .auth import require
from .context import ApiContext, get_ctx
from .formats import CALENDAR_NAME_PATTERN, CURSOR_DOC
from .problems import conflict, invalid, not_found
from .schemas import Problem
from .views import instant

router = APIRouter(prefix="/v1/calendars", tags=["management"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

_DATE = r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
_CURSOR = r"^c\.[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
CalendarName = Annotated[str, Field(pattern=CALENDAR_NAME_PATTERN, max_length=64)]
CalendarCursor = Annotated[str, Field(pattern=_CURSOR)]


def _absent(**kw: Any) -> Any:
    """An optional field that may be absent but not null (its schema admits no null)."""
    return Field(None, **kw)


class Entry(BaseModel):
    """One exclusion: exactly one of ``date``, ``from`` + ``to``, ``cron``; ``zone`` default UTC."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra={"oneOf": [
        {"required": ["date"], "not": {"anyOf": [{"required": ["from"]}, {"required": ["to"]},
                                                  {"required": ["cron"]}]}},
        {"required": ["from", "to"], "not": {"anyOf": [{"required": ["date"]}, {"required": ["cron"]}]}},
        {"required": ["cron"], "not": {"anyOf": [{"required": ["date"]}, {"required": ["from"]},
                                                  {"required": ["to"]}]}},
    ]})

    date: str = _absent(pattern=_DATE, description="A local date (YYYY-MM-DD): the whole day is "
                                                               "excluded.")
    from_: str = _absent(alias="from", pattern=_DATE, description="First local date of a range.")
    to: str = _absent(pattern=_DATE, description="Last local date of a range (included; not "
                                                             "before from).")
    cron: str = _absent(max_length=256, description="5-field cron (minute hour day-of-month month "
                                                               "day-of-week): every matching minute is "
                                                               "excluded, e.g. '* * 25 12 *' every 25 December.")
    zone: str = Field("UTC", max_length=64, description="IANA zone the date or wall time is read in.")
    label: str = _absent(max_length=100, description="Shown in the cause of an excluded fire.")


class CalendarCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: CalendarName
    entries: list[Entry] = Field(max_length=MAX_ENTRIES)


class CalendarReplace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: list[Entry] = Field(max_length=MAX_ENTRIES)
    revision: int | None = Field(None, ge=1, le=2**53,
                                 description="Replace only if the calendar is at this revision (else 409).")


class CalendarView(BaseModel):
    name: str
    entries: list[dict[str, Any]]
    revision: int = Field(description="1 at creation, one more per replacement.")
    created_at: str
    updated_at: str


class CalendarPage(BaseModel):
    items: list[CalendarView]
    next: str | None


def _entries(items: list[Entry]) -> list[dict[str, Any]]:
    return [e.model_dump(by_alias=True, exclude_none=True) for e in items]


def _check(name: str, entries: list[dict[str, Any]]) -> None:
    """Compile the entries as the timing plane will (a problem naming ``entries[i].<field>``)."""
    try:
        compile_calendar(name, entries)
    except RecurrenceError as exc:
        raise invalid([(exc.field, exc.problem)]) from None


def view(c: CalendarRecord) -> dict[str, Any]:
    return {"name": c.name, "entries": c.entries, "revision": c.revision, "created_at": instant(c.created_us),
            "updated_at": instant(c.updated_us)}


@router.post("", status_code=201, response_model=CalendarView, responses={409: {"model": Problem}},
             summary="Create an exclusion calendar (audited)")
def create_calendar(body: CalendarCreate, response: Response, principal: Principal = Depends(require("author")),
                    ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    entries = _entries(body.entries)
    _check(body.name, entries)
    now = ctx.now_us()
    cal = CalendarRecord(principal.tenant_id, body.name, entries, 1, now, now)
    if not ctx.store.registry.create_calendar(cal, principal.id):
        raise conflict(f"a calendar named {body.name!r} exists; replace it with PUT /v1/calendars/{body.name}")
    response.headers["Location"] = f"/v1/calendars/{body.name}"
    return view(cal)


@router.get("", response_model=CalendarPage, summary="List exclusion calendars (by name, paged)")
def list_calendars(limit: int = Query(100, ge=1, le=1000),
                   cursor: CalendarCursor | None = Query(None, description=CURSOR_DOC),
                   principal: Principal = Depends(require("reader")),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = cursor[2:] if cursor else ""
    rows = ctx.store.registry.list_calendars(principal.tenant_id, after=after, limit=limit + 1)
    page = rows[:limit]
    return {"items": [view(c) for c in page], "next": f"c.{page[-1].name}" if len(rows) > limit else None}


@router.get("/{name}", response_model=CalendarView, responses={404: {"model": Problem}})
def get_calendar(name: CalendarName, principal: Principal = Depends(require("reader")),
                 ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    c = ctx.store.registry.get_calendar(principal.tenant_id, name)
    if c is None:
        raise not_found("calendar")
    return view(c)


@router.put("/{name}", response_model=CalendarView, responses={404: {"model": Problem}, 409: {"model": Problem}},
            summary="Replace a calendar's entries (audited); fires already decided keep their state")
def replace_calendar(name: CalendarName, body: CalendarReplace, principal: Principal = Depends(require("author")),
                     ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    entries = _entries(body.entries)
    _check(name, entries)
    reg = ctx.store.registry
    done = reg.replace_calendar(principal.tenant_id, name, entries, principal.id, ctx.now_us(),
                                expected_revision=body.revision)
    if done is None:
        if reg.get_calendar(principal.tenant_id, name) is None:
            raise not_found("calendar")
        raise conflict(f"calendar {name!r} is not at revision {body.revision}; read it again and retry")
    return view(done)


@router.delete("/{name}", status_code=204, response_class=Response,
               responses={404: {"model": Problem}, 409: {"model": Problem}},
               summary="Delete a calendar (refused while a live trigger names it)")
def delete_calendar(name: CalendarName, principal: Principal = Depends(require("author")),
                    ctx: ApiContext = Depends(get_ctx)) -> Response:
    users = ctx.store.registry.delete_calendar(principal.tenant_id, name, principal.id, ctx.now_us())
    if users is None:
        raise not_found("calendar")
    if users:
        shown = ", ".join(users[:20]) + (f" and {len(users) - 20} more" if len(users) > 20 else "")
        raise conflict(f"calendar {name!r} is named by trigger(s) {shown}; amend or delete them first")
    return Response(status_code=204)

__all__ = ["CalendarCreate", "CalendarReplace", "CalendarView", "router", "view"]
