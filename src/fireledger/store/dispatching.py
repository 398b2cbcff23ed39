"""The dispatch plane's store operations (a :class:`~fireledger.store.SqlStore` mixin).

* :meth:`DispatchingMixin.claim_shaped` — one claim transaction for all lanes: the due fires of
  each lane in fair order (oldest first within a trigger, round-robin across a tenant's triggers and
  across tenants), locked with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL so any number of dispatch
  processes share the lanes without double-claiming (on SQLite, one writer, the ranking is read just
  before the write transaction and re-checked inside it); then the rate buckets those fires need
  (locked in key order, so concurrent claims never deadlock), the tenants' quotas and their attempts
  in flight in every process; a caller-supplied *shaper* (``fireledger.dispatch.shaping``) decides;
  the store leases the admitted fires, records their attempts and the new bucket states, and commits.
* :meth:`DispatchingMixin.settle_dispatch` — finish attempts and settle fires (compare-and-set on
  the lease), and for a ``queue`` target put the delivered fire on the tenant's queue in the same
  transaction.
* Queues (``queue_pull``, ``queue_ack``, ``queue_stats``): at-least-once, a visibility timeout,
  ack by fire key. A message references its fire; the payload is read from the registry at pull.
* Outcomes (``record_outcome``, ``get_outcome``, ``outcome_context``): ``work_outcomes`` holds
  ``succeeded`` / ``failed``; no row is ``unknown``. Signed callbacks are replay-guarded by their
  ``webhook-id`` (``callback_receipts``).
* Tenant quotas (``tenant_quota``, ``set_tenant_quota``): the tenants table's columns.

Lists of ids are bound as one JSON array parameter (``json_each`` on SQLite,
``jsonb_array_elements`` on PostgreSQL), so every statement has a fixed text.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from fireledger.domain.instants import MAX_US, MIN_US, after_us, clamp_us
from fireledger.domain.keys import FireKey
from fireledger.domain.model import DispatchJob, Fire, Target, TriggerVersion

from . import queries
from .engine import StoreError

log = logging.getLogger("fireledger.store")

_F = queries.FIRE_COLS
_FF = ", ".join("f." + c.strip() for c in _F.split(","))
_PK_JOIN = ("f.tenant_id = p.tenant_id AND f.trigger_id = p.trigger_id AND f.scheduled_us = p.scheduled_us "
            "AND f.seq = p.seq")
_TARGET_COLS = "id, tenant_id, kind, url, secret, verification_state, verification_token, created_us"
_V_COLS = ("v.trigger_id, v.version, v.tenant_id, v.schedule, v.target_id, v.payload, v.policies, "
           "v.tzdata_version, v.created_us")

def _ranked(paced: bool) -> str:
    """Due fires of a lane ranked fairly: ``rt`` oldest first within a trigger, ``rn`` round-robin
    over a tenant's triggers. ``held`` is 1 for tenants that cannot start anything now — at their
    in-flight quota or, in a paced (recovery) lane, before their pace bucket conforms — so the window
    offered to the shaper starts with fires it can admit, and tenants stuck behind a slow target or
    their pace never crowd out one that may go."""
    pace = " OR b.tat_us > :now_us" if paced else ""
    join = " LEFT JOIN rate_buckets b ON b.key = :lane || ':' || d.tenant_id" if paced else ""
    return (
        "WITH busy AS ("
        "  SELECT tenant_id, COUNT(*) AS n FROM fires WHERE state = 'dispatching' AND next_attempt_us > :now_us"
        "  GROUP BY tenant_id"
        "), due AS ("
        "  SELECT tenant_id, trigger_id, scheduled_us, seq, next_attempt_us,"
        "    ROW_NUMBER() OVER (PARTITION BY tenant_id, trigger_id ORDER BY scheduled_us, seq) AS rt"
        "  FROM fires WHERE lane = :lane AND state IN ('pending', 'dispatching') AND next_attempt_us <= :now_us"
        "), ranked AS ("
        "  SELECT d.tenant_id, d.trigger_id, d.scheduled_us, d.seq, d.next_attempt_us,"
        "    ROW_NUMBER() OVER (PARTITION BY d.tenant_id ORDER BY d.rt, d.next_attempt_us, d.trigger_id) AS rn,"
        f"   CASE WHEN COALESCE(u.n, 0) >= COALESCE(t.quota_inflight, 100){pace} THEN 1 ELSE 0 END AS held"
        "  FROM due d LEFT JOIN busy u ON u.tenant_id = d.tenant_id LEFT JOIN tenants t ON t.id = d.tenant_id"
        f"{join}"
        ")"
    )


_LIVE = "f.lane = :lane AND f.state IN ('pending', 'dispatching') AND f.next_attempt_us <= :now_us"
_ORDER = "held, rn, next_attempt_us, tenant_id"


def _candidates_sqlite(paced: bool) -> str:
    """SQLite (one writer at a time): take the fair prefix, then join it to the fires."""
    return (
        _ranked(paced) + ", pick AS (SELECT tenant_id, trigger_id, scheduled_us, seq, next_attempt_us, rn, held "
        f"FROM ranked ORDER BY {_ORDER} LIMIT :limit) "
        f"SELECT {_FF}, p.held, p.rn FROM pick p JOIN fires f ON {_PK_JOIN} WHERE {_LIVE}"
    )


def _candidates_pg(paced: bool) -> str:
    """PostgreSQL: lock in fair order and let the LIMIT count only the rows this claim could lock, so
    concurrent claims take successive parts of the order instead of colliding on its head.

    The ranking is computed once (``MATERIALIZED``) and walked in order, each row locked by a primary
    key lookup (``LATERAL … FOR UPDATE SKIP LOCKED``) until ``:limit`` rows are locked — a plan that
    does not depend on the table's statistics. (Joining the ranking back to ``fires`` let the
    planner, on a table with fresh or stale statistics, re-run the whole ranking once per due row:
    quadratic in the backlog, so a tenant over its quota never drained on split planes; decision 0120.)"""
    ranked = _ranked(paced).replace("busy AS (", "busy AS MATERIALIZED (", 1)
    ranked = ranked.replace("ranked AS (", "ranked AS MATERIALIZED (", 1)
    lock = _LIVE.replace("f.", "x.")
    return (
        ranked + f" SELECT {_FF}, p.held, p.rn FROM (SELECT * FROM ranked ORDER BY {_ORDER}) p "
        f"CROSS JOIN LATERAL (SELECT {_F} FROM fires x WHERE x.tenant_id = p.tenant_id "
        "AND x.trigger_id = p.trigger_id AND x.scheduled_us = p.scheduled_us AND x.seq = p.seq "
        f"AND {lock} FOR UPDATE SKIP LOCKED) f "
        "ORDER BY p.held, p.rn, p.next_attempt_us, p.tenant_id LIMIT :limit"
    )


_SQLITE_IDS = "SELECT value FROM json_each(:ids)"
_PG_IDS = "SELECT jsonb_array_elements_text(CAST(:ids AS jsonb))"

DISPATCH_QUERIES: dict[str, str] = {
    "dp_candidates": _candidates_sqlite(False),
    "dp_candidates_paced": _candidates_sqlite(True),
    "dp_still_due": (
        f"SELECT {_FF} FROM json_each(:ids) j JOIN fires f ON f.tenant_id = json_extract(j.value, '$[0]') "
        "AND f.trigger_id = json_extract(j.value, '$[1]') AND f.scheduled_us = json_extract(j.value, '$[2]') "
        "AND f.seq = json_extract(j.value, '$[3]') "
        "WHERE f.state IN ('pending', 'dispatching') AND f.next_attempt_us <= :now_us"
    ),
    "dp_bucket_seed": (
        "INSERT INTO rate_buckets (key, tat_us) SELECT value, 0 FROM json_each(:ids) WHERE true "
        "ORDER BY value ON CONFLICT DO NOTHING"
    ),
    "dp_bucket_lock": f"SELECT key, tat_us FROM rate_buckets WHERE key IN ({_SQLITE_IDS}) ORDER BY key",
    "dp_bucket_set": "UPDATE rate_buckets SET tat_us = :tat_us WHERE key = :key",
    "dp_quotas": (
        "SELECT id, quota_fires_per_s, quota_inflight, catchup_fraction FROM tenants "
        f"WHERE id IN ({_SQLITE_IDS})"
    ),
    "dp_inflight": (
        "SELECT tenant_id, COUNT(*) FROM fires WHERE state = 'dispatching' AND next_attempt_us > :now_us "
        f"AND tenant_id IN ({_SQLITE_IDS}) GROUP BY tenant_id"
    ),
    "dp_versions": (
        f"SELECT {_V_COLS} FROM json_each(:ids) j JOIN trigger_versions v "
        "ON v.trigger_id = json_extract(j.value, '$[0]') AND v.version = json_extract(j.value, '$[1]')"
    ),
    "dp_targets": f"SELECT {_TARGET_COLS} FROM targets WHERE id IN ({_SQLITE_IDS})",
    "dp_lease": (
        "UPDATE fires SET state = 'dispatching', lease_owner = :owner, next_attempt_us = :until_us, "
        "attempts = attempts + 1, dispatched_us = COALESCE(dispatched_us, :now_us) "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq AND state IN ('pending', 'dispatching') AND next_attempt_us <= :now_us"
    ),
    # The attempt a lapsed lease left open: no result was recorded (the runner stopped or lost the store).
    "dp_attempt_lapsed": (
        "UPDATE attempts SET finished_us = :now_us, result = 'unknown', "
        "error = 'lease lapsed: no result recorded' WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq AND attempt = :attempt AND finished_us IS NULL"
    ),
    # A fire whose attempts are used up when it comes round again is settled, never leased again.
    "dp_exhausted": (
        "UPDATE fires SET state = :state, cause = CASE WHEN cause IS NULL THEN CAST(:cause AS TEXT) "
        "ELSE CAST(:cause AS TEXT) || '; ' || cause END, finished_us = :now_us, lease_owner = NULL, "
        "next_attempt_us = NULL "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq AND state IN ('pending', 'dispatching') AND next_attempt_us <= :now_us "
        "AND attempts = :attempts"
    ),
    "dp_attempt": (
        "INSERT INTO attempts (tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, node) "
        "VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :attempt, :now_us, :owner) "
        "ON CONFLICT DO NOTHING"
    ),
    "dp_enqueue": (
        "INSERT INTO queue_messages (tenant_id, trigger_id, scheduled_us, seq, target_id, enqueued_us, "
        "visible_us, receives) VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :target_id, :now_us, "
        ":now_us, 0) ON CONFLICT DO NOTHING"
    ),
    "dp_queue_pick": (
        f"SELECT m.tenant_id, m.trigger_id, m.scheduled_us, m.seq, m.receives, {_FF}, v.payload "
        "FROM queue_messages m JOIN fires f ON f.tenant_id = m.tenant_id AND f.trigger_id = m.trigger_id "
        "AND f.scheduled_us = m.scheduled_us AND f.seq = m.seq "
        "JOIN trigger_versions v ON v.trigger_id = f.trigger_id AND v.version = f.version "
        "WHERE m.target_id = :target_id AND m.tenant_id = :tenant_id AND m.visible_us <= :now_us "
        "ORDER BY m.scheduled_us, m.trigger_id, m.seq LIMIT :limit"
    ),
    "dp_queue_hide": (
        "UPDATE queue_messages SET visible_us = :visible_us, receives = receives + 1 "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us "
        "AND seq = :seq"
    ),
    "dp_queue_ack": (
        "DELETE FROM queue_messages WHERE target_id = :target_id AND tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "dp_queue_stats": (
        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN visible_us <= :now_us THEN 1 ELSE 0 END), 0), "
        "MIN(scheduled_us) FROM queue_messages WHERE target_id = :target_id AND tenant_id = :tenant_id"
    ),
    "dp_outcome_context": (
        f"SELECT {_FF}, t.id, t.tenant_id, t.kind, t.url, t.secret, t.verification_state, "
        "t.verification_token, t.created_us FROM fires f "
        "JOIN trigger_versions v ON v.trigger_id = f.trigger_id AND v.version = f.version "
        "JOIN targets t ON t.id = v.target_id "
        "WHERE f.tenant_id = :tenant_id AND f.trigger_id = :trigger_id AND f.scheduled_us = :scheduled_us "
        "AND f.seq = :seq AND t.tenant_id = :tenant_id"
    ),
    "dp_receipts_purge": "DELETE FROM callback_receipts WHERE seen_us < :before_us",
    "dp_receipt": (
        "INSERT INTO callback_receipts (target_id, msg_id, seen_us) VALUES (:target_id, :msg_id, :now_us) "
        "ON CONFLICT DO NOTHING"
    ),
    "dp_outcome_insert": (
        "INSERT INTO work_outcomes (tenant_id, trigger_id, scheduled_us, seq, outcome, reported_us) "
        "VALUES (:tenant_id, :trigger_id, :scheduled_us, :seq, :outcome, :now_us) ON CONFLICT DO NOTHING"
    ),
    "dp_outcome_get": (
        "SELECT outcome, reported_us FROM work_outcomes WHERE tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "dp_quota_get": (
        "SELECT quota_fires_per_s, quota_inflight, catchup_fraction FROM tenants WHERE id = :id "
        "AND deleted_us IS NULL"
    ),
    "dp_quota_set": (
        "UPDATE tenants SET quota_fires_per_s = :fires_per_s, quota_inflight = :inflight, "
        "catchup_fraction = :catchup_fraction WHERE id = :id AND deleted_us IS NULL"
    ),
}

_PG_OVERRIDES: dict[str, str] = {
    "dp_candidates": _candidates_pg(False),
    "dp_candidates_paced": _candidates_pg(True),
    "dp_bucket_seed": (
        "INSERT INTO rate_buckets (key, tat_us) SELECT k, 0 FROM jsonb_array_elements_text(CAST(:ids AS jsonb)) "
        "AS k ORDER BY k ON CONFLICT DO NOTHING"
    ),
    "dp_bucket_lock": f"SELECT key, tat_us FROM rate_buckets WHERE key IN ({_PG_IDS}) ORDER BY key FOR UPDATE",
    "dp_quotas": (
        "SELECT id, quota_fires_per_s, quota_inflight, catchup_fraction FROM tenants "
        f"WHERE id IN ({_PG_IDS})"
    ),
    "dp_inflight": (
        "SELECT tenant_id, COUNT(*) FROM fires WHERE state = 'dispatching' AND next_attempt_us > :now_us "
        f"AND tenant_id IN ({_PG_IDS}) GROUP BY tenant_id"
    ),
    "dp_versions": (
        f"SELECT {_V_COLS} FROM jsonb_array_elements(CAST(:ids AS jsonb)) j JOIN trigger_versions v "
        "ON v.trigger_id = j->>0 AND v.version = CAST(j->>1 AS bigint)"
    ),
    "dp_targets": f"SELECT {_TARGET_COLS} FROM targets WHERE id IN ({_PG_IDS})",
    "dp_queue_pick": DISPATCH_QUERIES["dp_queue_pick"] + " FOR UPDATE OF m SKIP LOCKED",
    "dp_still_due": (   # (SQLite's path; PostgreSQL locks its candidates in the ranking query itself)
        f"SELECT {_FF} FROM jsonb_array_elements(CAST(:ids AS jsonb)) j JOIN fires f ON f.tenant_id = j->>0 "
        "AND f.trigger_id = j->>1 AND f.scheduled_us = CAST(j->>2 AS bigint) AND f.seq = CAST(j->>3 AS bigint) "
        "WHERE f.state IN ('pending', 'dispatching') AND f.next_attempt_us <= :now_us"
    ),
}

queries.register(DISPATCH_QUERIES, {"postgres": _PG_OVERRIDES})

ON_TIME = "on-time"
#: Outcomes a work outcome row may hold (no row = ``unknown``).
OUTCOMES = ("succeeded", "failed")


@dataclass(frozen=True, slots=True)
class ClaimSnapshot:
    """What a shaper decides from, read inside the claim transaction.

    ``candidates``: per lane, due fires in fair order (already locked on PostgreSQL);
    ``quotas``: tenant → (fires/s, in flight, catch-up fraction); ``inflight``: tenant → attempts
    in flight in every process; ``tats``: bucket key → state (see ``fireledger.dispatch.shaping``).
    """

    now_us: int
    candidates: Mapping[str, Sequence[Fire]]
    quotas: Mapping[str, tuple[float, int, float]]
    inflight: Mapping[str, int]
    tats: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ShapedDecision:
    """A shaper's answer: the fires to lease (each with its service class) and changed buckets."""

    admitted: Sequence[tuple[Fire, str]]
    tats: Mapping[str, int]
    wake_us: int | None = None
    waiting: Mapping[str, int] = field(default_factory=dict)


class Shaper(Protocol):
    def bucket_keys(self, candidates: Mapping[str, Sequence[Fire]]) -> list[str]:
        """Every rate bucket :meth:`decide` may read or charge, sorted."""
        ...

    def decide(self, snapshot: ClaimSnapshot) -> ShapedDecision:
        ...


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A leased fire and the class it was admitted as (``on-time``, ``over-quota``, …)."""

    job: DispatchJob
    admission: str


@dataclass
class RankCache:
    """The fair order of a large backlog, kept between claim rounds of one dispatcher (SQLite).

    Ranking a lane's whole backlog costs time proportional to the backlog (≈100 ms at 10,000 due
    fires on this machine class) while a round admits a few hundred, so a burst used to be ranked
    again for every round. With a cache, a lane is ranked ``depth`` fires deep and later rounds take
    the next candidates from that order (re-checked live and due inside the write transaction, as
    always) until fewer than a round's worth remain or the order is too old: older than
    ``max_age_us`` and than ``cost_factor`` times what the last ranking took. The cost is bounded
    staleness: a fire committed after the ranking — or a tenant whose quota freed up — is placed in
    the order at the next ranking, at most that age later (decision 0074).
    """

    max_age_us: int = 200_000
    depth: int = 4096
    #: The order may also be kept for this many times what ranking it cost, so ranking never takes
    #: more than about a tenth of the claim thread's time however large the backlog.
    cost_factor: int = 10
    lanes: dict[str, tuple[int, list[Fire]]] = field(default_factory=dict)   # lane → (ranked at, order)
    rankings: int = 0   # how many times a non-empty lane was ranked (observability and tests)
    last_cost_us: int = 0   # what the last ranking took (a cost measurement, not a time of day)

    def take(self, lane: str, now_us: int, limit: int) -> list[Fire] | None:
        """The next ``limit`` candidates of ``lane`` from a fresh enough order, else None (rank)."""
        entry = self.lanes.get(lane)
        age_limit = max(self.max_age_us, self.cost_factor * self.last_cost_us)
        if entry is None or now_us - entry[0] > age_limit or len(entry[1]) < limit:
            return None
        return entry[1][:limit]

    def keep(self, lane: str, now_us: int, ranked: list[Fire], cost_us: int = 0) -> None:
        self.lanes[lane] = (now_us, ranked)
        if ranked:
            self.rankings += 1
            self.last_cost_us = cost_us

    def settle(self, lane: str, offered: Sequence[Fire], gone: set[tuple[str, str, int, int]]) -> None:
        """Drop from the order the offered candidates that were leased or are no longer due; those
        left waiting by the shaper keep their place at the front."""
        entry = self.lanes.get(lane)
        if entry is None:
            return
        head = [f for f in offered if _pk(f) not in gone]
        self.lanes[lane] = (entry[0], head + entry[1][len(offered):])


@dataclass(frozen=True, slots=True)
class ClaimResult:
    jobs: list[ClaimedJob]
    wake_us: int | None
    waiting: Mapping[str, int]
    offered: Mapping[str, int]   # candidates offered to the shaper, per lane


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """A message handed to a queue consumer: its fire, the fire's payload (bytes as stored), how
    many times it has been handed out (this one included) and until when it stays hidden."""

    fire: Fire
    payload: bytes
    receives: int
    visible_until_us: int

    @property
    def key(self) -> FireKey:
        f = self.fire
        return FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)


class OutcomeRejected(StoreError):
    """A signed outcome callback that cannot be recorded: ``reason`` is ``replayed`` (this
    ``webhook-id`` was already accepted) or ``conflict`` (another outcome is already recorded)."""

    def __init__(self, reason: str, recorded: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.recorded = recorded


def _pk(f: Fire) -> tuple[str, str, int, int]:
    return (f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)


def _ids(values: Sequence[str] | set[str]) -> str:
    return json.dumps(sorted(values))


def _key_params(f: Fire | FireKey) -> dict[str, Any]:
    return {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us, "seq": f.seq}


class DispatchingMixin:
    """Store methods of the dispatch plane (see the module docstring). Uses ``self.engine``/``self.q``."""

    engine: Any
    q: dict[str, str]

    # --- claim ----------------------------------------------------------------------------------

    def claim_shaped(self, now_us: int, owner: str, fetch: Mapping[str, int], shaper: Shaper,
                     lease_margin_us: int, cache: RankCache | None = None) -> ClaimResult:
        """Lease the fires ``shaper`` admits, in one transaction (see the module docstring).

        ``fetch`` maps a lane to how many candidates to offer from it (0 or absent: none). Each
        admitted fire goes ``dispatching``, leased to ``owner`` until its attempt's deadline
        (``now + timeout``) plus ``lease_margin_us``, with its attempt counter raised and an attempt
        row started; a runner that dies leaves the lease to expire and the fire to be claimed again
        as a further attempt under the same key.

        ``cache`` (SQLite only; ignored on PostgreSQL, where the order is read under ``SKIP LOCKED``
        inside the transaction) lets a dispatcher reuse one ranking of a large backlog over several
        rounds (:class:`RankCache`).
        """
        ranked_first = self.engine.name == "sqlite"
        if ranked_first:
            # SQLite has one writer: rank outside the write transaction (WAL readers block no one,
            # so the timing loop keeps committing while a large backlog is ranked), then keep, in
            # the transaction, only the candidates that are still live and due.
            pre = {}
            to_rank = {}
            for lane, limit in fetch.items():
                # Only the on-time lane's order is kept between rounds: the recovery lanes are paced
                # and drained in the published shedding order, which must see their fires as they are.
                use_cache = cache is not None and lane == ON_TIME
                cached = cache.take(lane, now_us, limit) if use_cache and cache is not None and limit > 0 else None
                if cached is None:
                    to_rank[lane] = max(limit, cache.depth) if use_cache and cache is not None else limit
                else:
                    pre[lane] = cached
            if to_rank:
                started = time.perf_counter_ns()
                with self.engine.read() as c:
                    ranked = self._ranked_candidates(c, now_us, to_rank)
                cost_us = (time.perf_counter_ns() - started) // 1000
                for lane, fires in ranked.items():
                    if cache is not None and lane == ON_TIME:
                        cache.keep(lane, now_us, fires, cost_us)
                    pre[lane] = fires[:fetch[lane]]
        try:
            return self._claim_in_transaction(now_us, owner, fetch, shaper, lease_margin_us,
                                              pre if ranked_first else None, cache)
        except BaseException:
            if cache is not None:
                cache.lanes.clear()   # the order may be stale in unknown ways: rank afresh
            raise

    def _claim_in_transaction(self, now_us: int, owner: str, fetch: Mapping[str, int], shaper: Shaper,
                              lease_margin_us: int, pre: dict[str, list[Fire]] | None,
                              cache: RankCache | None) -> ClaimResult:
        q = self.q
        with self.engine.write() as c:
            if pre is not None:
                keys_json = json.dumps([[f.tenant_id, f.trigger_id, f.scheduled_us, f.seq]
                                        for fs in pre.values() for f in fs])
                fresh = {(r[0], r[1], r[2], r[3]): Fire(*r) for r in c.execute(
                    q["dp_still_due"], {"ids": keys_json, "now_us": now_us}).fetchall()}
                cands = {lane: [fresh[k] for k in (_pk(f) for f in fs) if k in fresh] for lane, fs in pre.items()}
                # Another claimer (a thread or process sharing the file) took most of this order
                # between the ranking and the lock: rank that lane again, now under the lock, so a
                # contended round still offers what is due instead of coming back empty.
                short = {lane: fetch[lane] for lane, fs in pre.items() if fs and 2 * len(cands[lane]) < len(fs)}
                if short:
                    cands.update(self._ranked_candidates(c, now_us, short))
                    if cache is not None:
                        for lane in short:
                            cache.lanes.pop(lane, None)
            else:
                cands = self._ranked_candidates(c, now_us, fetch)
            offered = {lane: len(v) for lane, v in cands.items()}
            if not any(offered.values()):
                if cache is not None and pre is not None:
                    for lane, fs in pre.items():
                        cache.settle(lane, fs, {_pk(f) for f in fs})
                return ClaimResult([], None, {}, offered)
            keys = shaper.bucket_keys(cands)
            tats: dict[str, int] = {}
            if keys:
                c.execute(q["dp_bucket_seed"], {"ids": json.dumps(keys)})
                tats = {k: int(t) for k, t in c.execute(q["dp_bucket_lock"], {"ids": json.dumps(keys)}).fetchall()}
            tenants = {f.tenant_id for fs in cands.values() for f in fs}
            quotas = {r[0]: (float(r[1]), int(r[2]), float(r[3]))
                      for r in c.execute(q["dp_quotas"], {"ids": _ids(tenants)}).fetchall()}
            inflight = {r[0]: int(r[1]) for r in c.execute(
                q["dp_inflight"], {"ids": _ids(tenants), "now_us": now_us}).fetchall()}
            decision = shaper.decide(ClaimSnapshot(now_us, cands, quotas, inflight, tats))
            jobs = self._lease(c, now_us, owner, decision.admitted, lease_margin_us)
            if decision.tats:
                c.cursor().executemany(q["dp_bucket_set"], [
                    {"key": k, "tat_us": int(v)} for k, v in sorted(decision.tats.items())])
        if cache is not None and pre is not None:
            leased = {_pk(f) for f, _ in decision.admitted}
            for lane, fs in pre.items():
                live = {_pk(f) for f in cands.get(lane, ())}
                cache.settle(lane, fs, {k for k in map(_pk, fs) if k in leased or k not in live})
        return ClaimResult(jobs, decision.wake_us, dict(decision.waiting), offered)

    def _ranked_candidates(self, c: Any, now_us: int, fetch: Mapping[str, int]) -> dict[str, list[Fire]]:
        q = self.q
        cands: dict[str, list[Fire]] = {}
        for lane, limit in fetch.items():
            if limit <= 0:
                continue
            query = q["dp_candidates"] if lane == ON_TIME else q["dp_candidates_paced"]
            rows = c.execute(query, {"lane": lane, "now_us": now_us, "limit": limit}).fetchall()
            rows = sorted(rows, key=lambda r: (r[-2], r[-1], r[15], r[0]))   # held, rn, next attempt, tenant
            cands[lane] = [Fire(*r[:-2]) for r in rows]
        return cands

    def _lease(self, c: Any, now_us: int, owner: str, admitted: Sequence[tuple[Fire, str]],
               lease_margin_us: int) -> list[ClaimedJob]:
        if not admitted:
            return []
        q = self.q
        pairs = sorted({(f.trigger_id, f.version) for f, _ in admitted})
        versions: dict[tuple[str, int], TriggerVersion] = {}
        from .sql_store import _version  # the row → TriggerVersion mapping lives with the registry

        for row in c.execute(q["dp_versions"], {"ids": json.dumps(pairs)}).fetchall():
            v = _version(row)
            versions[(v.trigger_id, v.version)] = v
        targets = {r[0]: Target(*r) for r in c.execute(
            q["dp_targets"], {"ids": _ids({v.target_id for v in versions.values()})}).fetchall()}
        jobs: list[ClaimedJob] = []
        leases: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        lapsed: list[dict[str, Any]] = []
        for f, admission in admitted:
            found = versions.get((f.trigger_id, f.version))
            t = targets.get(found.target_id) if found is not None else None
            if found is None or t is None:
                continue   # cannot happen (foreign keys); never lease what cannot be described
            v = found
            if f.state == "dispatching" and f.attempts > 0:
                # A lapsed lease: its attempt recorded no result. The request may have reached the
                # target, so that attempt is ``unknown`` (invariant 9).
                lapsed.append({**_key_params(f), "attempt": f.attempts, "now_us": now_us})
            if f.attempts >= v.policies.max_attempts:
                # The attempt limit holds at claim time too: a fire whose last attempt's lease lapsed
                # (or that is somehow due with no attempt left) is settled, never leased again.
                self._settle_exhausted(c, f, v.policies.max_attempts, now_us)
                continue
            until = after_us(now_us, v.policies.timeout_s) + lease_margin_us
            p = {**_key_params(f), "owner": owner, "until_us": clamp_us(until), "now_us": now_us}
            leases.append(p)
            attempts.append({**_key_params(f), "attempt": f.attempts + 1, "now_us": now_us, "owner": owner})
            leased = replace(f, state="dispatching", attempts=f.attempts + 1, next_attempt_us=until,
                             dispatched_us=f.dispatched_us if f.dispatched_us is not None else now_us)
            jobs.append(ClaimedJob(DispatchJob(leased, leased.attempts, t, v.payload, v.policies, owner, until,
                                               v.schedule), admission))
        cur = c.cursor()
        if lapsed:
            cur.executemany(q["dp_attempt_lapsed"], lapsed)
        if not leases:
            return jobs
        # On PostgreSQL every row is already locked by this transaction (SKIP LOCKED), on SQLite the
        # write lock is held: each update matches exactly its row, which the total checks.
        cur.executemany(q["dp_lease"], leases)
        if cur.rowcount != len(leases):
            raise StoreError(f"leasing {len(leases)} fires matched {cur.rowcount} rows")
        cur.executemany(q["dp_attempt"], attempts)
        return jobs

    # --- claim-time attempt limit ------------------------------------------------------------------

    def _settle_exhausted(self, c: Any, f: Fire, max_attempts: int, now_us: int) -> None:
        """Settle a due fire that has no attempt left instead of leasing it: ``unknown`` when its last
        attempt's lease lapsed (that request may have reached the target, invariant 9), else
        ``failed``; the cause says which."""
        if f.state == "dispatching":
            state = "unknown"
            cause = (f"unknown: attempt {f.attempts} of {max_attempts} recorded no result before its lease "
                     "lapsed (the dispatch process stopped or lost the store) and no attempts are left")
        else:
            state = "failed"
            cause = f"failed: no attempts left ({f.attempts} of {max_attempts} made)"
        c.execute(self.q["dp_exhausted"], {**_key_params(f), "state": state, "cause": cause, "now_us": now_us,
                                           "attempts": f.attempts})

    # --- settle ---------------------------------------------------------------------------------

    def settle_dispatch(self, items: Sequence[Any], now_us: int) -> list[bool]:
        """Finish each attempt and settle its fire in one transaction (``Settlement`` items).

        Compare-and-set on (state, lease owner, attempt number): False for an item whose lease was
        lost (another runner owns the fire now); its attempt row is still finished. A fire delivered
        to a ``queue`` target is put on that queue here, in the same transaction, once (the message's
        key is the fire key).

        No item can hold back the others (invariant 15): a ``next_attempt_us`` outside the
        representable range is clamped into it (:mod:`fireledger.domain.instants`); when the batch
        is refused as a whole, each item is recorded on its own (a savepoint each), and an item the
        store still refuses is *set aside*: its attempt is finished and its fire settled ``failed``
        with a cause naming the error class (never a value), and False is returned for it. Only an
        error that is not the item's (the store is down) raises, with nothing recorded.
        """
        items = [it if it.next_attempt_us is None or MIN_US <= it.next_attempt_us <= MAX_US
                 else replace(it, next_attempt_us=clamp_us(it.next_attempt_us)) for it in items]
        out: list[bool] = []
        with self.engine.write() as c:
            try:
                if self._settle_all(c, items, now_us):
                    return [True] * len(items)
            except Exception as exc:   # refused as a whole (rolled back to its savepoint): item by item
                log.warning("recording %d attempt results in bulk failed (%s); recording them one by one",
                            len(items), type(exc).__name__)
            for it in items:
                out.append(self._settle_guarded(c, it, now_us))
        return out

    def _settle_one(self, c: Any, it: Any, now_us: int) -> bool:
        q = self.q
        f = it.job.fire
        key = _key_params(f)
        c.execute(q["finish_attempt"], {
            **key, "attempt": it.job.attempt, "finished_us": now_us, "result": it.result,
            "http_status": it.http_status, "error": it.error})
        terminal = it.state != "pending"
        n = c.execute(q["settle_fire"], {
            **key, "state": it.state, "cause": it.cause, "next_attempt_us": it.next_attempt_us,
            "finished_us": now_us if terminal else None, "owner": it.job.lease_owner,
            "attempt": it.job.attempt}).rowcount
        if n > 1:
            raise StoreError(f"settle_fire matched {n} rows")
        ok = bool(n == 1)
        if ok and it.state == "delivered" and it.job.target.kind == "queue":
            c.execute(q["dp_enqueue"], {**key, "target_id": it.job.target.id, "now_us": now_us})
        return ok

    def _settle_guarded(self, c: Any, it: Any, now_us: int) -> bool:
        """One item in its own savepoint; set aside (see :meth:`settle_dispatch`) when refused. A
        failure to roll back to the savepoint (the connection is gone) propagates."""
        c.execute("SAVEPOINT settle_item")
        try:
            ok = self._settle_one(c, it, now_us)
        except Exception as exc:
            c.execute("ROLLBACK TO SAVEPOINT settle_item")
            c.execute("RELEASE SAVEPOINT settle_item")
            what = type(exc).__name__
            f = it.job.fire
            log.error("the result of attempt %d of a fire of trigger %s could not be recorded (%s); "
                      "the fire is set aside as failed", it.job.attempt, f.trigger_id, what)
            aside = replace(it, http_status=None, error=f"not recorded: {what}", state="failed",
                            cause=(f"failed: the result of attempt {it.job.attempt} ({it.result}) could not be "
                                   f"recorded ({what}); the fire was set aside"), next_attempt_us=None)
            c.execute("SAVEPOINT settle_item")
            try:
                self._settle_one(c, aside, now_us)
            except Exception as again:
                c.execute("ROLLBACK TO SAVEPOINT settle_item")
                log.error("setting the fire aside failed too (%s); its lease will lapse", type(again).__name__)
            c.execute("RELEASE SAVEPOINT settle_item")
            return False
        c.execute("RELEASE SAVEPOINT settle_item")
        return ok

    def _settle_all(self, c: Any, items: Sequence[Any], now_us: int) -> bool:
        """The common case in bulk: every lease still held and no queue put. Two batched statements
        in a savepoint; when the settle count differs (a lease was lost) the savepoint is rolled
        back, False returned and the caller settles item by item (each statement matches at most
        its own row, so a total equal to the number of items means each matched once). When a
        statement raises, the savepoint is rolled back and the error raised."""
        if not items or any(it.state == "delivered" and it.job.target.kind == "queue" for it in items):
            return False
        q = self.q
        finishes, settles = [], []
        for it in items:
            key = _key_params(it.job.fire)
            finishes.append({**key, "attempt": it.job.attempt, "finished_us": now_us, "result": it.result,
                             "http_status": it.http_status, "error": it.error})
            settles.append({**key, "state": it.state, "cause": it.cause, "next_attempt_us": it.next_attempt_us,
                            "finished_us": now_us if it.state != "pending" else None,
                            "owner": it.job.lease_owner, "attempt": it.job.attempt})
        cur = c.cursor()
        cur.execute("SAVEPOINT settle_bulk")
        try:
            cur.executemany(q["settle_fire"], settles)
            if cur.rowcount != len(settles):
                cur.execute("ROLLBACK TO SAVEPOINT settle_bulk")
                cur.execute("RELEASE SAVEPOINT settle_bulk")
                return False
            cur.executemany(q["finish_attempt"], finishes)
        except Exception:
            cur.execute("ROLLBACK TO SAVEPOINT settle_bulk")
            cur.execute("RELEASE SAVEPOINT settle_bulk")
            raise
        cur.execute("RELEASE SAVEPOINT settle_bulk")
        return True

    # --- queues ---------------------------------------------------------------------------------

    def queue_pull(self, tenant_id: str, target_id: str, now_us: int, limit: int,
                   visibility_us: int) -> list[QueueMessage]:
        """Hand out up to ``limit`` visible messages of a queue, oldest scheduled instant first, and
        hide them until ``now + visibility_us`` (a message not acked by then is handed out again:
        at-least-once). Concurrent consumers never receive the same message within its visibility
        (``SKIP LOCKED`` on PostgreSQL)."""
        q = self.q
        until = now_us + visibility_us
        out: list[QueueMessage] = []
        with self.engine.write() as c:
            rows = c.execute(q["dp_queue_pick"], {"tenant_id": tenant_id, "target_id": target_id,
                                                  "now_us": now_us, "limit": limit}).fetchall()
            params = []
            for r in rows:
                fire = Fire(*r[5:-1])
                params.append({**_key_params(fire), "visible_us": until})
                out.append(QueueMessage(fire, bytes(r[-1]), int(r[4]) + 1, until))
            if params:
                c.cursor().executemany(q["dp_queue_hide"], params)
        return out

    def queue_ack(self, tenant_id: str, target_id: str, keys: Sequence[FireKey]) -> list[bool]:
        """Remove acked messages (by fire key); False for a key not on this queue (already acked,
        or never delivered to it)."""
        out = []
        with self.engine.write() as c:
            for k in keys:
                if k.tenant_id != tenant_id:
                    out.append(False)
                    continue
                n = c.execute(self.q["dp_queue_ack"], {**_key_params(k), "target_id": target_id}).rowcount
                out.append(n == 1)
        return out

    def queue_stats(self, tenant_id: str, target_id: str, now_us: int) -> tuple[int, int, int | None]:
        """(messages, of which visible now, oldest scheduled instant or None)."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_queue_stats"], {"tenant_id": tenant_id, "target_id": target_id,
                                                       "now_us": now_us}).fetchone()
        return int(row[0]), int(row[1]), None if row[2] is None else int(row[2])

    # --- outcomes -------------------------------------------------------------------------------

    def outcome_context(self, key: FireKey) -> tuple[Fire, Target] | None:
        """The fire and the target its version dispatches to (whose secret signs callbacks)."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_outcome_context"], _key_params(key)).fetchone()
        if not row:
            return None
        return Fire(*row[:16]), Target(*row[16:])

    def record_outcome(self, key: FireKey, outcome: str, now_us: int, *, target_id: str, msg_id: str,
                       replay_window_us: int) -> bool:
        """Record a work outcome reported by a verified callback, in one transaction.

        Returns True when recorded now, False when the same outcome was already recorded (an
        idempotent repeat). Raises :class:`OutcomeRejected` — and records nothing — when this
        ``msg_id`` was already accepted for this target within the replay window (``replayed``), or
        a different outcome is already recorded (``conflict``). Receipts older than twice the window
        are purged as a side effect.
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}")
        q = self.q
        with self.engine.write() as c:   # raising inside rolls the receipt back too
            c.execute(q["dp_receipts_purge"], {"before_us": now_us - 2 * replay_window_us})
            fresh = c.execute(q["dp_receipt"], {"target_id": target_id, "msg_id": msg_id,
                                                "now_us": now_us}).rowcount
            if fresh != 1:
                raise OutcomeRejected("replayed")
            n = c.execute(q["dp_outcome_insert"], {**_key_params(key), "outcome": outcome,
                                                   "now_us": now_us}).rowcount
            if n == 1:
                return True
            row = c.execute(q["dp_outcome_get"], _key_params(key)).fetchone()
            if row is not None and row[0] != outcome:
                raise OutcomeRejected("conflict", str(row[0]))
            return False

    def get_outcome(self, key: FireKey) -> tuple[str, int] | None:
        """(outcome, reported_us), or None: no outcome reported (``unknown``)."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_outcome_get"], _key_params(key)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    # --- tenant quotas --------------------------------------------------------------------------

    def tenant_quota(self, tenant_id: str) -> tuple[float, int, float] | None:
        """(fires/s, attempts in flight, catch-up fraction) of a live tenant."""
        with self.engine.read() as c:
            row = c.execute(self.q["dp_quota_get"], {"id": tenant_id}).fetchone()
        return None if row is None else (float(row[0]), int(row[1]), float(row[2]))

    def set_tenant_quota(self, tenant_id: str, *, fires_per_s: float | None = None, inflight: int | None = None,
                         catchup_fraction: float | None = None, actor: str | None = None,
                         now_us: int = 0) -> tuple[float, int, float] | None:
        """Change a tenant's quota (unset parts keep their value); returns the prior quota, or None
        for no such tenant. ``fires_per_s`` > 0, ``inflight`` ≥ 1, ``0 < catchup_fraction ≤ 1``
        (``ValueError`` naming the field otherwise). Takes effect at the next claim. With ``actor``,
        the change is audited (action ``tenant.quota``, prior and new values) in the same
        transaction (seed ADR-15: a quota change multiplies work)."""
        if fires_per_s is not None and not (fires_per_s > 0 and fires_per_s < float("inf")):
            raise ValueError("fires_per_s must be a finite number > 0")
        if inflight is not None and (isinstance(inflight, bool) or not isinstance(inflight, int) or inflight < 1):
            raise ValueError("inflight must be an integer >= 1")
        if catchup_fraction is not None and not 0 < catchup_fraction <= 1:
            raise ValueError("catchup_fraction must be > 0 and <= 1")
        with self.engine.write() as c:
            row = c.execute(self.q["dp_quota_get"], {"id": tenant_id}).fetchone()
            if row is None:
                return None
            prior = (float(row[0]), int(row[1]), float(row[2]))
            new = (prior[0] if fires_per_s is None else float(fires_per_s),
                   prior[1] if inflight is None else inflight,
                   prior[2] if catchup_fraction is None else float(catchup_fraction))
            c.execute(self.q["dp_quota_set"], {"id": tenant_id, "fires_per_s": new[0], "inflight": new[1],
                                               "catchup_fraction": new[2]})
            audit = getattr(self, "_append_audit", None)
            if actor is not None and audit is not None:
                names = ("fires_per_s", "inflight", "catchup_fraction")
                audit(c, tenant_id, actor, "tenant.quota", now_us, dict(zip(names, prior, strict=True)),
                      dict(zip(names, new, strict=True)))
        return prior


__all__ = [
    "OUTCOMES",
    "ClaimResult",
    "ClaimSnapshot",
    "ClaimedJob",
    "DispatchingMixin",
    "OutcomeRejected",
    "QueueMessage",
    "RankCache",
    "ShapedDecision",
    "Shaper",
]

