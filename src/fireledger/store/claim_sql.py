"""The claim's candidate read: a bounded batch of due fires per lane, read from an index in order
(issue 15, decision 0130). What a claim reads does not grow with the backlog.

Two statements per lane, each named and described below, run by :func:`read_candidates`:

1. ``dp_claim_tenants`` / ``dp_claim_tenants_paced`` — *which tenants*. A loose index scan (a recursive
   CTE, one probe of ``fires_lane_tenant_due`` per step) walks the tenants with live work in the lane,
   starting where the previous claim of this process stopped (:class:`Rotation`), at most
   :data:`SCAN` steps. For each tenant it reads, by bounded index probes: the oldest
   ``next_attempt_us`` of its live fires (due or not), its attempts in flight in every process
   (``fires_inflight``: at most its in-flight quota plus the plane's slots, never its backlog),
   its in-flight quota and, in a paced lane, its pace bucket. A tenant is *held* when it cannot start
   anything now: at its in-flight quota, or (paced lane) before its pace bucket conforms.
2. ``dp_claim_fires`` — *which fires*: for each chosen tenant at most ``k`` due fires in
   ``next_attempt_us`` order from ``fires_lane_tenant_due`` (a range scan with a LIMIT). On
   PostgreSQL one statement for every tenant (``LATERAL … LIMIT k FOR UPDATE SKIP LOCKED``: the LIMIT
   counts only rows this claim could lock, so concurrent claims take successive parts of each
   tenant's order); on SQLite (one writer, no LATERAL) one statement per tenant.

Then, in Python over that small set, the fair order of decision 0031: oldest first within a
trigger (``rt``), round-robin over a tenant's triggers (``rn``), round-robin across tenants, held
tenants last — ordered by (held, rn, next attempt, tenant), cut at the lane's limit.

Bounds per claim and lane: at most :data:`SCAN` tenant probes, :data:`TENANTS` unheld tenants,
``max(K_MIN, ⌈limit / tenants⌉)`` fires per unheld tenant (one more pass lifts the tenants that had
more when others had fewer: at most ``limit`` fires more), one fire per held tenant (enough for the
shaper to count it waiting and know when its pace conforms). What is given up: round-robin across a
tenant's triggers holds among that tenant's oldest due fires, not over its whole backlog; with more
tenants than one claim takes, tenants are served in rotation over successive claims.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import queries

__all__ = ["CLAIM_QUERIES", "K_MIN", "SCAN", "TENANTS", "Rotation", "TenantRow", "read_candidates"]

#: Tenant probes of one claim per lane (tenants with live work but nothing due count too).
SCAN = 256
#: Unheld tenants with due work one claim takes per lane; the others wait for the next claims.
TENANTS = 64
#: Fires read per unheld tenant at least (room for round-robin over its triggers in small windows).
K_MIN = 8

_LIVE = "state IN ('pending', 'dispatching')"
_F = queries.FIRE_COLS


def _tenants(paced: bool) -> str:
    """The tenant walk (statement 1 of the module docstring). ``:start``: where the walk begins
    (inclusive; '' for the first tenant); ``:stop``: where it ends (exclusive; '' for no end)."""
    tat = ", COALESCE(b.tat_us, 0)" if paced else ", 0"
    bucket = " LEFT JOIN rate_buckets b ON b.key = :lane || ':' || w.tenant_id" if paced else ""
    return (
        "WITH RECURSIVE walk(tenant_id, n) AS ("
        f" SELECT (SELECT tenant_id FROM fires WHERE lane = :lane AND {_LIVE} AND tenant_id >= :start"
        "  ORDER BY tenant_id LIMIT 1), 1"
        " UNION ALL"
        f" SELECT (SELECT f.tenant_id FROM fires f WHERE f.lane = :lane AND f.{_LIVE}"
        "  AND f.tenant_id > w.tenant_id ORDER BY f.tenant_id LIMIT 1), w.n + 1"
        " FROM walk w WHERE w.tenant_id IS NOT NULL AND w.n < :scan AND (:stop = '' OR w.tenant_id < :stop)"
        ") SELECT w.tenant_id,"
        f" (SELECT MIN(x.next_attempt_us) FROM fires x WHERE x.lane = :lane AND x.{_LIVE}"
        "  AND x.tenant_id = w.tenant_id),"
        " (SELECT COUNT(*) FROM fires y WHERE y.tenant_id = w.tenant_id AND y.state = 'dispatching'"
        "  AND y.next_attempt_us > :now_us),"
        f" COALESCE(t.quota_inflight, 100){tat}"
        f" FROM walk w LEFT JOIN tenants t ON t.id = w.tenant_id{bucket}"
        " WHERE w.tenant_id IS NOT NULL AND (:stop = '' OR w.tenant_id < :stop) ORDER BY w.n"
    )


CLAIM_QUERIES: dict[str, str] = {
    "dp_claim_tenants": _tenants(False),
    "dp_claim_tenants_paced": _tenants(True),
    # SQLite: one tenant's oldest due fires (run once per tenant; SQLite has no LATERAL).
    "dp_claim_fires": (
        f"SELECT {_F} FROM fires WHERE lane = :lane AND {_LIVE} AND tenant_id = :tenant_id "
        "AND next_attempt_us <= :now_us ORDER BY next_attempt_us LIMIT :k"
    ),
}

_PG_OVERRIDES: dict[str, str] = {
    # PostgreSQL: every chosen tenant's oldest due fires in one statement, locked as read. ``:batch``
    # is a JSON array of [tenant_id, k].
    "dp_claim_fires": (
        f"SELECT f.* FROM jsonb_array_elements(CAST(:batch AS jsonb)) AS j CROSS JOIN LATERAL ("
        f"SELECT {_F} FROM fires x WHERE x.lane = :lane AND x.{_LIVE} AND x.tenant_id = j->>0 "
        "AND x.next_attempt_us <= :now_us ORDER BY x.next_attempt_us LIMIT CAST(j->>1 AS bigint) "
        "FOR UPDATE SKIP LOCKED) f"
    ),
}

queries.register(CLAIM_QUERIES, {"postgres": _PG_OVERRIDES})


@dataclass
class Rotation:
    """Where the next claim's tenant walk starts, per lane (one per store object, i.e. per process).
    Advanced past the last tenant a claim took when the claim could not take them all, so with more
    tenants than :data:`TENANTS` every tenant is reached within a few claims."""

    start: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TenantRow:
    """A tenant the walk found: its oldest live ``next_attempt_us`` and whether it is held."""

    tenant_id: str
    head_us: int | None
    held: bool


def _walk(c: Any, q: Mapping[str, str], lane: str, now_us: int, paced: bool, start: str,
          stop: str, scan: int) -> tuple[list[TenantRow], str | None]:
    """One walk from ``start`` (inclusive) to ``stop`` (exclusive, '' = none) of at most ``scan``
    tenants: the tenants found and the tenant to resume from when the walk was cut (None: it
    reached its end)."""
    rows = c.execute(q["dp_claim_tenants_paced" if paced else "dp_claim_tenants"], {
        "lane": lane, "now_us": now_us, "start": start, "stop": stop, "scan": scan + 1}).fetchall()
    found = [TenantRow(str(r[0]), None if r[1] is None else int(r[1]),
                       int(r[2]) >= int(r[3]) or (paced and int(r[4]) > now_us)) for r in rows]
    if len(found) > scan:
        return found[:scan], found[scan].tenant_id
    return found, None


def _choose(c: Any, q: Mapping[str, str], lane: str, now_us: int, paced: bool,
            rotation: Rotation) -> list[TenantRow]:
    """The tenants this claim serves in ``lane`` (due ones, at most :data:`TENANTS` unheld), walking
    from the rotation's start and wrapping round once; advances the rotation."""
    start = rotation.start.get(lane, "")
    found, resume = _walk(c, q, lane, now_us, paced, start, "", SCAN)
    if resume is None and start and len(found) < SCAN:
        more, resume = _walk(c, q, lane, now_us, paced, "", start, SCAN - len(found))
        found += more
    chosen: list[TenantRow] = []
    unheld = 0
    for t in found:
        if t.head_us is None or t.head_us > now_us:
            continue   # live work, none of it due yet (leased, or a retry later)
        if not t.held:
            if unheld == TENANTS:
                resume = t.tenant_id
                break
            unheld += 1
        chosen.append(t)
    rotation.start[lane] = resume or ""
    return chosen


def _fires(c: Any, q: Mapping[str, str], lock_batch: bool, lane: str, now_us: int,
           batch: Sequence[tuple[str, int]]) -> dict[str, list[tuple[Any, ...]]]:
    """Each tenant's oldest ``k`` due fires (``batch``: (tenant, k)), by tenant, oldest first."""
    out: dict[str, list[tuple[Any, ...]]] = {t: [] for t, _ in batch}
    if not batch:
        return out
    if lock_batch:
        rows = c.execute(q["dp_claim_fires"], {"lane": lane, "now_us": now_us,
                                            "batch": json.dumps([[t, k] for t, k in batch])}).fetchall()
        for r in rows:
            out[r[0]].append(tuple(r))
        for fs in out.values():
            fs.sort(key=lambda r: r[15])
        return out
    for t, k in batch:
        out[t] = [tuple(r) for r in c.execute(q["dp_claim_fires"], {
            "lane": lane, "now_us": now_us, "tenant_id": t, "k": k}).fetchall()]
    return out


def _fair(fires: Mapping[str, Sequence[tuple[Any, ...]]], held: Mapping[str, bool],
          limit: int) -> list[tuple[Any, ...]]:
    """The fair order over a small set (decision 0031), cut at ``limit``: each row followed by
    ``held`` (0/1) and ``rn`` (its round-robin position within its tenant)."""
    ranked: list[tuple[int, int, int, str, tuple[Any, ...]]] = []
    for tenant, rows in fires.items():
        by_trigger: dict[str, int] = {}
        rt: list[tuple[int, int, str, tuple[Any, ...]]] = []
        for r in sorted(rows, key=lambda r: (r[1], r[2], r[3])):   # trigger, scheduled, seq
            by_trigger[r[1]] = by_trigger.get(r[1], 0) + 1
            rt.append((by_trigger[r[1]], int(r[15]), str(r[1]), r))
        h = 1 if held.get(tenant) else 0
        for rn, (_, nxt, _, r) in enumerate(sorted(rt, key=lambda x: x[:3]), start=1):
            ranked.append((h, rn, nxt, tenant, r))
    ranked.sort(key=lambda x: x[:4])
    return [(*r, h, rn) for h, rn, _, _, r in ranked[:limit]]


def read_candidates(c: Any, q: Mapping[str, str], lane: str, now_us: int, limit: int, paced: bool,
                    rotation: Rotation, *, lock_batch: bool) -> list[tuple[Any, ...]]:
    """Up to ``limit`` due fires of ``lane`` in fair order, each row the fire's columns
    (``queries.FIRE_COLS``) followed by ``held`` and ``rn``; run inside the claim transaction.
    ``lock_batch``: the engine reads every tenant's fires in one statement and locks them
    (PostgreSQL, ``FOR UPDATE SKIP LOCKED``: the engine's ``skip_locked`` capability); else one
    statement per tenant (SQLite, one writer). Reads a bounded number of rows whatever the backlog
    (see the module docstring)."""
    if limit <= 0:
        return []
    tenants = _choose(c, q, lane, now_us, paced, rotation)
    held = {t.tenant_id: t.held for t in tenants}
    unheld = [t.tenant_id for t in tenants if not t.held]
    k = max(K_MIN, math.ceil(limit / max(1, len(unheld))))
    fires = _fires(c, q, lock_batch, lane, now_us, [(t, k) for t in unheld] +
                   [(t.tenant_id, 1) for t in tenants if t.held])
    full = [t for t in unheld if len(fires[t]) >= k]
    short = sum(len(fires[t]) for t in unheld if len(fires[t]) < k)
    if full and short + k * len(full) < limit:
        # Some tenants had fewer due fires than their share: lift the others to fill the window.
        more = min(limit, math.ceil((limit - short) / len(full)))
        fires.update(_fires(c, q, lock_batch, lane, now_us, [(t, more) for t in full]))
    return _fair(fires, held, limit)
