"""What the timing plane adds to a plan of a schedule with several specs or exclusion calendars.

* **Several specs** (decision 0155): every fire of a union records which specs produced its instant
  (``specs``: their indexes in ``schedule.specs``).
* **Exclusion calendars** (decision 0156): a fire the plan would dispatch (``pending``) whose instant
  a calendar the schedule names excludes is recorded ``skipped`` instead, its cause naming the
  calendar and the entry — never delivered, and still in the history. Expired and policy-skipped
  records keep their own cause. Calendars are read from the store for every batch that needs them,
  so a calendar changed after a fire was decided changes no decided fire, only the decisions after
  it (decision 0157).

A schedule that names a calendar the tenant does not have (deleted by a race with the trigger's
creation, decision 0156) cannot be planned: :class:`MissingCalendar` makes the row a failure, its
instant recorded ``failed`` and the trigger paused with the cause (decision 0087).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from fireledger.domain.keys import from_us
from fireledger.domain.model import Decision, FireState, NewFire
from fireledger.errors import FireledgerError
from fireledger.recurrence import Calendar, compile_calendar, excluded, exclusion_cause, format_specs
from fireledger.store import Store

Matched = Callable[[int], tuple[int, ...]]
#: One batch's calendar reads, by (tenant, the names a schedule lists).
BatchCalendars = dict[tuple[str, tuple[str, ...]], dict[tuple[str, str], Calendar]]


class MissingCalendar(FireledgerError, LookupError):
    """A schedule names a calendar its tenant does not have."""


class CalendarCache:
    """Compiled calendars by (tenant, name, revision): the store is read for every batch that needs
    them (so changes are seen at the next decision), compiling only new revisions."""

    def __init__(self, store: Store, limit: int = 10_000) -> None:
        self.store = store
        self.limit = limit
        self._compiled: dict[tuple[str, str, int], Calendar] = {}

    def read(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Calendar]:
        """The compiled calendars of ``(tenant_id, name)`` pairs in one store read (absent ones are
        missing from the result). Store failures propagate; a stored calendar that no longer
        compiles raises its ``RecurrenceError``."""
        out: dict[tuple[str, str], Calendar] = {}
        for key, rec in self.store.registry.calendars_of(wanted).items():
            ck = (key[0], key[1], rec.revision)
            cal = self._compiled.get(ck)
            if cal is None:
                if len(self._compiled) >= self.limit:
                    self._compiled.clear()
                cal = self._compiled[ck] = compile_calendar(rec.name, rec.entries)
            out[key] = cal
        return out


def calendars_for(tenant_id: str, names: Sequence[str], read: dict[tuple[str, str], Calendar]) -> list[Calendar]:
    """The calendars a schedule names, in its order, from a batch's read; :class:`MissingCalendar`
    when one is absent."""
    out = []
    for n in names:
        cal = read.get((tenant_id, n))
        if cal is None:
            raise MissingCalendar(f"the schedule names calendar {n!r}, which this tenant does not have; create it "
                                  "or amend the trigger")
        out.append(cal)
    return out


def exclude_fire(f: NewFire, calendars: Sequence[Calendar]) -> NewFire:
    """``f`` recorded ``skipped`` with the excluding calendar entry as its cause when it is ``pending``
    and a calendar excludes its instant; else ``f`` unchanged."""
    if f.state is not FireState.PENDING or not calendars:
        return f
    hit = excluded(calendars, from_us(f.scheduled_us))
    if hit is None:
        return f
    return replace(f, state=FireState.SKIPPED, cause=exclusion_cause(*hit), not_before_us=None)


def annotate(d: Decision, matched: Matched | None, calendars: Sequence[Calendar]) -> Decision:
    """The decision with each fire's matched specs recorded and calendar exclusions applied."""
    if matched is None and not calendars:
        return d
    fires = []
    for f in d.fires:
        if matched is not None:
            f = replace(f, specs=format_specs(matched(f.scheduled_us)))
        fires.append(exclude_fire(f, calendars))
    return replace(d, fires=tuple(fires))


__all__ = ["BatchCalendars", "CalendarCache", "Matched", "MissingCalendar", "annotate", "calendars_for", "exclude_fire"]
