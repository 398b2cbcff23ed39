"""Report queries off the fire path (a :class:`~fireledger.store.SqlStore` mixin): read only.

* :meth:`ReportsMixin.smear_rows` — a tenant's *on-time scheduled* fires over a window of scheduled
  instants (those jitter smearing applies to), keyset-paged by (scheduled instant, trigger, seq) over
  index ``fires_by_tenant_instant``: trigger, version, scheduled instant, sequence and first dispatch.
  Fires withheld (``skipped``, ``expired``) are left out: they were never going to be dispatched.
* :meth:`ReportsMixin.version_jitter_s` — a version's smearing window (its policies).

The smearing report itself (``fireledger.observe.smearing``) recomputes each fire's dispatch
not-before instant from these with the timing plane's own function (decision 0067).
"""

from __future__ import annotations

import json
from typing import Any

from . import queries

REPORT_QUERIES: dict[str, str] = {
    "rp_smear_rows": (
        "SELECT trigger_id, version, scheduled_us, seq, dispatched_us FROM fires WHERE tenant_id = :tenant_id "
        "AND scheduled_us >= :lo AND scheduled_us < :hi AND kind = 'scheduled' AND lane = 'on-time' "
        "AND state NOT IN ('skipped', 'expired') AND (scheduled_us, trigger_id, seq) > (:c_us, :c_tr, :c_seq) "
        "ORDER BY scheduled_us, trigger_id, seq LIMIT :limit"
    ),
    "rp_version_policies": (
        "SELECT policies FROM trigger_versions WHERE trigger_id = :trigger_id AND version = :version"
    ),
}

queries.register(REPORT_QUERIES)

#: (trigger_id, version, scheduled_us, seq, dispatched_us)
SmearRow = tuple[str, int, int, int, int | None]
_LOW = -(2**62)


class ReportsMixin:
    """Read-only report queries (see the module docstring)."""

    engine: Any
    q: dict[str, str]

    def smear_rows(self, tenant_id: str, lo_us: int, hi_us: int, after: tuple[int, str, int] | None = None,
                   limit: int = 5000) -> list[SmearRow]:
        """One page of the tenant's on-time scheduled fires with ``lo_us <= scheduled_us < hi_us``,
        after the cursor ``(scheduled_us, trigger_id, seq)``; pass the last row's back for the next."""
        c_us, c_tr, c_seq = after if after is not None else (_LOW, "", -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["rp_smear_rows"], {"tenant_id": tenant_id, "lo": lo_us, "hi": hi_us,
                                                       "c_us": c_us, "c_tr": c_tr, "c_seq": c_seq,
                                                       "limit": limit}).fetchall()
        return [(str(r[0]), int(r[1]), int(r[2]), int(r[3]), None if r[4] is None else int(r[4])) for r in rows]

    def version_jitter_s(self, trigger_id: str, version: int) -> int:
        """The smearing window (seconds) of one trigger version; 0 when absent."""
        with self.engine.read() as c:
            row = c.execute(self.q["rp_version_policies"], {"trigger_id": trigger_id, "version": version}).fetchone()
        if row is None:
            return 0
        return int(json.loads(row[0]).get("jitter_s", 0) or 0)


__all__ = ["REPORT_QUERIES", "ReportsMixin", "SmearRow"]
