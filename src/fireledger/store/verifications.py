"""Target ownership verification in the trust area: its state, the automatic re-verification's claim,
the lapse, and the count of verifications about to expire (decisions 0041, 0089, 0170-0174).

Contracts (each method's docstring in :class:`fireledger.store.protocols.trust.TrustStore`):

* **Every change of a verification is audited in its own transaction**: a proof or a failure
  (``target.verify``), a failed re-verification that leaves the target verified
  (``target.reverify``), and a lapse (``target.lapse``).
* **One re-verifier per target however many control processes run**: a target is taken for
  re-verification by moving its ``reverify_after_us`` forward with a compare-and-set
  (:meth:`TargetVerifications.claim_reverifications`); a process that loses the race does not get
  it, and a failed try is not retried before that instant. Recording a proof clears the claim.
* A verified target past its expiry is *lapsed* by :meth:`TargetVerifications.lapse_verifications`
  (compare-and-set on the state and the expiry: a renewal committed first wins).
* Nothing here reads a clock; every instant comes from the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fireledger.domain.keys import from_us
from fireledger.domain.trust_records import AuditEntry, TargetTrust
from fireledger.recurrence import format_instant

from . import queries
from . import rows as rec
from .engine import Engine

_LIVE_VERIFIED = "kind = 'http' AND verification_state = 'verified' AND deleted_us IS NULL"

VERIFICATION_QUERIES: dict[str, str] = {
    "trust_target": (
        "SELECT id, tenant_id, kind, url, verification_state, verification_token, verified_us, "
        "verification_expires_us, verification_error, deleted_us, verified_addresses, verification_method "
        "FROM targets WHERE id = :id"
    ),
    "trust_set_verification": (
        "UPDATE targets SET verification_state = :state, verified_us = :verified_us, "
        "verification_expires_us = :expires_us, verification_error = :error, verified_addresses = :addresses, "
        "verification_method = COALESCE(:method, verification_method), reverify_after_us = NULL "
        "WHERE tenant_id = :tenant_id AND id = :id AND deleted_us IS NULL"
    ),
    "trust_reverify_due": (
        f"SELECT id FROM targets WHERE {_LIVE_VERIFIED} AND verification_expires_us > :now_us "
        "AND verification_expires_us <= :horizon_us AND (reverify_after_us IS NULL OR reverify_after_us <= :now_us) "
        "ORDER BY verification_expires_us, id LIMIT :limit"
    ),
    "trust_reverify_claim": (
        f"UPDATE targets SET reverify_after_us = :until_us WHERE id = :id AND {_LIVE_VERIFIED} "
        "AND (reverify_after_us IS NULL OR reverify_after_us <= :now_us)"
    ),
    "trust_reverify_failed": (
        f"UPDATE targets SET verification_error = :error WHERE tenant_id = :tenant_id AND id = :id AND {_LIVE_VERIFIED}"
    ),
    "trust_lapse_due": (
        f"SELECT id FROM targets WHERE {_LIVE_VERIFIED} AND verification_expires_us <= :now_us "
        "ORDER BY verification_expires_us, id LIMIT :limit"
    ),
    "trust_lapse": (
        "UPDATE targets SET verification_state = 'lapsed', verification_error = :error, reverify_after_us = NULL "
        f"WHERE id = :id AND {_LIVE_VERIFIED} AND verification_expires_us <= :now_us"
    ),
    "trust_expiring_by_tenant": (
        f"SELECT tenant_id, COUNT(*) FROM targets WHERE {_LIVE_VERIFIED} AND verification_expires_us > :now_us "
        "AND verification_expires_us <= :horizon_us GROUP BY tenant_id ORDER BY tenant_id"
    ),
}

queries.register(VERIFICATION_QUERIES)


class TargetVerifications:
    """The verification methods of :class:`~fireledger.store.trust.SqlTrust` (module docstring)."""

    engine: Engine
    q: dict[str, str]

    #: SqlTrust's audit append (this mixin's acts are audited in their own transaction through it).
    _append_audit: Callable[..., AuditEntry]

    def target_trust(self, target_id: str) -> TargetTrust | None:
        """The verification state of a target (any tenant's, deleted ones too): the dispatch check."""
        with self.engine.read() as c:
            row = c.execute(self.q["trust_target"], {"id": target_id}).fetchone()
        return rec.target_trust(row) if row else None

    def set_target_verification(self, tenant_id: str, target_id: str, state: str, verified_us: int | None,
                                expires_us: int | None, error: str | None, actor: str, now_us: int,
                                addresses: Sequence[str] | None = None, method: str | None = None) -> bool:
        """Record a verification outcome (and audit the change of state), in one transaction; clears
        the re-verification claim. ``addresses``: the addresses a plain-http target's host name was
        verified at (the dispatch pin; None for others). ``method``: how it was proved (``http`` or
        ``dns``; None keeps the recorded one). False when the tenant has no such live target."""
        pinned = None if addresses is None else " ".join(sorted(set(addresses)))
        with self.engine.write() as c:
            row = c.execute(self.q["trust_target"], {"id": target_id}).fetchone()
            if row is None or row[1] != tenant_id or row[9] is not None:
                return False
            n = c.execute(self.q["trust_set_verification"], {
                "state": state, "verified_us": verified_us, "expires_us": expires_us, "error": error,
                "addresses": pinned, "method": method, "tenant_id": tenant_id, "id": target_id}).rowcount
            if n != 1:
                return False
            extra = {"addresses": pinned} if pinned is not None else {}
            if method is not None:
                extra["method"] = method
            self._append_audit(c, tenant_id, actor, "target.verify", now_us,
                               {"target_id": target_id, "state": row[4], "expires_us": row[7]},
                               {"target_id": target_id, "state": state, "expires_us": expires_us,
                                "error": error, **extra})
        return True

    def claim_reverifications(self, now_us: int, horizon_us: int, until_us: int, limit: int = 50) -> list[TargetTrust]:
        """Take up to ``limit`` verified ``http`` targets whose verification expires in
        ``(now_us, horizon_us]`` and that nobody holds (``reverify_after_us`` unset or ≤ ``now_us``),
        soonest expiry first, by setting ``reverify_after_us = until_us`` (one compare-and-set per
        target, so concurrent callers never take the same target). Returns the targets taken."""
        taken: list[TargetTrust] = []
        with self.engine.write() as c:
            ids = [r[0] for r in c.execute(self.q["trust_reverify_due"], {
                "now_us": now_us, "horizon_us": horizon_us, "limit": limit}).fetchall()]
            for target_id in ids:
                if c.execute(self.q["trust_reverify_claim"], {
                        "id": target_id, "now_us": now_us, "until_us": until_us}).rowcount == 1:
                    row = c.execute(self.q["trust_target"], {"id": target_id}).fetchone()
                    taken.append(rec.target_trust(row))
        return taken

    def note_reverification_failure(self, tenant_id: str, target_id: str, error: str, actor: str,
                                    now_us: int) -> bool:
        """Record that re-verifying a still-verified target failed: the target stays ``verified`` until
        its expiry, ``error`` is recorded (the API's ``verification.error``) and the try audited
        (``target.reverify``), in one transaction. False when the target is not a live verified one."""
        with self.engine.write() as c:
            row = c.execute(self.q["trust_target"], {"id": target_id}).fetchone()
            if row is None or c.execute(self.q["trust_reverify_failed"], {
                    "error": error, "tenant_id": tenant_id, "id": target_id}).rowcount != 1:
                return False
            self._append_audit(c, tenant_id, actor, "target.reverify", now_us,
                               {"target_id": target_id, "state": row[4], "expires_us": row[7]},
                               {"target_id": target_id, "state": row[4], "expires_us": row[7], "error": error})
        return True

    def lapse_verifications(self, now_us: int, actor: str, limit: int = 100) -> list[TargetTrust]:
        """Move up to ``limit`` live verified ``http`` targets whose expiry is ≤ ``now_us`` to
        ``lapsed`` (the error names the instant), each audited (``target.lapse``), in one transaction;
        returns them as they were before. A target renewed first is left alone (compare-and-set)."""
        lapsed: list[TargetTrust] = []
        with self.engine.write() as c:
            ids = [r[0] for r in c.execute(self.q["trust_lapse_due"], {"now_us": now_us, "limit": limit}).fetchall()]
            for target_id in ids:
                t = rec.target_trust(c.execute(self.q["trust_target"], {"id": target_id}).fetchone())
                when = format_instant(from_us(t.expires_us or now_us))
                error = (f"the verification lapsed at {when} without being renewed"
                         + (f"; last try: {t.error}" if t.error else ""))[:600]
                if c.execute(self.q["trust_lapse"], {"id": target_id, "now_us": now_us, "error": error}).rowcount != 1:
                    continue
                self._append_audit(c, t.tenant_id, actor, "target.lapse", now_us,
                                   {"target_id": target_id, "state": "verified", "expires_us": t.expires_us},
                                   {"target_id": target_id, "state": "lapsed", "error": error})
                lapsed.append(t)
        return lapsed

    def verification_expiring(self, now_us: int, horizon_us: int) -> dict[str, int]:
        """Per tenant, how many live verified ``http`` targets expire in ``(now_us, horizon_us]``
        (tenants with none are absent)."""
        with self.engine.read() as c:
            rows = c.execute(self.q["trust_expiring_by_tenant"], {"now_us": now_us, "horizon_us": horizon_us})
            return {str(r[0]): int(r[1]) for r in rows.fetchall()}


__all__ = ["VERIFICATION_QUERIES", "TargetVerifications"]
