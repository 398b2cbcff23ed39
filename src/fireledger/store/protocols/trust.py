"""The trust area's contract: principals, tenant data keys, the audit chain, console sessions, target
ownership verification, tenant deletion and purge.

Implemented by :class:`fireledger.store.trust.SqlTrust` over SQLite and PostgreSQL and reached
as ``store.trust``. Every method that writes runs in its own transaction unless it says otherwise,
takes its instants from the caller and never reads a clock; a compare-and-set that matches no row
returns False/None (a normal outcome: moved or decided elsewhere), one that matches more than one
raises :class:`~fireledger.store.core.InvariantViolation` and rolls back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fireledger.domain.model import Principal, Tenant
from fireledger.domain.trust_records import AuditEntry, AuditNote, TargetTrust


class TrustStore(Protocol):
    """The trust area (module docstring)."""

    def append_audit(self, tenant_id: str | None, actor: str, action: str, at_us: int,
                     prior: Any = None, new: Any = None) -> AuditEntry:
        """Append one audit row in its own transaction and return it."""
        ...

    def append_in(self, c: Any, note: AuditNote) -> AuditEntry:
        """Append ``note`` inside the caller's open write transaction ``c`` and return the row: the
        function other areas are handed at composition, so an audited act and its audit row commit
        together (rolled back with it). Locks the chain's head row until ``c`` commits."""
        ...

    def audit_head(self) -> tuple[int, str]:
        """``(last seq, its hash)`` as recorded by the chain's head row."""
        ...

    @property
    def audit_key(self) -> bytes:
        """The audit chain's key: set by :meth:`set_audit_key`, else asked of the installed key source
        (:func:`install_audit_key_source`: ``fireledger.security`` derives it from the deployment's
        KEK and raises ``KekError`` when there is none — an audited act then fails rather than
        writing a row a database writer could forge). The store itself never reads a KEK."""
        ...

    def audit_rows(self, after_seq: int = 0, limit: int = 1000, tenant_id: str | None = None) -> list[AuditEntry]:
        """Audit rows with ``seq > after_seq`` in seq order (one tenant's, or all)."""
        ...

    def console_session(self, id_hash: str, now_us: int) -> Principal | None:
        """The principal of a live session (unexpired, principal not revoked, tenant not deleted)."""
        ...

    def count_principals(self, tenant_id: str) -> int:
        """How many principals the tenant has (revoked ones too)."""
        ...

    def create_console_session(self, id_hash: str, principal: Principal, now_us: int, expires_us: int) -> None:
        """Store a session (by the hash of its id) for ``principal`` until ``expires_us``; drop
        expired sessions and the principal's oldest beyond :data:`SESSIONS_PER_PRINCIPAL`."""
        ...

    def create_principal(self, principal: Principal, token_hash: str) -> None:
        """Insert a principal (its token only as a hash), unaudited (tests and tools; the API uses
        :meth:`create_principal_audited`)."""
        ...

    def create_principal_audited(self, principal: Principal, token_hash: str, actor: str) -> None:
        """Insert a principal (its token only as a hash) and audit the grant, in one transaction."""
        ...

    def create_tenant_audited(self, tenant: Tenant, principal: Principal, token_hash: str, actor: str) -> None:
        """Create a tenant with its first principal and audit it, in one transaction."""
        ...

    def create_tenant_with_principal(self, tenant: Tenant, principal: Principal, token_hash: str) -> None:
        """Insert a tenant and its first principal in one transaction, unaudited (tests and tools;
        the API uses :meth:`create_tenant_audited`)."""
        ...

    def delete_tenant(self, tenant_id: str, actor: str, now_us: int) -> dict[str, int] | None:
        """Delete a tenant at once: destroy its data key, revoke its principals, stop its triggers
        and skip its live fires (cause recorded), audited — one transaction. None when there is no
        such live tenant."""
        ...

    def end_console_session(self, id_hash: str) -> bool:
        """Delete a session (sign out); False when there was none."""
        ...

    def fire_counts(self, tenant_id: str) -> list[tuple[int, str, int]]:
        """The non-identifying per-day fire counts kept for a purged tenant: ``(day, state, n)``."""
        ...

    def get_principal(self, tenant_id: str, principal_id: str) -> Principal | None:
        """The tenant's principal (revoked ones too), or None — also for another tenant's."""
        ...

    def install_tenant_key(self, tenant_id: str, wrapped: bytes) -> bytes | None:
        """Install ``wrapped`` as the tenant's data key unless one exists (compare-and-set); return the
        key in force afterwards (None: the tenant is deleted or unknown)."""
        ...

    def list_principals(self, tenant_id: str, after: str = "", limit: int = 100) -> list[Principal]:
        """The tenant's principals (revoked ones too), by id."""
        ...

    def principal_by_token_hash(self, token_hash: str) -> Principal | None:
        """The principal whose token hashes to ``token_hash`` (revoked ones too: the caller checks
        ``revoked_us``), or None."""
        ...

    def purge_deleted_tenants(self, cutoff_us: int, now_us: int, limit: int = 10) -> list[dict[str, Any]]:
        """Purge tenants deleted at or before ``cutoff_us``: per trigger, count its fires per day and
        state into ``fire_counts`` and delete its fires, attempts and outcomes (one transaction per
        trigger); then delete every other row of the tenant (definitions, targets, principals and
        any table with a ``tenant_id`` column except the audit and the counts) and scrub the
        tenant's name. Idempotent; returns one summary per purged tenant."""
        ...

    def revoke_principal(self, tenant_id: str, principal_id: str, actor: str, now_us: int) -> str:
        """Revoke a principal's token and audit it. Returns ``revoked``, ``absent`` (no such live
        principal of this tenant) or ``last-admin`` (refused: the tenant would have no admin left)."""
        ...

    def seal_legacy_audit(self, c: Any, now_us: int) -> AuditEntry | None:
        """Inside the transaction applying migration 0011: when unkeyed rows exist, append the keyed
        ``audit.seal`` row naming their count and the head hash (its ``prev_hash``), so they can no
        longer be rewritten without the key. ``at_us`` is ``now_us``, or the last sealed row's instant
        when the caller gives none. None when the chain is empty (nothing to seal).

        The KEK must already exist here (it is never created by an upgrade: a new key would seal the
        old rows under a key the rest of the deployment does not hold); without one this raises
        ``KekError`` and the migration's transaction, 0011 included, is rolled back."""
        ...

    def set_audit_key(self, key: bytes) -> None:
        """Use ``key`` (32+ bytes) for the audit chain instead of the KEK-derived one."""
        ...

    def set_target_verification(self, tenant_id: str, target_id: str, state: str, verified_us: int | None,
                                expires_us: int | None, error: str | None, actor: str, now_us: int,
                                addresses: Sequence[str] | None = None, method: str | None = None) -> bool:
        """Record a verification outcome (and audit the change of state, ``target.verify``), in one
        transaction; clears the re-verification claim. ``addresses``: the addresses a plain-http
        target's host name was verified at (the dispatch pin; None for others). ``method``: how it was
        proved, ``http`` or ``dns`` (None keeps the recorded one). False when the tenant has no such
        live target."""
        ...

    def claim_reverifications(self, now_us: int, horizon_us: int, until_us: int, limit: int = 50) -> list[TargetTrust]:
        """Take up to ``limit`` live verified ``http`` targets whose verification expires in
        ``(now_us, horizon_us]`` and that no one holds (their claim instant unset or ≤ ``now_us``),
        soonest expiry first, moving their claim to ``until_us`` — a compare-and-set per target, so two
        callers (two control processes) never take the same target, and a target whose re-verification
        failed is not taken again before ``until_us``. Returns the targets taken."""
        ...

    def note_reverification_failure(self, tenant_id: str, target_id: str, error: str, actor: str,
                                    now_us: int) -> bool:
        """Record that re-verifying a live verified target failed: it stays ``verified`` until its
        expiry, ``error`` becomes its verification error, audited (``target.reverify``), in one
        transaction. False when the tenant has no such live verified target."""
        ...

    def lapse_verifications(self, now_us: int, actor: str, limit: int = 100) -> list[TargetTrust]:
        """Move up to ``limit`` live verified ``http`` targets whose expiry is ≤ ``now_us`` to
        ``lapsed`` (the error names the instant and the last failed try), each audited
        (``target.lapse``), in one transaction; returns them as they were before. A target renewed
        before the compare-and-set is left verified."""
        ...

    def verification_expiring(self, now_us: int, horizon_us: int) -> dict[str, int]:
        """Per tenant id, how many live verified ``http`` targets expire in ``(now_us, horizon_us]``
        (tenants with none absent): the ``fireledger_targets_verification_expiring`` gauge."""
        ...

    def target_trust(self, target_id: str) -> TargetTrust | None:
        """The verification state of a target (any tenant's, deleted ones too): the dispatch check."""
        ...

    def tenant_wrapped_key(self, tenant_id: str) -> tuple[bool, bytes | None]:
        """``(tenant is live, its wrapped data key or None)``; an unknown tenant is ``(False, None)``."""
        ...


__all__ = ["TrustStore"]
