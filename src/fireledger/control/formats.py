"""The string forms the API reads, as patterns ``/openapi.json`` publishes (decision 0141).

Each pattern is the server's own first check of that input, written once here: the request models
and query parameters declare it (so a generated client can validate before sending) and pydantic
enforces it (so the schema and the server cannot drift). The patterns use only ``[0-9]``-style
classes, groups, alternation and bounded repetition, which mean the same in ECMA-262 (JSON Schema),
Rust (pydantic-core) and Python. A refusal names the field with the sentence of
:data:`PATTERN_PROBLEMS` and never echoes the input.

What a pattern cannot say is checked after it and documented beside it (the ``x-fireledger-*``
keywords and descriptions): a duration's range, an instant whose UTC value leaves years 0001–9999
(year 0001 or 9999 with an offset that crosses the edge), a window whose ``to`` is not after its
``from``. tests/api/test_trust_schemathesis.py lists them per operation and holds the server to that list.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import Query
from pydantic import BeforeValidator, Field

from fireledger.domain.history_records import ALL_STATES
from fireledger.recurrence import format_duration

# --- instants -----------------------------------------------------------------------------------

_YEAR = "([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"                  # 0001-9999
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"


def _date(sep: str) -> str:
    """A calendar date ``YYYY<sep>MM<sep>DD`` that exists (month lengths and leap years included)."""
    month_day = (f"(0[1-9]|1[0-2]){sep}(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2]){sep}(29|30)"
                 f"|(0[13578]|1[02]){sep}31")
    return f"({_YEAR}{sep}({month_day})|{_LEAP_YEAR}{sep}02{sep}29)"


_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_OFFSET = "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"

#: RFC 3339 with an offset (``2026-03-29T01:30:00Z``, ``…T03:30:00.5+02:00``): a date that exists,
#: no leap second, at most 9 fraction digits (the server keeps 6).
INSTANT_PATTERN = f"^{_date('-')}[Tt]{_TIME}(\\.[0-9]{{1,9}})?{_OFFSET}$"
INSTANT_HINT = "must be an RFC 3339 instant with an offset, e.g. 2026-03-29T01:30:00Z"

#: ``<tenant>.<trigger>.<YYYYMMDDTHHMMSS[ffffff]Z>.<seq>`` (:class:`fireledger.domain.keys.FireKey`).
FIRE_KEY_PATTERN = (f"^[A-Za-z0-9_-]{{1,64}}\\.[A-Za-z0-9_-]{{1,64}}\\.{_date('')}T"
                    "([01][0-9]|2[0-3])[0-5][0-9][0-5][0-9]([0-9]{6})?Z\\.[0-9]{1,9}$")
FIRE_KEY_HINT = "is not a fire key (tenant.trigger.YYYYMMDDTHHMMSSZ.seq)"

# --- durations ----------------------------------------------------------------------------------

#: ``90s``, ``15m``, ``1h30m``, ``500ms``, ``2d``: one or more (digits, unit) parts
#: (:func:`fireledger.recurrence.parse_duration`'s grammar, without surrounding blanks).
DURATION_PATTERN = "^([0-9]+(ms|s|m|h|d))+$"
DURATION_HINT = "is not a duration (use a number and a unit: ms, s, m, h, d; e.g. 90s)"


def duration_schema(minimum: timedelta, maximum: timedelta, *, whole_seconds: bool) -> dict[str, Any]:
    """The ``json_schema_extra`` of a duration field: its bounds, which no pattern can state, as an
    extension keyword a client can read (``x-fireledger-duration``)."""
    return {"x-fireledger-duration": {"minimum": format_duration(minimum), "maximum": format_duration(maximum),
                                      "whole_seconds": whole_seconds}}


# --- history filters ----------------------------------------------------------------------------

_STATE = "(" + "|".join(ALL_STATES) + ")"
#: ``delivered`` or ``expired,skipped``: one to eight fire states, comma-separated, no blanks.
STATE_LIST_PATTERN = f"^{_STATE}(,{_STATE}){{0,7}}$"
STATE_LIST_HINT = f"must be one to eight of {', '.join(ALL_STATES)} (comma-separated)"

# --- cursors ------------------------------------------------------------------------------------
# What the server issues as ``next`` (readable, but pass it back unchanged: the form may change).
# Cursors of the earlier base64url form are still honoured (decision 0141) and not declared.

_ID = "[A-Za-z0-9_-]"
#: Lists ordered by id (targets, triggers, principals): ``i.<last id>``.
ID_CURSOR_PATTERN = f"^i\\.{_ID}{{1,100}}$"
#: The audit: ``i.<last seq>``.
SEQ_CURSOR_PATTERN = "^i\\.[0-9]{1,18}$"
#: One trigger's fires: ``f.<scheduled µs>.<seq>``.
FIRE_CURSOR_PATTERN = "^f\\.-?[0-9]{1,18}\\.[0-9]{1,9}$"
#: The tenant's fires: ``g.<scheduled µs>.<trigger id>.<seq>``.
TENANT_CURSOR_PATTERN = f"^g\\.-?[0-9]{{1,18}}\\.{_ID}{{1,64}}\\.[0-9]{{1,9}}$"
CURSOR_HINT = "is not a cursor returned by this list (pass `next` back unchanged)"
CURSOR_DOC = "The previous page's `next`, passed back unchanged (with the same filters)."

#: pydantic's ``string_pattern_mismatch`` → the problem sentence naming what the field must be.
PATTERN_PROBLEMS: dict[str, str] = {
    INSTANT_PATTERN: INSTANT_HINT,
    FIRE_KEY_PATTERN: FIRE_KEY_HINT,
    DURATION_PATTERN: DURATION_HINT,
    STATE_LIST_PATTERN: STATE_LIST_HINT,
}


# --- declarations (query parameters and body fields) --------------------------------------------


#: An RFC 3339 query parameter's text (``from`` / ``to``), pattern enforced; ``format`` and ``pattern``
#: sit in the string branch of an optional parameter, where clients and schemathesis look for them.
def _json_integer(value: Any) -> Any:
    """JSON Schema's ``integer``: a number with no fractional part (``65.0`` included), never a boolean
    or a string (pydantic's lax mode would take ``true`` as 1 and ``"65"`` as 65)."""
    if isinstance(value, bool | str):
        raise ValueError("must be an integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: A body integer as JSON Schema reads one (:func:`_json_integer`), then checked strictly.
JsonInt = Annotated[int, BeforeValidator(_json_integer), Field(strict=True)]


InstantText = Annotated[str, Field(pattern=INSTANT_PATTERN, json_schema_extra={"format": "date-time"})]
#: ``?state=``: one or more fire states, comma-separated (pattern enforced).
StateList = Annotated[str, Field(pattern=STATE_LIST_PATTERN)]
# ``?cursor=``, declared with the form each list issues (each pattern bounds its length). Not enforced
# by pydantic: a legacy cursor is still honoured (the handler refuses anything else, naming ``cursor``,
# and a legacy one over 300 characters).
IdCursor = Annotated[str, Field(json_schema_extra={"pattern": ID_CURSOR_PATTERN})]
SeqCursor = Annotated[str, Field(json_schema_extra={"pattern": SEQ_CURSOR_PATTERN})]
FireCursor = Annotated[str, Field(json_schema_extra={"pattern": FIRE_CURSOR_PATTERN})]
TenantCursor = Annotated[str, Field(json_schema_extra={"pattern": TENANT_CURSOR_PATTERN})]


def instant_query(description: str, *, alias: str | None = None) -> Any:
    """The ``Query`` of an optional :data:`InstantText` parameter."""
    return Query(None, alias=alias, description=description)


def cursor_query() -> Any:
    """The ``Query`` of an optional cursor parameter (typed :data:`IdCursor` … :data:`TenantCursor`)."""
    return Query(None, description=CURSOR_DOC)


def state_query() -> Any:
    """The ``Query`` of an optional :data:`StateList` parameter."""
    return Query(None, description="One fire state or several, comma-separated (no blanks).")


def instant_field(description: str, *, alias: str | None = None, example: str) -> Any:
    """A required RFC 3339 body field, pattern enforced."""
    return Field(alias=alias, pattern=INSTANT_PATTERN, description=description,
                 examples=[example], json_schema_extra={"format": "date-time"})


def duration_field(default: str | None, description: str, minimum: timedelta, maximum: timedelta, *,
                   whole_seconds: bool) -> Any:
    """A duration body field: the grammar enforced as a pattern, the bounds declared (and checked by
    the handler, naming the field)."""
    return Field(default, pattern=DURATION_PATTERN, description=description,
                 json_schema_extra=duration_schema(minimum, maximum, whole_seconds=whole_seconds))


def schedule_schema() -> dict[str, Any]:
    """The ``json_schema_extra`` of a schedule object: its fields, their forms and "exactly one of
    cron, every, at, specs" (``specs``: several of the single forms, their instants united, decision
    0155); ``calendars`` names exclusion calendars (0156). The compiler checks the rest (a cron that
    parses, a zone that exists, bounds); the registry that each calendar exists."""
    from fireledger.recurrence.schedule import MAX_CALENDARS
    from fireledger.recurrence.union import MAX_SPECS
    from fireledger.security.limits import MAX_SCHEDULE_STRING

    text = {"type": "string", "maxLength": MAX_SCHEDULE_STRING}
    instant = {**text, "pattern": INSTANT_PATTERN, "format": "date-time"}
    single = {"cron": {**text, "description": "5 fields, or 6 with leading seconds."},
              "zone": {**text, "description": "An IANA zone name (default UTC)."},
              "every": {**text, "pattern": DURATION_PATTERN,
                        **duration_schema(timedelta(seconds=1), timedelta(days=18300), whole_seconds=True)},
              "anchor": {**instant, "description": "every: the instant the intervals count from."},
              "at": instant, "not_before": instant, "not_after": instant}
    one_of = [{"required": ["cron"]}, {"required": ["every"]}, {"required": ["at"]}]
    member = {"type": "object", "additionalProperties": False, "properties": single, "oneOf": one_of,
              "dependentRequired": {"anchor": ["every"]}}
    calendars = {"type": "array", "maxItems": MAX_CALENDARS, "uniqueItems": True,
                 "items": {"type": "string", "pattern": CALENDAR_NAME_PATTERN},
                 "description": "Exclusion calendars (/v1/calendars) whose instants this trigger skips: "
                                "each excluded instant is recorded 'skipped' with the calendar entry as its cause."}
    specs = {"type": "array", "minItems": 1, "maxItems": MAX_SPECS, "items": member,
             "description": "Several specs: the trigger's instants are their union; an instant two specs "
                            "share fires once, its fire naming the specs (indexes) that matched."}
    union_only = {"required": ["specs"],
                  "not": {"anyOf": [{"required": [k]} for k in ("zone", "anchor")]}}
    return {
        "additionalProperties": False,
        "properties": {**single, "specs": specs, "calendars": calendars},
        "oneOf": [*one_of, union_only],
        "dependentRequired": {"anchor": ["every"]},
    }


#: A calendar's name (``/v1/calendars/{name}``, ``schedule.calendars``).
CALENDAR_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


#: ``http`` (a verified endpoint), ``queue`` (a tenant-owned queue, /v1/queues), ``internal`` (a
#: Python callable registered by name in the dispatching process).
TARGET_KINDS = ("http", "queue", "internal")


def target_create_schema() -> dict[str, Any]:
    """``POST /v1/targets``' body by kind: an http target has a ``url`` (http or https), an internal
    one a ``name``, a queue neither. The URL rules of :mod:`.urls` (private hosts, https unless the
    operator allows private targets) and the callable's registration are checked by the handler."""
    none = {"type": "null"}
    url = {"type": "string", "maxLength": 2048, "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"}
    return {"oneOf": [
        {"properties": {"kind": {"const": "http"}, "url": url, "name": none}, "required": ["url"]},
        {"properties": {"kind": {"const": "queue"}, "url": none, "name": none}},
        {"properties": {"kind": {"const": "internal"}, "url": none, "name": {"type": "string"}},
         "required": ["name"]},
    ]}


__all__ = [
    "CALENDAR_NAME_PATTERN", "CURSOR_DOC", "CURSOR_HINT", "DURATION_HINT", "DURATION_PATTERN",
    "FIRE_CURSOR_PATTERN", "FIRE_KEY_HINT",
    "FIRE_KEY_PATTERN", "ID_CURSOR_PATTERN", "INSTANT_HINT", "INSTANT_PATTERN", "PATTERN_PROBLEMS",
    "SEQ_CURSOR_PATTERN", "STATE_LIST_HINT", "STATE_LIST_PATTERN", "TARGET_KINDS", "TENANT_CURSOR_PATTERN",
    "FireCursor", "IdCursor", "InstantText", "JsonInt", "SeqCursor", "StateList", "TenantCursor",
    "cursor_query", "duration_field", "duration_schema", "instant_field", "instant_query", "schedule_schema",
    "state_query", "target_create_schema",
]
