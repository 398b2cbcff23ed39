"""Report queries off the fire path (SQL text; the methods are the history and registry areas'): read only.

* :meth:`SqlHistory.smear_rows` — a tenant's *on-time scheduled* fires over a window of scheduled
  instants (those jitter smearing applies to), keyset-paged by (scheduled instant, trigger, seq) over
  the fires' primary key (tenant, instant, trigger, seq): trigger, version, scheduled instant, sequence
  and first dispatch.
  Fires withheld (``skipped``, ``expired``) are left out: they were never going to be dispatched.
* :meth:`SqlRegistry.version_jitter_s` — a version's smearing window (its policies).

The smearing report itself (``fireledger.observe.smearing``) recomputes each fire's dispatch
not-before instant from these with the timing plane's own function (decision 0067).
"""

from __future__ import annotations

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


__all__ = ["REPORT_QUERIES", "SmearRow"]
