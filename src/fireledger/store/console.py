"""The web console's state and page queries (a :class:`~fireledger.store.SqlStore` mixin).

Contracts:

* **Sessions** (migration 0008, decision 0084). A console session is a row of ``console_sessions``
  keyed by the SHA-256 of a random session id (the cookie holds the id, never a bearer token). It
  is live while ``now < expires_us``, its principal is not revoked and its tenant is not deleted —
  checked by one join on every page, so revocation and tenant deletion end every session at once in
  every process. :meth:`ConsoleMixin.end_console_session` deletes it (sign out). Creating a session
  deletes expired rows and keeps at most :data:`SESSIONS_PER_PRINCIPAL` live sessions per principal
  (the oldest go): a principal that signs in in a loop cannot grow the table.
* **Page queries** read a bounded page in a fixed number of statements, whatever the number of
  triggers: the triggers with their current versions in one statement
  (:meth:`ConsoleMixin.console_triggers`), the last ``n`` fire states of each in one more
  (:meth:`ConsoleMixin.console_recent_states`). Payloads are never selected.
* Every method takes ``now_us`` from its caller; nothing here reads a clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fireledger.domain.model import Principal, Trigger, TriggerVersion

from . import queries

#: Live console sessions kept per principal; signing in once more ends the oldest.
SESSIONS_PER_PRINCIPAL = 20
_LOW = -(2**62)

CONSOLE_QUERIES: dict[str, str] = {
    "console_session_insert": (
        "INSERT INTO console_sessions (id_hash, tenant_id, principal_id, created_us, expires_us) "
        "VALUES (:id_hash, :tenant_id, :principal_id, :created_us, :expires_us)"
    ),
    "console_session_expired": "DELETE FROM console_sessions WHERE expires_us <= :now_us",
    "console_session_trim": (
        "DELETE FROM console_sessions WHERE principal_id = :principal_id AND id_hash NOT IN ("
        "SELECT id_hash FROM console_sessions WHERE principal_id = :principal_id "
        "ORDER BY created_us DESC, id_hash LIMIT :keep)"
    ),
    "console_session_get": (
        "SELECT p.id, p.tenant_id, p.name, p.roles, p.created_us, p.revoked_us FROM console_sessions s "
        "JOIN principals p ON p.id = s.principal_id JOIN tenants t ON t.id = p.tenant_id "
        "WHERE s.id_hash = :id_hash AND s.expires_us > :now_us AND p.revoked_us IS NULL "
        "AND t.deleted_us IS NULL"
    ),
    "console_session_delete": "DELETE FROM console_sessions WHERE id_hash = :id_hash",
    "console_triggers": (
        f"SELECT {queries.TRIGGER_COLS}, v.schedule, v.target_id, v.policies, v.tzdata_version, v.created_us "
        "FROM triggers t LEFT JOIN due d ON d.trigger_id = t.id "
        "LEFT JOIN trigger_versions v ON v.trigger_id = t.id AND v.version = t.current_version "
        "WHERE t.tenant_id = :tenant_id AND t.state <> 'deleted' ORDER BY t.id LIMIT :limit"
    ),
    # The last n fires of each of the page's triggers: fires at or after the n-th most recent
    # instant (one index probe per trigger), trimmed to n in Python where instants tie.
    "console_recent_states": (
        "SELECT f.trigger_id, f.state, f.scheduled_us, f.seq FROM ("
        "  SELECT id FROM triggers WHERE tenant_id = :tenant_id AND state <> 'deleted' "
        "  ORDER BY id LIMIT :limit) t "
        "JOIN fires f ON f.tenant_id = :tenant_id AND f.trigger_id = t.id AND f.scheduled_us < :hi "
        "AND f.scheduled_us >= COALESCE((SELECT g.scheduled_us FROM fires g WHERE g.tenant_id = :tenant_id "
        "  AND g.trigger_id = t.id AND g.scheduled_us < :hi ORDER BY g.scheduled_us DESC, g.seq DESC "
        "  LIMIT 1 OFFSET :skip), :low)"
    ),
}
queries.register(CONSOLE_QUERIES)


def _principal(row: Sequence[Any]) -> Principal:
    return Principal(row[0], row[1], row[2], frozenset(filter(None, str(row[3]).split(","))), row[4], row[5])


class ConsoleMixin:
    """Console sessions and page queries (see the module docstring)."""

    engine: Any
    q: dict[str, str]

    # --- sessions ---------------------------------------------------------------------------------

    def create_console_session(self, id_hash: str, principal: Principal, now_us: int, expires_us: int) -> None:
        """Store a session (by the hash of its id) for ``principal`` until ``expires_us``; drop
        expired sessions and the principal's oldest beyond :data:`SESSIONS_PER_PRINCIPAL`."""
        with self.engine.write() as c:
            c.execute(self.q["console_session_expired"], {"now_us": now_us})
            c.execute(self.q["console_session_insert"], {
                "id_hash": id_hash, "tenant_id": principal.tenant_id, "principal_id": principal.id,
                "created_us": now_us, "expires_us": expires_us})
            c.execute(self.q["console_session_trim"], {"principal_id": principal.id,
                                                       "keep": SESSIONS_PER_PRINCIPAL})

    def console_session(self, id_hash: str, now_us: int) -> Principal | None:
        """The principal of a live session (unexpired, principal not revoked, tenant not deleted)."""
        with self.engine.read() as c:
            row = c.execute(self.q["console_session_get"], {"id_hash": id_hash, "now_us": now_us}).fetchone()
        return _principal(row) if row else None

    def end_console_session(self, id_hash: str) -> bool:
        """Delete a session (sign out); False when there was none."""
        with self.engine.write() as c:
            return int(c.execute(self.q["console_session_delete"], {"id_hash": id_hash}).rowcount) > 0

    # --- page queries -------------------------------------------------------------------------------

    def console_triggers(self, tenant_id: str, limit: int) -> list[tuple[Trigger, TriggerVersion | None]]:
        """The tenant's live triggers by id (at most ``limit``), each with its current version
        (its payload left out: ``b""``), in one statement."""
        from .sql_store import _trigger, policies_from_json

        with self.engine.read() as c:
            rows = c.execute(self.q["console_triggers"], {"tenant_id": tenant_id, "limit": limit}).fetchall()
        out: list[tuple[Trigger, TriggerVersion | None]] = []
        for r in rows:
            t = _trigger(r[:9])
            v = None
            if r[9] is not None:
                v = TriggerVersion(t.id, t.current_version, t.tenant_id, json.loads(r[9]), r[10], b"",
                                   policies_from_json(r[11]), r[12], int(r[13]))
            out.append((t, v))
        return out

    def console_recent_states(self, tenant_id: str, limit: int, n: int, before_us: int) -> dict[str, list[str]]:
        """For the tenant's first ``limit`` live triggers by id: the states of each one's last ``n``
        fires scheduled before ``before_us``, newest first, in one statement (triggers without
        fires are absent)."""
        if n <= 0:
            return {}
        with self.engine.read() as c:
            rows = c.execute(self.q["console_recent_states"], {
                "tenant_id": tenant_id, "limit": limit, "hi": before_us, "skip": n - 1, "low": _LOW}).fetchall()
        grouped: dict[str, list[tuple[int, int, str]]] = {}
        for trigger_id, state, scheduled_us, seq in rows:
            grouped.setdefault(str(trigger_id), []).append((int(scheduled_us), int(seq), str(state)))
        return {tid: [s for _, _, s in sorted(items, reverse=True)[:n]] for tid, items in grouped.items()}


__all__ = ["CONSOLE_QUERIES", "SESSIONS_PER_PRINCIPAL", "ConsoleMixin"]
