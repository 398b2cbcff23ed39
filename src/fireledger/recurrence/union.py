"""Several specs per trigger: the pure helpers of a compiled union (:class:`~.schedule.UnionRecurrence`).

``schedule: {"specs": [{"cron": …, "zone": …}, {"every": …}, {"at": …}], "not_before": …, "not_after": …}``
compiles once to a :class:`UnionRecurrence` (decision 0155). Its next instant after ``t`` is the
minimum of its members' next instants after ``t`` (each member keeps its own zone, DST rules and
validity window; the union's window bounds them all); two members on one instant make ONE instant,
and :func:`matched` says which members produced it (their indexes in ``specs``). A member whose
bounded search ends without an instant raises the same :class:`~.errors.NoMatchError`, its field
named ``specs[i].<field>``. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .errors import NoMatchError, RecurrenceError

#: The most specs one schedule may list.
MAX_SPECS = 16
#: Cron sub-field names: a member's cron problem is reported on ``specs[i].cron`` (as ``schedule.cron``).
CRON_SUBFIELDS = frozenset({"second", "minute", "hour", "day-of-month", "month", "day-of-week", "year"})

def member_field(i: int, exc: RecurrenceError) -> tuple[str, str]:
    """A member's problem named as the client wrote it: ``schedule.specs[i].<field>`` (cron sub-field
    problems on ``schedule.specs[i].cron``, as for a single schedule)."""
    if exc.field == "schedule":
        return f"schedule.specs[{i}]", exc.problem
    sub = exc.field.removeprefix("schedule.")
    if sub in CRON_SUBFIELDS:
        return f"schedule.specs[{i}].cron", f"{sub}: {exc.problem}"
    return f"schedule.specs[{i}].{sub}", exc.problem


def renamed(i: int, exc: RecurrenceError) -> RecurrenceError:
    field, problem = member_field(i, exc)
    cls = NoMatchError if isinstance(exc, NoMatchError) else RecurrenceError
    return cls(field.removeprefix("schedule."), problem)


def earliest(keys: Sequence[Any]) -> tuple[int, ...]:
    """The indexes holding the smallest of ``keys`` (None entries ignored; () when all are None)."""
    best: Any = None
    idx: list[int] = []
    for i, k in enumerate(keys):
        if k is None:
            continue
        if best is None or k < best:
            best, idx = k, [i]
        elif k == best:
            idx.append(i)
    return tuple(idx)


def union_next_fn(fns: Sequence[Callable[[int], int | None]], nb: int | None,
                  na: int | None) -> Callable[[int], int | None]:
    """The union's next instant in µs from its members' next-instant functions (the minimum; None
    when all are exhausted), bounded by the window ``[nb, na]`` (µs, None: open)."""
    members = tuple(fns)

    def union(after_us: int) -> int | None:
        if nb is not None and after_us < nb:
            after_us = nb - 1
        best: int | None = None
        for i, f in enumerate(members):
            try:
                t = f(after_us)
            except RecurrenceError as exc:
                raise renamed(i, exc) from None
            if t is not None and (best is None or t < best):
                best = t
        return None if best is None or (na is not None and best > na) else best

    return union


def matched_us(fns: Sequence[Callable[[int], int | None]], instant_us: int) -> tuple[int, ...]:
    """The indexes of the members whose instants include ``instant_us`` (each one's next instant
    after ``instant_us - 1`` is ``instant_us``). A member that raises counts as not matching."""
    out = []
    for i, f in enumerate(fns):
        try:
            if f(instant_us - 1) == instant_us:
                out.append(i)
        except RecurrenceError:
            continue
    return tuple(out)


def format_specs(idx: Sequence[int]) -> str | None:
    """The stored form of a fire's matched specs: ``"0,2"`` (None for none)."""
    return ",".join(str(i) for i in idx) if idx else None


def parse_specs(text: str | None) -> list[int] | None:
    """:func:`format_specs` read back (None stays None; a malformed value reads as None)."""
    if not text:
        return None
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        return None


__all__ = ["CRON_SUBFIELDS", "MAX_SPECS", "earliest", "format_specs", "matched_us", "member_field", "parse_specs",
           "renamed", "union_next_fn"]
