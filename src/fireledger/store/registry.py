"""The registry area: tenants, targets, triggers and their versions, and the due index they keep.

Contracts (every method; :class:`~fireledger.store.protocols.RegistryStore` states each one):

* A definition change and its due row commit together: creating, amending, pausing, resuming or
  deleting a trigger writes the trigger row, the version row (when new), the due row (set or
  removed) and, when given, the audit row of the act in ONE transaction, and bumps the definitions
  counter (other processes' timing loops wake on it).
* Changes to an existing trigger are compare-and-set on what the caller read (its current version,
  its state): False, nothing written, when it moved meanwhile.
* Target secrets and payloads are stored as given: sealed by the caller (``fireledger.security``
  and the registry service seal them; the store never holds a key).
* Every method that writes takes ``now_us`` from its caller: the store never reads a clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fireledger.domain.model import Target, Tenant, Trigger, TriggerState, TriggerVersion
from fireledger.domain.trust_records import AuditNote, is_sealed_secret

from . import rows as rec
from .calendars import RegistryCalendars
from .core import expect_one
from .engine import StoreError
from .gaps import RegistryGaps


def _sealed(t: Target) -> str:
    if not is_sealed_secret(t.secret):
        raise ValueError("secret: a target's signing secret must be sealed before it is stored")
    return t.secret


class SqlRegistry(RegistryGaps, RegistryCalendars):
    """Tenants, targets, triggers, versions and the due index (module docstring); pause,
    resume and backfill in :class:`~fireledger.store.gaps.RegistryGaps`; exclusion calendars in
    :class:`~fireledger.store.calendars.RegistryCalendars`."""

    def create_tenant(self, tenant: Tenant) -> None:
        """Insert a tenant (no principal, no audit row: tests and tools; the API uses
        :meth:`SqlTrust.create_tenant_audited`). A duplicate id or name raises the driver's integrity error."""
        with self.engine.write() as c:
            c.execute(self.q["insert_tenant"], {"id": tenant.id, "name": tenant.name,
                                                "created_us": tenant.created_us})

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        """A live tenant, or None when unknown or deleted."""
        with self.engine.read() as c:
            row = c.execute(self.q["get_tenant"], {"id": tenant_id}).fetchone()
        return Tenant(*row) if row else None

    def tenant_id_by_name(self, name: str) -> str | None:
        """The id of the tenant named ``name`` (deleted ones too), or None."""
        with self.engine.read() as c:
            row = c.execute(self.q["trust_tenant_by_name"], {"name": name}).fetchone()
        return None if row is None else str(row[0])

    def tenant_state(self, tenant_id: str) -> dict[str, Any] | None:
        """``{id, created_us, deleted_us, purged_us}`` of a tenant (deleted ones too), or None."""
        with self.engine.read() as c:
            row = c.execute(self.q["trust_tenant_row"], {"id": tenant_id}).fetchone()
        if row is None:
            return None
        return {"id": row[0], "created_us": row[2], "deleted_us": row[3], "purged_us": row[4]}

    def unsealed_target_secrets(self, after: str, limit: int) -> list[tuple[str, str, str]]:
        """``(target id, tenant id, secret)`` of rows whose secret is still plaintext, by id after ``after``."""
        with self.engine.read() as c:
            rows = c.execute(self.q["unsealed_target_secrets"], {"after": after, "limit": limit}).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def replace_target_secret(self, target_id: str, old: str, new: str) -> bool:
        """Compare-and-set a target's stored secret; True when this call changed it."""
        with self.engine.write() as c:
            cur = c.execute(self.q["replace_target_secret"], {"id": target_id, "old": old, "new": new})
            return bool(cur.rowcount)

    def create_target(self, t: Target) -> None:
        """Insert a target. Its secret must be sealed already (``ValueError`` otherwise): the caller
        seals it (``fireledger.security.envelope.seal_secret``), so no write stores a signing secret
        in plaintext and the store holds no key."""
        with self.engine.write() as c:
            c.execute(self.q["insert_target"], rec.target_params(t, _sealed(t)))

    def create_target_audited(self, t: Target, actor: str) -> None:
        """Insert a target and audit it (URL and kind only: never the secret), in one transaction.
        Its secret must be sealed already (:meth:`create_target`)."""
        with self.engine.write() as c:
            c.execute(self.q["insert_target"], rec.target_params(t, _sealed(t)))
            self._audit(c, AuditNote(t.tenant_id, actor, "target.create", t.created_us, None,
                                     {"target_id": t.id, "kind": t.kind, "url": t.url}))

    def get_target(self, tenant_id: str, target_id: str) -> Target | None:
        """The tenant's target (deleted ones too; its secret as stored: sealed), or None — also for
        another tenant's target."""
        with self.engine.read() as c:
            row = c.execute(self.q["get_target"], {"tenant_id": tenant_id, "id": target_id}).fetchone()
        return rec.target(row) if row else None

    def list_targets(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Target]:
        """A page of the tenant's live targets by id, after ``after``."""
        with self.engine.read() as c:
            rows = c.execute(self.q["list_targets"],
                             {"tenant_id": tenant_id, "after": after, "limit": limit}).fetchall()
        return [rec.target(r) for r in rows]

    def delete_target(self, tenant_id: str, target_id: str, now_us: int) -> bool:
        """Soft-delete a target. Refused (``StoreError``) while a live trigger points at it."""
        with self.engine.write() as c:
            used = c.execute(self.q["target_in_use"], {"tenant_id": tenant_id, "target_id": target_id}).fetchone()
            if used:
                raise StoreError(f"target {target_id} is used by trigger {used[0]}")
            return expect_one(c.execute(self.q["delete_target"], {"tenant_id": tenant_id, "id": target_id,
                                                            "now_us": now_us}).rowcount, "delete_target")

    def delete_target_audited(self, tenant_id: str, target_id: str, actor: str, now_us: int) -> str:
        """Soft-delete a target and audit it. Returns ``deleted``, ``absent`` or ``in-use:<trigger id>``."""
        with self.engine.write() as c:
            row = c.execute(self.q["trust_target"], {"id": target_id}).fetchone()
            if row is None or row[1] != tenant_id or row[9] is not None:
                return "absent"
            used = c.execute(self.q["target_in_use"], {"tenant_id": tenant_id, "target_id": target_id}).fetchone()
            if used:
                return f"in-use:{used[0]}"
            n = c.execute(self.q["delete_target"], {"tenant_id": tenant_id, "id": target_id,
                                                    "now_us": now_us}).rowcount
            if n != 1:
                return "absent"
            self._audit(c, AuditNote(tenant_id, actor, "target.delete", now_us,
                                     {"target_id": target_id, "url": row[3], "verification": row[4]}, None))
        return "deleted"

    def count_targets(self, tenant_id: str) -> int:
        """The tenant's targets that are not deleted (the per-tenant limit's count)."""
        with self.engine.read() as c:
            return int(c.execute(self.q["trust_count_targets"], {"tenant_id": tenant_id}).fetchone()[0])

    def create_trigger(self, trigger: Trigger, version: TriggerVersion, next_us: int | None, *,
                       audit: AuditNote | None = None) -> None:
        """Insert the trigger, its first version, (when ``next_us`` and active) its due row and (when
        given) the ``audit`` row, in one transaction: none of them exists without the others."""
        with self.engine.write() as c:
            c.execute(self.q["insert_trigger"], rec.trigger_params(trigger, version))
            c.execute(self.q["insert_version"], rec.version_params(version))
            if next_us is not None and trigger.state == TriggerState.ACTIVE:
                c.execute(self.q["upsert_due"], rec.due_params(trigger, version.version, next_us))
            if audit is not None:
                self._audit(c, audit)
            c.execute(self.q["bump_definitions"])

    def create_triggers(self, items: Sequence[tuple[Trigger, TriggerVersion, int | None]],
                        audits: Sequence[AuditNote] = ()) -> None:
        """:meth:`create_trigger` for many triggers (and any ``audits``) in ONE transaction, the rows
        written with ``executemany`` (bulk loading: the benchmarks and falsification harnesses).
        All or nothing: a failing row or audit row leaves none of them."""
        if not items and not audits:
            return
        with self.engine.write() as c:
            cur = c.cursor()
            cur.executemany(self.q["insert_trigger"], [rec.trigger_params(t, v) for t, v, _ in items])
            cur.executemany(self.q["insert_version"], [rec.version_params(v) for _, v, _ in items])
            due = [rec.due_params(t, v.version, n) for t, v, n in items
                   if n is not None and t.state == TriggerState.ACTIVE]
            if due:
                cur.executemany(self.q["upsert_due"], due)
            for note in audits:
                self._audit(c, note)
            c.execute(self.q["bump_definitions"])

    def get_trigger(self, tenant_id: str, trigger_id: str) -> Trigger | None:
        """The tenant's trigger with its due instant (``next_us``) and pause reason, or None — also
        for another tenant's trigger."""
        with self.engine.read() as c:
            row = c.execute(self.q["get_trigger"], {"tenant_id": tenant_id, "id": trigger_id}).fetchone()
        return rec.trigger(row) if row else None

    def list_triggers(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Trigger]:
        """A page of the tenant's triggers that are not deleted, by id, after ``after``."""
        with self.engine.read() as c:
            rows = c.execute(self.q["list_triggers"],
                             {"tenant_id": tenant_id, "after": after, "limit": limit}).fetchall()
        return [rec.trigger(r) for r in rows]

    def get_version(self, trigger_id: str, version: int) -> TriggerVersion | None:
        """One version of a trigger (payload as stored: sealed), or None."""
        with self.engine.read() as c:
            row = c.execute(self.q["get_version"], {"trigger_id": trigger_id, "version": version}).fetchone()
        return rec.version(row) if row else None

    def get_versions(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], TriggerVersion]:
        """Many versions in one statement, keyed by (trigger_id, version); missing ones are absent."""
        if not pairs:
            return {}
        with self.engine.read() as c:
            rows = c.execute(self.q["dp_versions"], {"ids": json.dumps(sorted(set(pairs)))}).fetchall()
        out = {}
        for row in rows:
            v = rec.version(row)
            out[(v.trigger_id, v.version)] = v
        return out

    def amend_trigger(self, trigger: Trigger, new_version: TriggerVersion, name: str,
                      next_us: int | None, now_us: int, *, audit: AuditNote | None = None) -> bool:
        """Make ``new_version`` current, recompute the due row and (when given) append the ``audit``
        row, in one transaction.

        Compare-and-set on the trigger's current version: False when it moved meanwhile (nothing
        written, no audit row).
        """
        with self.engine.write() as c:
            ok = expect_one(c.execute(self.q["update_trigger_version"], {
                "new_version": new_version.version, "name": name, "now_us": now_us,
                "tenant_id": trigger.tenant_id, "id": trigger.id,
                "expected_version": trigger.current_version}).rowcount, "amend_trigger")
            if not ok:
                return False
            c.execute(self.q["insert_version"], rec.version_params(new_version))
            self._set_due(c, trigger, next_us if trigger.state == TriggerState.ACTIVE else None,
                          new_version.version)
            if audit is not None:
                self._audit(c, audit)
            c.execute(self.q["bump_definitions"])
        return True

    def _set_due(self, c: Any, trigger: Trigger, next_us: int | None, version: int) -> None:
        if next_us is None:
            c.execute(self.q["delete_due"], {"trigger_id": trigger.id})
        else:
            c.execute(self.q["upsert_due"], {"trigger_id": trigger.id, "tenant_id": trigger.tenant_id,
                                             "partition": trigger.partition, "next_us": next_us,
                                             "version": version})

    def set_trigger_state(self, trigger: Trigger, state: TriggerState, next_us: int | None,
                          now_us: int) -> bool:
        """Pause / resume / delete: CAS on the current state, due row set or removed atomically."""
        with self.engine.write() as c:
            ok = expect_one(c.execute(self.q["update_trigger_state"], {
                "state": state.value, "now_us": now_us, "tenant_id": trigger.tenant_id,
                "id": trigger.id, "expected_state": trigger.state.value}).rowcount, "set_trigger_state")
            if not ok:
                return False
            self._set_due(c, trigger, next_us if state == TriggerState.ACTIVE else None,
                          trigger.current_version)
            c.execute(self.q["bump_definitions"])
        return True

    def definitions_counter(self) -> int:
        """A counter bumped by every definition change (wakes timing loops in other processes)."""
        with self.engine.read() as c:
            row = c.execute(self.q["definitions_counter"]).fetchone()
        return int(row[0]) if row else 0

    def count_live_triggers(self, tenant_id: str) -> int:
        """The tenant's triggers that are not deleted (the per-tenant limit's count)."""
        with self.engine.read() as c:
            return int(c.execute(self.q["trust_count_live_triggers"], {"tenant_id": tenant_id}).fetchone()[0])

    def version_jitter_s(self, trigger_id: str, version: int) -> int:
        """The smearing window (seconds) of one trigger version; 0 when absent."""
        with self.engine.read() as c:
            row = c.execute(self.q["rp_version_policies"], {"trigger_id": trigger_id, "version": version}).fetchone()
        if row is None:
            return 0
        return int(json.loads(row[0]).get("jitter_s", 0) or 0)


__all__ = ["SqlRegistry"]
