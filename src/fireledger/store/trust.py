"""The trust area: the hash-chained audit, principals of a tenant, tenant data keys, console
sessions, target ownership verification, tenant deletion and purge.

Contracts:

* **Audit is append-only and chained under a key.** Each row carries ``prev_hash`` (the previous
  row's ``hash``; 64 zeros before the first) and ``hash = HMAC-SHA256(audit key, canonical JSON of
  [seq, tenant_id, actor, action, at_us, prior, new, prev_hash])`` (:func:`chain_mac`). The audit key
  is derived from the deployment's KEK (label :data:`AUDIT_KEY_LABEL`), which lives in a file or the
  environment, never in the database: a database writer cannot recompute the chain. Rows written
  before migration 0011 carry the old unkeyed SHA-256 (:func:`chain_hash`); migration 0011 seals
  them with one keyed ``audit.seal`` row naming their count and head hash (decision 0090).
  ``audit_head`` (one row) holds the last seq and hash: it anchors the chain's tail and serialises
  appends (``FOR UPDATE`` on PostgreSQL; SQLite write transactions are exclusive). Database triggers
  refuse UPDATE/DELETE on ``audit`` (migration 0004), and since 0011 refuse an insert that is not at
  the head, a head that does not advance by one, and deleting the head.
  ``prior``/``new`` are canonical JSON text and never carry payloads, secrets or tokens.
* **A privileged act and its audit row commit together**: where this area performs the act
  (principals, verification, tenant creation and deletion) and where another area does (the
  registry's definition changes, the timing area's manual fires, the dispatch area's quota changes:
  they are handed :meth:`SqlTrust.append_in` at composition, ``fireledger.store.root``).
* **Tenant deletion** destroys the tenant's wrapped data key at once (its payloads become
  unreadable), revokes its principals, stops its triggers and skips its live fires — one
  transaction. :meth:`SqlTrust.purge_deleted_tenants` later deletes definitions, payloads and
  history (one transaction per trigger, then one for the rest), keeping per-day fire counts.
* Every method takes ``now_us`` from its caller; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fireledger.domain.model import Principal, Tenant
from fireledger.domain.trust_records import (
    SEAL_ACTION,
    AuditEntry,
    AuditNote,
    canonical,
    chain_mac,
)

from . import queries
from . import rows as rec
from .console import SESSIONS_PER_PRINCIPAL
from .core import Area
from .engine import Engine, StoreError
from .verifications import TargetVerifications

#: A trigger's fires (decision 0210: the table is keyed by tenant and instant).
_BY_TRIGGER = "fires INDEXED BY fires_by_trigger"

#: The migration that keys the chain; applying it seals any unkeyed rows (:meth:`SqlTrust.seal_legacy_audit`).
AUDIT_KEYED_MIGRATION = 11
DAY_US = 86_400_000_000
#: Tables a purge keeps (``tenants`` is scrubbed, not deleted) or handles itself, in this order.
_KEPT_TABLES = frozenset({"tenants", "audit", "audit_head", "fire_counts", "schema_migrations"})
_PURGE_ORDER = ("attempts", "work_outcomes", "fires", "due", "trigger_versions", "triggers", "targets",
                "principals")

TRUST_QUERIES: dict[str, str] = {
    # --- audit ----------------------------------------------------------------------------------
    "audit_head_lock": "SELECT seq, hash FROM audit_head WHERE id = 1",
    "audit_head": "SELECT seq, hash FROM audit_head WHERE id = 1",
    "audit_insert": (
        "INSERT INTO audit (seq, tenant_id, actor, action, at_us, prior, new, prev_hash, hash) "
        "VALUES (:seq, :tenant_id, :actor, :action, :at_us, :prior, :new, :prev_hash, :hash)"
    ),
    "audit_head_set": "UPDATE audit_head SET seq = :seq, hash = :hash WHERE id = 1",
    "audit_rows": (
        "SELECT seq, tenant_id, actor, action, at_us, prior, new, prev_hash, hash FROM audit "
        "WHERE seq > :after ORDER BY seq LIMIT :limit"
    ),
    "audit_rows_of_tenant": (
        "SELECT seq, tenant_id, actor, action, at_us, prior, new, prev_hash, hash FROM audit "
        "WHERE tenant_id = :tenant_id AND seq > :after ORDER BY seq LIMIT :limit"
    ),
    # --- principals -----------------------------------------------------------------------------
    "trust_list_principals": (
        "SELECT id, tenant_id, name, roles, created_us, revoked_us FROM principals "
        "WHERE tenant_id = :tenant_id AND id > :after ORDER BY id LIMIT :limit"
    ),
    "trust_get_principal": (
        "SELECT id, tenant_id, name, roles, created_us, revoked_us FROM principals "
        "WHERE tenant_id = :tenant_id AND id = :id"
    ),
    "trust_count_principals": "SELECT COUNT(*) FROM principals WHERE tenant_id = :tenant_id",
    "trust_live_admins": (
        "SELECT id, roles FROM principals WHERE tenant_id = :tenant_id AND revoked_us IS NULL"
    ),
    "trust_revoke_principal": (
        "UPDATE principals SET revoked_us = :now_us WHERE tenant_id = :tenant_id AND id = :id "
        "AND revoked_us IS NULL"
    ),
    # --- targets --------------------------------------------------------------------------------
    "trust_count_targets": "SELECT COUNT(*) FROM targets WHERE tenant_id = :tenant_id AND deleted_us IS NULL",
    # --- triggers -------------------------------------------------------------------------------
    "trust_count_live_triggers": (
        "SELECT COUNT(*) FROM triggers WHERE tenant_id = :tenant_id AND state <> 'deleted'"
    ),
    # --- tenant keys ----------------------------------------------------------------------------
    "trust_tenant_key": "SELECT deleted_us, wrapped_key FROM tenants WHERE id = :id",
    "trust_install_key": (
        "UPDATE tenants SET wrapped_key = :wrapped WHERE id = :id AND wrapped_key IS NULL "
        "AND deleted_us IS NULL"
    ),
    # --- tenant deletion ------------------------------------------------------------------------
    "trust_tenant_row": "SELECT id, name, created_us, deleted_us, purged_us FROM tenants WHERE id = :id",
    "trust_tenant_by_name": "SELECT id FROM tenants WHERE name = :name",
    "trust_delete_tenant": (
        "UPDATE tenants SET deleted_us = :now_us, wrapped_key = NULL WHERE id = :id AND deleted_us IS NULL"
    ),
    "trust_revoke_all": (
        "UPDATE principals SET revoked_us = :now_us WHERE tenant_id = :tenant_id AND revoked_us IS NULL"
    ),
    "trust_delete_due_of_tenant": "DELETE FROM due WHERE tenant_id = :tenant_id",
    "trust_stop_triggers": (
        "UPDATE triggers SET state = 'deleted', updated_us = :now_us WHERE tenant_id = :tenant_id "
        "AND state <> 'deleted'"
    ),
    "trust_skip_live_fires": (
        "UPDATE fires SET state = 'skipped', cause = :cause, finished_us = :now_us, next_attempt_us = NULL, "
        "lease_owner = NULL WHERE tenant_id = :tenant_id AND state IN ('pending', 'dispatching', 'held')"
    ),
    "trust_count_tenant_triggers": "SELECT COUNT(*) FROM triggers WHERE tenant_id = :tenant_id",
    # --- purge ----------------------------------------------------------------------------------
    "trust_tenants_to_purge": (
        "SELECT id FROM tenants WHERE deleted_us IS NOT NULL AND deleted_us <= :cutoff_us "
        "AND purged_us IS NULL ORDER BY deleted_us, id LIMIT :limit"
    ),
    "trust_triggers_of_tenant": "SELECT id FROM triggers WHERE tenant_id = :tenant_id ORDER BY id",
    "trust_count_fires_into": (
        "INSERT INTO fire_counts (tenant_id, day, state, n) "
        "SELECT tenant_id, scheduled_us / 86400000000, state, COUNT(*) FROM fires INDEXED BY fires_by_trigger "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "GROUP BY tenant_id, scheduled_us / 86400000000, state "
        "ON CONFLICT (tenant_id, day, state) DO UPDATE SET n = fire_counts.n + excluded.n"
    ),
    # Attempts are keyed by tenant and instant (decision 0210): a trigger's are found through its fires
    # (purged after them), never by walking the tenant's attempts.
    "trust_purge_attempts": (
        "DELETE FROM attempts WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us IN ("
        f"SELECT scheduled_us FROM {_BY_TRIGGER} WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id)"
    ),
    "trust_purge_outcomes": (
        "DELETE FROM work_outcomes WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id"
    ),
    "trust_purge_fires": f"DELETE FROM {_BY_TRIGGER} WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id",
    "trust_scrub_tenant": (
        "UPDATE tenants SET name = id, wrapped_key = NULL, purged_us = :now_us WHERE id = :id"
    ),
    "trust_fire_counts": (
        "SELECT day, state, n FROM fire_counts WHERE tenant_id = :tenant_id ORDER BY day, state"
    ),
    "trust_tenant_tables_sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
}

_OVERRIDES: dict[str, dict[str, str]] = {
    "postgres": {
        "audit_head_lock": "SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE",
        "trust_tenant_tables_sqlite": (
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'tenant_id' "
            "AND table_schema = current_schema() ORDER BY table_name"
        ),
    },
}

queries.register(TRUST_QUERIES, _OVERRIDES)


#: Finds the audit chain's key for a trust area: ``(area, upgrading) -> key``. ``upgrading`` is True
#: inside migration 0011 (the key must exist already: an upgrade never creates a KEK).
AuditKeySource = Callable[["SqlTrust", bool], bytes]
_KEY_SOURCES: list[AuditKeySource] = []


def install_audit_key_source(source: AuditKeySource) -> None:
    """Install how a trust area without a key set finds one (``fireledger.security`` installs the
    KEK-derived key when imported: the key lives outside the store, the store only uses it)."""
    _KEY_SOURCES[:] = [source]


def _key_source() -> AuditKeySource:
    if not _KEY_SOURCES:
        raise StoreError("the audit chain has no key: import fireledger.security (it derives the key from "
                         "the key-encryption key) or call set_audit_key")
    return _KEY_SOURCES[0]


class SqlTrust(TargetVerifications, Area):
    """Audit, principals, verification (:class:`~.verifications.TargetVerifications`), tenant keys,
    console sessions, deletion and purge (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._audit_key: bytes | None = None

    @property
    def audit_key(self) -> bytes:
        """The audit chain's key: set by :meth:`set_audit_key`, else asked of the installed key source
        (:func:`install_audit_key_source`: ``fireledger.security`` derives it from the deployment's
        KEK and raises ``KekError`` when there is none — an audited act then fails rather than
        writing a row a database writer could forge). The store itself never reads a KEK."""
        key = self._audit_key
        if key is None:
            key = self._audit_key = _key_source()(self, False)
        return key

    def set_audit_key(self, key: bytes) -> None:
        """Use ``key`` (32+ bytes) for the audit chain instead of the KEK-derived one."""
        if len(key) < 32:
            raise ValueError("key: the audit key must be at least 32 bytes")
        self._audit_key = key

    def _append_audit(self, c: Any, tenant_id: str | None, actor: str, action: str, at_us: int,
                      prior: Any = None, new: Any = None) -> AuditEntry:
        """Append one row inside the caller's write transaction (the head row is locked first)."""
        key = self.audit_key   # before the lock: a missing KEK fails without holding the head
        seq, prev = c.execute(self.q["audit_head_lock"]).fetchone()
        seq = int(seq) + 1
        p, n = canonical(prior), canonical(new)
        h = chain_mac(key, seq, tenant_id, actor, action, at_us, p, n, prev)
        c.execute(self.q["audit_insert"], {"seq": seq, "tenant_id": tenant_id, "actor": actor,
                                           "action": action, "at_us": at_us, "prior": p, "new": n,
                                           "prev_hash": prev, "hash": h})
        c.execute(self.q["audit_head_set"], {"seq": seq, "hash": h})
        return AuditEntry(seq, tenant_id, actor, action, at_us, p, n, prev, h)

    def seal_legacy_audit(self, c: Any, now_us: int) -> AuditEntry | None:
        """Inside the transaction applying migration 0011: when unkeyed rows exist, append the keyed
        ``audit.seal`` row naming their count and the head hash (its ``prev_hash``), so they can no
        longer be rewritten without the key. ``at_us`` is ``now_us``, or the last sealed row's instant
        when the caller gives none. None when the chain is empty (nothing to seal).

        The KEK must already exist here (it is never created by an upgrade: a new key would seal the
        old rows under a key the rest of the deployment does not hold); without one this raises
        ``KekError`` and the migration's transaction, 0011 included, is rolled back."""
        seq, prev = c.execute(self.q["audit_head_lock"]).fetchone()
        if int(seq) == 0:
            return None
        if self._audit_key is None:
            self._audit_key = _key_source()(self, True)
        last = c.execute(self.q["audit_rows"], {"after": int(seq) - 1, "limit": 1}).fetchone()
        at_us = now_us or (int(last[4]) if last is not None else 0)
        return self._append_audit(c, None, "system:upgrade", SEAL_ACTION, at_us, None,
                                  {"sealed_rows": int(seq), "sealed_hash": str(prev), "scheme": "hmac-sha256"})

    def append_in(self, c: Any, note: AuditNote) -> AuditEntry:
        """Append ``note`` inside the caller's open write transaction ``c`` and return the row: the
        function other areas are handed at composition, so an audited act and its audit row commit
        together (rolled back with it). Locks the chain's head row until ``c`` commits."""
        return self._append_audit(c, note.tenant_id, note.actor, note.action, note.at_us, note.prior, note.new)

    def append_audit(self, tenant_id: str | None, actor: str, action: str, at_us: int,
                     prior: Any = None, new: Any = None) -> AuditEntry:
        """Append one audit row in its own transaction and return it."""
        with self.engine.write() as c:
            return self._append_audit(c, tenant_id, actor, action, at_us, prior, new)

    def audit_rows(self, after_seq: int = 0, limit: int = 1000, tenant_id: str | None = None) -> list[AuditEntry]:
        """Audit rows with ``seq > after_seq`` in seq order (one tenant's, or all)."""
        with self.engine.read() as c:
            if tenant_id is None:
                rows = c.execute(self.q["audit_rows"], {"after": after_seq, "limit": limit}).fetchall()
            else:
                rows = c.execute(self.q["audit_rows_of_tenant"],
                                 {"tenant_id": tenant_id, "after": after_seq, "limit": limit}).fetchall()
        return [rec.audit(r) for r in rows]

    def audit_head(self) -> tuple[int, str]:
        """``(last seq, its hash)`` as recorded by the chain's head row."""
        with self.engine.read() as c:
            seq, h = c.execute(self.q["audit_head"]).fetchone()
        return int(seq), str(h)

    def create_tenant_audited(self, tenant: Tenant, principal: Principal, token_hash: str, actor: str) -> None:
        """Create a tenant with its first principal and audit it, in one transaction."""
        with self.engine.write() as c:
            c.execute(self.q["insert_tenant"], {"id": tenant.id, "name": tenant.name,
                                                "created_us": tenant.created_us})
            c.execute(self.q["insert_principal"], rec.principal_params(principal, token_hash))
            self._append_audit(c, tenant.id, actor, "tenant.create", tenant.created_us, None,
                               {"tenant_id": tenant.id, "principal_id": principal.id,
                                "roles": sorted(principal.roles)})

    def create_principal_audited(self, principal: Principal, token_hash: str, actor: str) -> None:
        """Insert a principal (its token only as a hash) and audit the grant, in one transaction."""
        with self.engine.write() as c:
            c.execute(self.q["insert_principal"], rec.principal_params(principal, token_hash))
            self._append_audit(c, principal.tenant_id, actor, "principal.create", principal.created_us, None,
                               {"principal_id": principal.id, "name": principal.name,
                                "roles": sorted(principal.roles)})

    def list_principals(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Principal]:
        """The tenant's principals (revoked ones too), by id."""
        with self.engine.read() as c:
            rows = c.execute(self.q["trust_list_principals"],
                             {"tenant_id": tenant_id, "after": after, "limit": limit}).fetchall()
        return [rec.principal(r) for r in rows]

    def get_principal(self, tenant_id: str, principal_id: str) -> Principal | None:
        """The tenant's principal (revoked ones too), or None — also for another tenant's."""
        with self.engine.read() as c:
            row = c.execute(self.q["trust_get_principal"], {"tenant_id": tenant_id, "id": principal_id}).fetchone()
        return rec.principal(row) if row else None

    def count_principals(self, tenant_id: str) -> int:
        """How many principals the tenant has (revoked ones too)."""
        with self.engine.read() as c:
            return int(c.execute(self.q["trust_count_principals"], {"tenant_id": tenant_id}).fetchone()[0])

    def revoke_principal(self, tenant_id: str, principal_id: str, actor: str, now_us: int) -> str:
        """Revoke a principal's token and audit it. Returns ``revoked``, ``absent`` (no such live
        principal of this tenant) or ``last-admin`` (refused: the tenant would have no admin left)."""
        with self.engine.write() as c:
            row = c.execute(self.q["trust_get_principal"], {"tenant_id": tenant_id, "id": principal_id}).fetchone()
            if row is None or row[5] is not None:
                return "absent"
            p = rec.principal(row)
            if "admin" in p.roles:
                admins = [r[0] for r in c.execute(self.q["trust_live_admins"], {"tenant_id": tenant_id})
                          if "admin" in str(r[1]).split(",")]
                if admins == [principal_id]:
                    return "last-admin"
            n = c.execute(self.q["trust_revoke_principal"],
                          {"tenant_id": tenant_id, "id": principal_id, "now_us": now_us}).rowcount
            if n != 1:
                return "absent"
            self._append_audit(c, tenant_id, actor, "principal.revoke", now_us,
                               {"principal_id": p.id, "name": p.name, "roles": sorted(p.roles)},
                               {"principal_id": p.id, "revoked": True})
        return "revoked"

    def tenant_wrapped_key(self, tenant_id: str) -> tuple[bool, bytes | None]:
        """``(tenant is live, its wrapped data key or None)``; an unknown tenant is ``(False, None)``."""
        with self.engine.read() as c:
            row = c.execute(self.q["trust_tenant_key"], {"id": tenant_id}).fetchone()
        if row is None:
            return False, None
        return row[0] is None, None if row[1] is None else bytes(row[1])

    def install_tenant_key(self, tenant_id: str, wrapped: bytes) -> bytes | None:
        """Install ``wrapped`` as the tenant's data key unless one exists (compare-and-set); return the
        key in force afterwards (None: the tenant is deleted or unknown)."""
        with self.engine.write() as c:
            c.execute(self.q["trust_install_key"], {"id": tenant_id, "wrapped": wrapped})
            row = c.execute(self.q["trust_tenant_key"], {"id": tenant_id}).fetchone()
        if row is None or row[0] is not None or row[1] is None:
            return None
        return bytes(row[1])

    def delete_tenant(self, tenant_id: str, actor: str, now_us: int) -> dict[str, int] | None:
        """Delete a tenant at once: destroy its data key, revoke its principals, stop its triggers
        and skip its live fires (cause recorded), audited — one transaction. None when there is no
        such live tenant."""
        with self.engine.write() as c:
            if c.execute(self.q["trust_delete_tenant"], {"id": tenant_id, "now_us": now_us}).rowcount != 1:
                return None
            out = {
                "principals_revoked": c.execute(self.q["trust_revoke_all"],
                                                {"tenant_id": tenant_id, "now_us": now_us}).rowcount,
                "triggers_stopped": c.execute(self.q["trust_stop_triggers"],
                                              {"tenant_id": tenant_id, "now_us": now_us}).rowcount,
                "fires_skipped": c.execute(self.q["trust_skip_live_fires"], {
                    "tenant_id": tenant_id, "now_us": now_us,
                    "cause": "skipped: the tenant was deleted"}).rowcount,
            }
            c.execute(self.q["trust_delete_due_of_tenant"], {"tenant_id": tenant_id})
            c.execute(self.q["bump_definitions"])
            self._append_audit(c, tenant_id, actor, "tenant.delete", now_us, {"tenant_id": tenant_id},
                               {"tenant_id": tenant_id, "data_key": "destroyed", **out})
        return out

    def purge_deleted_tenants(self, cutoff_us: int, now_us: int, limit: int = 10) -> list[dict[str, Any]]:
        """Purge tenants deleted at or before ``cutoff_us``: per trigger, count its fires per day and
        state into ``fire_counts`` and delete its fires, attempts and outcomes (one transaction per
        trigger); then delete every other row of the tenant (definitions, targets, principals and
        any table with a ``tenant_id`` column except the audit and the counts) and scrub the
        tenant's name. Idempotent; returns one summary per purged tenant."""
        with self.engine.read() as c:
            ids = [str(r[0]) for r in c.execute(self.q["trust_tenants_to_purge"],
                                                {"cutoff_us": cutoff_us, "limit": limit}).fetchall()]
        done = []
        for tenant_id in ids:
            with self.engine.read() as c:
                triggers = [str(r[0]) for r in c.execute(self.q["trust_triggers_of_tenant"],
                                                         {"tenant_id": tenant_id}).fetchall()]
            fires = 0
            for trigger_id in triggers:
                key = {"tenant_id": tenant_id, "trigger_id": trigger_id}
                with self.engine.write() as c:
                    c.execute(self.q["trust_count_fires_into"], key)
                    c.execute(self.q["trust_purge_attempts"], key)
                    c.execute(self.q["trust_purge_outcomes"], key)
                    fires += c.execute(self.q["trust_purge_fires"], key).rowcount
            with self.engine.write() as c:
                tables = self.engine.tables_with_column(c, "tenant_id")
                others = [t for t in tables if t not in _KEPT_TABLES and t not in _PURGE_ORDER]
                deleted = 0
                for table in [*others, *(t for t in _PURGE_ORDER if t in tables)]:
                    deleted += c.execute(self.engine.sql(f'DELETE FROM "{table}" WHERE tenant_id = :tenant_id'),
                                         {"tenant_id": tenant_id}).rowcount
                c.execute(self.q["trust_scrub_tenant"], {"id": tenant_id, "now_us": now_us})
                summary = {"tenant_id": tenant_id, "triggers": len(triggers), "fires": fires, "rows": deleted}
                self._append_audit(c, tenant_id, "system:purge", "tenant.purge", now_us, None, summary)
            done.append(summary)
        return done

    def fire_counts(self, tenant_id: str) -> list[tuple[int, str, int]]:
        """The non-identifying per-day fire counts kept for a purged tenant: ``(day, state, n)``."""
        with self.engine.read() as c:
            rows = c.execute(self.q["trust_fire_counts"], {"tenant_id": tenant_id}).fetchall()
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    def create_tenant_with_principal(self, tenant: Tenant, principal: Principal, token_hash: str) -> None:
        """Insert a tenant and its first principal in one transaction, unaudited (tests and tools;
        the API uses :meth:`create_tenant_audited`)."""
        with self.engine.write() as c:
            c.execute(self.q["insert_tenant"], {"id": tenant.id, "name": tenant.name,
                                                "created_us": tenant.created_us})
            c.execute(self.q["insert_principal"], rec.principal_params(principal, token_hash))

    def create_principal(self, principal: Principal, token_hash: str) -> None:
        """Insert a principal (its token only as a hash), unaudited (tests and tools; the API uses
        :meth:`create_principal_audited`)."""
        with self.engine.write() as c:
            c.execute(self.q["insert_principal"], rec.principal_params(principal, token_hash))

    def principal_by_token_hash(self, token_hash: str) -> Principal | None:
        """The principal whose token hashes to ``token_hash`` (revoked ones too: the caller checks
        ``revoked_us``), or None."""
        with self.engine.read() as c:
            row = c.execute(self.q["principal_by_token_hash"], {"token_hash": token_hash}).fetchone()
        if not row:
            return None
        return Principal(row[0], row[1], row[2], frozenset(filter(None, row[3].split(","))), row[4], row[5])

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
        return rec.principal(row) if row else None

    def end_console_session(self, id_hash: str) -> bool:
        """Delete a session (sign out); False when there was none."""
        with self.engine.write() as c:
            return int(c.execute(self.q["console_session_delete"], {"id_hash": id_hash}).rowcount) > 0


__all__ = ["AUDIT_KEYED_MIGRATION", "DAY_US", "AuditKeySource", "SqlTrust", "install_audit_key_source"]
