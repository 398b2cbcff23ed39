"""The registry area's contract: tenants, targets, triggers and versions, the due index they keep,
pause/resume and the gaps it leaves, backfill.

Implemented by :class:`fireledger.store.registry.SqlRegistry` over SQLite and PostgreSQL and reached
as ``store.registry``. Every method that writes runs in its own transaction unless it says otherwise,
takes its instants from the caller and never reads a clock; a compare-and-set that matches no row
returns False/None (a normal outcome: moved or decided elsewhere), one that matches more than one
raises :class:`~fireledger.store.core.InvariantViolation` and rolls back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fireledger.domain.model import DueRow, Fire, NewFire, Target, Tenant, Trigger, TriggerState, TriggerVersion
from fireledger.domain.trust_records import AuditNote


class RegistryStore(Protocol):
    """The registry area (module docstring)."""

    def amend_trigger(self, trigger: Trigger, new_version: TriggerVersion, name: str,
                      next_us: int | None, now_us: int, *, audit: AuditNote | None = None) -> bool:
        """Make ``new_version`` current, recompute the due row and (when given) append the ``audit``
        row, in one transaction.

        Compare-and-set on the trigger's current version: False when it moved meanwhile (nothing
        written, no audit row).
        """
        ...

    def backfill_window(self, tenant_id: str, trigger_id: str, lo_us: int, hi_us: int,
                        seq: int) -> tuple[set[int], set[int]]:
        """For ``lo_us <= scheduled_us < hi_us``: (instants holding a fire with sequence ``seq``,
        instants holding a delivered fire of any sequence)."""
        ...

    def commit_backfill(self, fires: Sequence[NewFire], *, tenant_id: str, actor: str, at_us: int,
                        prior: Any, audit_new: dict[str, Any],
                        progress: Callable[[int, int], None] | None = None) -> list[NewFire]:
        """Insert ``fires`` and append the ``trigger.backfill`` audit row in one transaction; returns
        the fires inserted (a key that exists already inserts nothing). The audit row's ``new`` value
        is ``audit_new`` plus ``created`` and ``already_present`` as counted inside the transaction."""
        ...

    def count_live_triggers(self, tenant_id: str) -> int:
        """The tenant's triggers that are not deleted (the per-tenant limit's count)."""
        ...

    def count_targets(self, tenant_id: str) -> int:
        """The tenant's targets that are not deleted (the per-tenant limit's count)."""
        ...

    def create_target(self, t: Target) -> None:
        """Insert a target. Its secret must be sealed already (``ValueError`` otherwise): the caller
        seals it (``fireledger.security.envelope.seal_secret``), so no write stores a signing secret
        in plaintext and the store holds no key."""
        ...

    def create_target_audited(self, t: Target, actor: str) -> None:
        """Insert a target and audit it (URL and kind only: never the secret), in one transaction.
        Its secret must be sealed already (:meth:`create_target`)."""
        ...

    def create_tenant(self, tenant: Tenant) -> None:
        """Insert a tenant (no principal, no audit row: tests and tools; the API uses
        :meth:`SqlTrust.create_tenant_audited`). A duplicate id or name raises the driver's integrity error."""
        ...

    def create_trigger(self, trigger: Trigger, version: TriggerVersion, next_us: int | None, *,
                       audit: AuditNote | None = None) -> None:
        """Insert the trigger, its first version, (when ``next_us`` and active) its due row and (when
        given) the ``audit`` row, in one transaction: none of them exists without the others."""
        ...

    def create_triggers(self, items: Sequence[tuple[Trigger, TriggerVersion, int | None]],
                        audits: Sequence[AuditNote] = ()) -> None:
        """:meth:`create_trigger` for many triggers (and any ``audits``) in ONE transaction, the rows
        written with ``executemany`` (bulk loading: the benchmarks and falsification harnesses).
        All or nothing: a failing row or audit row leaves none of them."""
        ...

    def definitions_counter(self) -> int:
        """A counter bumped by every definition change (wakes timing loops in other processes)."""
        ...

    def delete_target(self, tenant_id: str, target_id: str, now_us: int) -> bool:
        """Soft-delete a target. Refused (``StoreError``) while a live trigger points at it."""
        ...

    def delete_target_audited(self, tenant_id: str, target_id: str, actor: str, now_us: int) -> str:
        """Soft-delete a target and audit it. Returns ``deleted``, ``absent`` or ``in-use:<trigger id>``."""
        ...

    def get_target(self, tenant_id: str, target_id: str) -> Target | None:
        """The tenant's target (deleted ones too; its secret as stored: sealed), or None — also for
        another tenant's target."""
        ...

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        """A live tenant, or None when unknown or deleted."""
        ...

    def get_trigger(self, tenant_id: str, trigger_id: str) -> Trigger | None:
        """The tenant's trigger with its due instant (``next_us``) and pause reason, or None — also
        for another tenant's trigger."""
        ...

    def get_version(self, trigger_id: str, version: int) -> TriggerVersion | None:
        """One version of a trigger (payload as stored: sealed), or None."""
        ...

    def get_versions(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], TriggerVersion]:
        """Many versions in one statement, keyed by (trigger_id, version); missing ones are absent."""
        ...

    def last_gap_fires(self, tenant_id: str, trigger_id: str) -> list[Fire]:
        """The fire records of the trigger's most recent plan that missed instants (oldest first;
        range records included as recorded), or [] when it never missed one."""
        ...

    def list_targets(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Target]:
        """A page of the tenant's live targets by id, after ``after``."""
        ...

    def list_triggers(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Trigger]:
        """A page of the tenant's triggers that are not deleted, by id, after ``after``."""
        ...

    def pause_failing(self, row: DueRow, fire: NewFire, reason: str, now_us: int) -> bool:
        """The timing plane could not plan ``row``: record ``fire`` (state ``failed``, its cause),
        remove the due row and pause the trigger with ``reason``, in one transaction. Compare-and-set
        on the due row as read: False (nothing written) when it moved meanwhile — an amendment, a
        pause or another node's decision; the loop reads it again next cycle."""
        ...

    def pause_trigger(self, trigger: Trigger, now_us: int, *, audit: AuditNote | None = None) -> int | None:
        """Pause an active trigger: compare-and-set on its state, its due row removed, its resume
        point recorded and (when given) the ``audit`` row appended, in one transaction. Returns the
        resume point, or None when the trigger was not active any more (changed meanwhile: nothing
        written, no audit row)."""
        ...

    def replace_target_secret(self, target_id: str, old: str, new: str) -> bool:
        """Compare-and-set a target's stored secret; True when this call changed it."""
        ...

    def resume_point(self, tenant_id: str, trigger_id: str) -> tuple[bool, int | None]:
        """``(paused, point)``: whether the trigger is paused, and its resume point (None for a
        trigger paused before resume points were recorded: it resumes from the resume instant)."""
        ...

    def resume_trigger(self, trigger: Trigger, point_us: int | None, next_us: int | None, now_us: int, *,
                       audit: AuditNote | None = None) -> bool:
        """Resume a paused trigger with the due row at ``next_us`` (None: the schedule has no instant
        left, no row) and (when given) the ``audit`` row appended, in one transaction. Compare-and-set
        on the state, the current version and the resume point the caller computed ``next_us`` from:
        False when any moved (nothing written, no audit row)."""
        ...

    def set_trigger_state(self, trigger: Trigger, state: TriggerState, next_us: int | None,
                          now_us: int) -> bool:
        """Pause / resume / delete: CAS on the current state, due row set or removed atomically."""
        ...

    def tenant_id_by_name(self, name: str) -> str | None:
        """The id of the tenant named ``name`` (deleted ones too), or None."""
        ...

    def tenant_state(self, tenant_id: str) -> dict[str, Any] | None:
        """``{id, created_us, deleted_us, purged_us}`` of a tenant (deleted ones too), or None."""
        ...

    def unsealed_target_secrets(self, after: str, limit: int) -> list[tuple[str, str, str]]:
        """``(target id, tenant id, secret)`` of rows whose secret is still plaintext, by id after ``after``."""
        ...

    def version_jitter_s(self, trigger_id: str, version: int) -> int:
        """The smearing window (seconds) of one trigger version; 0 when absent."""
        ...


__all__ = ["RegistryStore"]
