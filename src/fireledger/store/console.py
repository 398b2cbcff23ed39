"""The web console's state and page queries (SQL text; sessions in the trust area, pages in the history area).

Contracts:

* **Sessions** (migration 0008, decision 0084). A console session is a row of ``console_sessions``
  keyed by the SHA-256 of a random session id (the cookie holds the id, never a bearer token). It
  is live while ``now < expires_us``, its principal is not revoked and its tenant is not deleted —
  checked by one join on every page, so revocation and tenant deletion end every session at once in
  every process. :meth:`SqlTrust.end_console_session` deletes it (sign out). Creating a session
  deletes expired rows and keeps at most :data:`SESSIONS_PER_PRINCIPAL` live sessions per principal
  (the oldest go): a principal that signs in in a loop cannot grow the table.
* **Page queries** read a bounded page in a fixed number of statements, whatever the number of
  triggers: the triggers with their current versions in one statement
  (:meth:`SqlHistory.console_triggers`), the last ``n`` fire states of each in one more
  (:meth:`SqlHistory.console_recent_states`). Payloads are never selected.
* Every method takes ``now_us`` from its caller; nothing here reads a clock.
"""

from __future__ import annotations

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
        "JOIN fires f INDEXED BY fires_by_trigger ON f.tenant_id = :tenant_id AND f.trigger_id = t.id "
        "AND f.scheduled_us < :hi AND f.scheduled_us >= COALESCE((SELECT g.scheduled_us "
        "  FROM fires g INDEXED BY fires_by_trigger WHERE g.tenant_id = :tenant_id "
        "  AND g.trigger_id = t.id AND g.scheduled_us < :hi ORDER BY g.scheduled_us DESC, g.seq DESC "
        "  LIMIT 1 OFFSET :skip), :low)"
    ),
}
queries.register(CONSOLE_QUERIES)


__all__ = ["CONSOLE_QUERIES", "SESSIONS_PER_PRINCIPAL"]
