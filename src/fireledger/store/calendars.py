"""The registry area's exclusion calendars (decision 0156): per tenant, named, audited.

Every write appends its audit row (``calendar.create`` / ``calendar.update`` / ``calendar.delete``:
actor, the entries before and after) in the same transaction. A calendar a live trigger's current
version names is not deleted: the delete reports the triggers instead, decided inside the delete's
own transaction. The store checks no entry: the caller compiled them
(:func:`fireledger.recurrence.compile_calendar`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fireledger.domain.calendar_records import CalendarRecord
from fireledger.domain.trust_records import AuditNote

from . import queries
from .core import AppendAudit, expect_one
from .engine import Engine

_COLS = "tenant_id, name, entries, revision, created_us, updated_us"

CALENDAR_QUERIES: dict[str, str] = {
    "cal_insert": (
        f"INSERT INTO calendars ({_COLS}) VALUES (:tenant_id, :name, :entries, 1, :now_us, :now_us) "
        "ON CONFLICT DO NOTHING"
    ),
    "cal_get": f"SELECT {_COLS} FROM calendars WHERE tenant_id = :tenant_id AND name = :name",
    "cal_list": (
        f"SELECT {_COLS} FROM calendars WHERE tenant_id = :tenant_id AND name > :after ORDER BY name LIMIT :limit"
    ),
    "cal_update": (
        "UPDATE calendars SET entries = :entries, revision = revision + 1, updated_us = :now_us "
        "WHERE tenant_id = :tenant_id AND name = :name AND revision = :revision"
    ),
    "cal_delete": "DELETE FROM calendars WHERE tenant_id = :tenant_id AND name = :name",
    # Live triggers whose current version names any calendar (the name itself is matched in Python:
    # the schedule is JSON text on both engines).
    "cal_users": (
        "SELECT t.id, v.schedule FROM triggers t JOIN trigger_versions v ON v.trigger_id = t.id "
        "AND v.version = t.current_version WHERE t.tenant_id = :tenant_id AND t.state <> 'deleted' "
        "AND v.schedule LIKE :pattern ORDER BY t.id"
    ),
}

queries.register(CALENDAR_QUERIES)


def _record(row: Sequence[Any]) -> CalendarRecord:
    return CalendarRecord(str(row[0]), str(row[1]), json.loads(row[2]), int(row[3]), int(row[4]), int(row[5]))


def _names(schedule_text: str) -> list[str]:
    try:
        cals = json.loads(schedule_text).get("calendars") or []
    except (ValueError, AttributeError):
        return []
    return [c for c in cals if isinstance(c, str)]


class RegistryCalendars:
    """Calendar methods of :class:`~fireledger.store.registry.SqlRegistry` (module docstring)."""

    engine: Engine
    q: dict[str, str]
    _audit: AppendAudit

    def create_calendar(self, cal: CalendarRecord, actor: str) -> bool:
        """Insert ``cal`` (revision 1, created and updated at ``cal.created_us``) and its
        ``calendar.create`` audit row in one transaction; False, nothing written, when the tenant has a
        calendar of that name."""
        with self.engine.write() as c:
            n = c.execute(self.q["cal_insert"], {"tenant_id": cal.tenant_id, "name": cal.name,
                                                 "entries": json.dumps(cal.entries, sort_keys=True),
                                                 "now_us": cal.created_us}).rowcount
            if not expect_one(n, "cal_insert"):
                return False
            self._audit(c, AuditNote(cal.tenant_id, actor, "calendar.create", cal.created_us, None,
                                     {"name": cal.name, "entries": cal.entries}))
        return True

    def get_calendar(self, tenant_id: str, name: str) -> CalendarRecord | None:
        """The tenant's calendar of that name, or None (also for another tenant's)."""
        with self.engine.read() as c:
            row = c.execute(self.q["cal_get"], {"tenant_id": tenant_id, "name": name}).fetchone()
        return _record(row) if row else None

    def list_calendars(self, tenant_id: str, after: str = "", limit: int = 100) -> list[CalendarRecord]:
        """A page of the tenant's calendars by name, after ``after``."""
        with self.engine.read() as c:
            rows = c.execute(self.q["cal_list"], {"tenant_id": tenant_id, "after": after, "limit": limit}).fetchall()
        return [_record(r) for r in rows]

    def calendars_of(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], CalendarRecord]:
        """The calendars named by ``(tenant_id, name)`` pairs, keyed so (absent ones are missing), read
        in one transaction (the timing plane's read for a batch)."""
        out: dict[tuple[str, str], CalendarRecord] = {}
        if not keys:
            return out
        with self.engine.read() as c:
            for tenant_id, name in sorted(set(keys)):
                row = c.execute(self.q["cal_get"], {"tenant_id": tenant_id, "name": name}).fetchone()
                if row:
                    out[(tenant_id, name)] = _record(row)
        return out

    def replace_calendar(self, tenant_id: str, name: str, entries: list[dict[str, Any]], actor: str,
                         now_us: int, *, expected_revision: int | None = None) -> CalendarRecord | None:
        """Replace the entries of the tenant's calendar (revision + 1, updated at ``now_us``) and append
        its ``calendar.update`` audit row (entries before and after), in one transaction. Compare-and-set
        on ``expected_revision`` (None: the revision read inside the transaction). Returns the calendar
        as stored after the change; None, nothing written, when it is absent or its revision moved."""
        with self.engine.write() as c:
            row = c.execute(self.q["cal_get"], {"tenant_id": tenant_id, "name": name}).fetchone()
            if row is None:
                return None
            old = _record(row)
            rev = old.revision if expected_revision is None else expected_revision
            n = c.execute(self.q["cal_update"], {"tenant_id": tenant_id, "name": name, "revision": rev,
                                                 "entries": json.dumps(entries, sort_keys=True),
                                                 "now_us": now_us}).rowcount
            if not expect_one(n, "cal_update"):
                return None
            self._audit(c, AuditNote(tenant_id, actor, "calendar.update", now_us,
                                     {"name": name, "revision": old.revision, "entries": old.entries},
                                     {"name": name, "revision": old.revision + 1, "entries": entries}))
        return CalendarRecord(tenant_id, name, entries, old.revision + 1, old.created_us, now_us)

    def triggers_using_calendar(self, tenant_id: str, name: str) -> list[str]:
        """The ids of the tenant's live triggers (not deleted) whose current version names the calendar."""
        with self.engine.read() as c:
            return self._users(c, tenant_id, name)

    def _users(self, c: Any, tenant_id: str, name: str) -> list[str]:
        rows = c.execute(self.q["cal_users"], {"tenant_id": tenant_id, "pattern": '%"calendars"%'}).fetchall()
        return [str(r[0]) for r in rows if name in _names(str(r[1]))]

    def delete_calendar(self, tenant_id: str, name: str, actor: str, now_us: int) -> list[str] | None:
        """Delete the tenant's calendar and append its ``calendar.delete`` audit row, in one
        transaction — unless a live trigger's current version names it: then nothing is written and
        the ids of those triggers are returned. Returns ``[]`` when deleted, None when absent."""
        with self.engine.write() as c:
            row = c.execute(self.q["cal_get"], {"tenant_id": tenant_id, "name": name}).fetchone()
            if row is None:
                return None
            users = self._users(c, tenant_id, name)
            if users:
                return users
            expect_one(c.execute(self.q["cal_delete"], {"tenant_id": tenant_id, "name": name}).rowcount,
                       "cal_delete")
            old = _record(row)
            self._audit(c, AuditNote(tenant_id, actor, "calendar.delete", now_us,
                                     {"name": name, "revision": old.revision, "entries": old.entries}, None))
        return []


__all__ = ["CALENDAR_QUERIES", "RegistryCalendars"]
