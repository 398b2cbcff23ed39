"""The stored form of an exclusion calendar (decision 0156); its meaning is
:mod:`fireledger.recurrence.calendar`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CalendarRecord:
    """A tenant's named exclusion calendar as stored: ``entries`` in the API's form (a list of
    objects), ``revision`` 1 at creation and one more per replacement."""

    tenant_id: str
    name: str
    entries: list[dict[str, Any]]
    revision: int
    created_us: int
    updated_us: int


__all__ = ["CalendarRecord"]
