"""Partition leases across timing nodes: sessions, balance, takeover, routine reassignment, shedding.

Each timing node runs one :class:`LeaseManager`. Every ``cycle_s`` it

1. reads its clock and renews its **session** (its ``nodes`` row, heartbeat = the interval's earliest
   bound) together with every lease it holds (expiry = earliest + ``lease_ttl_s``), in one
   transaction — or, while its ε is over the ceiling, releases them all (**shedding**: it keeps its
   session, keeps serving reads and metrics, and rejoins after ``rejoin_after_s`` of healthy clock);
2. reads the lease table and the sessions, and computes its fair share: live, non-shedding nodes
   sorted by id; node *i* of *k* gets ``n // k`` partitions, one more when ``i < n % k``;
3. releases what it holds beyond its share (longest held first) and, routinely, partitions held
   longer than ``rotate_after_s`` (× 1-1.5, staggered per partition), each offered to the live node
   furthest below its share (``handoff_to``);
4. takes the partitions offered to it, then — up to its share — free partitions, partitions whose
   lease expired and partitions whose owner's session expired, each by compare-and-set on the row's
   ``rev``. The handover's duration (from the release, or from the previous owner's last renewal) is
   recorded on the row and in ``fireledger_lease_takeover_seconds``.

**When may a node claim?** A lease is taken from another node only when the taker's *earliest*
bound is past the lease's expiry or past the owner's heartbeat + ``session_ttl_s`` — both stamped
with the owner's earliest bound at renewal. The owner therefore stops claiming at
``renewal start (monotonic) + min(session_ttl, lease_ttl) − 2ε − guard``: by then true time cannot
have reached either expiry by any clock within its bound (the margin is ≥ ε, as the seed asks), and
``guard`` covers a claim transaction in flight. A node that cannot renew simply runs out of time.
Leases are imperfect on purpose: a decision committed late by a paused owner collides with the new
owner's on the fire key and loses (``INSERT … ON CONFLICT DO NOTHING``, then the due-row CAS fails).

Kill -9 of an owner is therefore taken over ≈ ``session_ttl_s`` (+ one cycle) after its last
heartbeat; a clean stop releases everything at once; routine reassignment hands over within a cycle.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fireledger.clock import Clock, Interval
from fireledger.domain.timing_records import Grant, Lease, NodeSession
from fireledger.observe.metrics import METRICS
from fireledger.settings import LeaseSettings  # the lease timing, read with every other setting
from fireledger.store import Store
from fireledger.waker import Waker

log = logging.getLogger("fireledger.timing.leases")

S = 1_000_000


@dataclass(frozen=True, slots=True)
class Ownership:
    """What a node may claim: ``partitions`` of a keyspace of ``n``, until ``valid_until`` (monotonic s).

    A due row belongs to partition ``row.partition % n`` (a row stored before a count change is
    still claimed by exactly one owner)."""

    partitions: frozenset[int]
    n: int
    valid_until: float

    def valid(self, mono: float) -> bool:
        return bool(self.partitions) and mono < self.valid_until

    def owns(self, stored_partition: int) -> bool:
        return stored_partition % self.n in self.partitions


NO_OWNERSHIP = Ownership(frozenset(), 256, 0.0)


@dataclass
class CycleReport:
    """What one cycle did (for tests, logs and the falsification suite)."""

    held: int = 0
    quota: int = 0
    live: int = 0
    shedding: bool = False
    granted: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    rotated: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    correlated_excursion: bool = False
    error: str | None = None


def quota_for(node_id: str, active: list[str], n: int) -> int:
    """The fair share of ``node_id`` among ``active`` (sorted) nodes for ``n`` partitions."""
    if node_id not in active:
        return 0
    k = len(active)
    i = active.index(node_id)
    return n // k + (1 if i < n % k else 0)


def _spread(key: str) -> float:
    """A stable number in [0, 1) from ``key`` (staggers rotation, orders contested takeovers)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") / 2**32


@dataclass(frozen=True, slots=True)
class _Cluster:
    """The lease table and the sessions as one cycle read them."""

    table: list[Lease]
    sessions: list[NodeSession]
    live: dict[str, NodeSession]   # by id: not stopped, heartbeat within session_ttl_s
    active: list[str]              # live and not shedding, sorted by id


def _choose_grants(offered: list[Grant], free: list[tuple[float, Grant]], dead: list[tuple[float, Grant]],
                   want: int, grace_us: int, now: int) -> list[Grant]:
    """The leases to ask for: every offered one, then up to ``want`` in all from free (released
    earliest first) and dead (by spread) — plus, as a liveness backstop, any partition free for
    longer than ``grace_us`` whatever the share."""
    grants = list(offered)
    budget = want - len(offered)
    free.sort(key=lambda x: (x[0], x[1].partition))
    dead.sort(key=lambda x: x[0])
    for _, g in [*free, *dead]:
        if budget <= 0:
            break
        grants.append(g)
        budget -= 1
    taken = {g.partition for g in grants}
    for freed_us, g in free:
        if g.partition not in taken and freed_us and freed_us + grace_us <= now:
            grants.append(g)
    return grants


class LeaseManager:
    """One timing node's leases (see the module docstring). ``cycle()`` is one synchronous step —
    tests drive it with a fake clock; ``run()`` repeats it on a thread until stopped."""

    def __init__(self, store: Store, clock: Clock, node_id: str, settings: LeaseSettings | None = None, *,
                 role: str = "timing", on_change: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.settings = settings or LeaseSettings()
        self.role = role
        self.on_change = on_change
        #: Held by the timing loop around each commit; a release waits for it (no commit of a
        #: partition can be in flight once its release is written).
        self.claim_lock = threading.Lock()
        self._own = NO_OWNERSHIP
        self._own_lock = threading.Lock()
        self._shedding = False
        self._healthy_since: float | None = None
        self._released_at: dict[int, float] = {}
        self._started_us: int | None = None
        self._cycles = 0
        self.last: CycleReport | None = None
        self._excursion_logged = False

    # --- what the timing loop reads ----------------------------------------------------------

    def ownership(self) -> Ownership:
        with self._own_lock:
            return self._own

    def _set_ownership(self, parts: frozenset[int], n: int, valid_until: float) -> None:
        with self._own_lock:
            self._own = Ownership(parts, n, valid_until)
        METRICS.partitions_owned.labels(self.node_id).set(len(parts))

    def _drop(self, parts: set[int]) -> None:
        """Stop claiming ``parts`` now, then wait until no commit that could include them is in flight."""
        if not parts:
            return
        with self._own_lock:
            own = self._own
            self._own = Ownership(own.partitions - parts, own.n, own.valid_until)
        with self.claim_lock:
            pass
        METRICS.partitions_owned.labels(self.node_id).set(len(self._own.partitions))

    @property
    def shedding(self) -> bool:
        return self._shedding

    # --- one cycle ---------------------------------------------------------------------------

    def cycle(self) -> CycleReport:
        """Renew, shed or rejoin, rebalance, rotate and take over (see the module docstring).

        One synchronous step; returns what it did (also kept as ``last``). A shedding node renews
        its session only and reports ``held == 0``; otherwise the steps run in the module
        docstring's order: renew, read the cluster, release (share, rotation), take over."""
        rep = CycleReport()
        iv = self.clock.now()
        m0 = self.clock.monotonic()
        now = iv.earliest_us
        if self._started_us is None:
            self._started_us = now
        shedding = self._shed_or_rejoin(iv, m0)
        rep.shedding = shedding
        held_now, n = self._renew(iv, m0, shedding, rep)
        cluster = self._read_cluster(now, n, rep)
        if shedding:
            rep.held = 0
            self.last = rep
            return rep
        quota = quota_for(self.node_id, cluster.active, n)
        rep.quota = quota
        release = self._plan_releases(cluster, n, quota, now, rep)
        if release:
            self._release(release, now, m0, rep)
        want = quota - (len(held_now) - len(rep.released))
        offered, free, dead = self._takeover_candidates(cluster, release, now, m0, iv.eps_us)
        grants = _choose_grants(offered, free, dead, want, int(self.settings.orphan_grace_s * S), now)
        if grants:
            self._take(grants, n, now, rep)
        for p in [p for p, at in self._released_at.items() if m0 - at > 10 * self.settings.orphan_grace_s]:
            del self._released_at[p]
        rep.held = len(self.ownership().partitions)
        self.last = rep
        return rep

    def _shed_or_rejoin(self, iv: Interval, m0: float) -> bool:
        """Decide whether this node sheds this cycle and apply it; returns the new shedding state.

        ε over the ceiling sheds at once; a shedding node rejoins only after ``rejoin_after_s`` of
        healthy clock (measured on ``m0``, the monotonic reading). Entering shedding drops every
        partition (waiting for a commit in flight); transitions are logged; the gauge is set."""
        st = self.settings
        eps = iv.eps_us
        if eps > st.eps_ceiling_us:
            self._healthy_since = None
            shedding = True
        else:
            if self._healthy_since is None:
                self._healthy_since = m0
            shedding = self._shedding and (m0 - self._healthy_since) < st.rejoin_after_s
        if shedding and not self._shedding:
            log.warning("node %s sheds its partition leases: clock uncertainty %.1f ms exceeds the ceiling "
                        "%.1f ms (%s); it keeps serving reads and rejoins after %.0f s of healthy clock",
                        self.node_id, eps / 1000, st.eps_ceiling_us / 1000, iv.source, st.rejoin_after_s)
        elif self._shedding and not shedding:
            log.warning("node %s rejoins: clock uncertainty %.1f ms is within the ceiling (%s)",
                        self.node_id, eps / 1000, iv.source)
        if shedding:
            self._drop(set(self.ownership().partitions))
        self._shedding = shedding
        METRICS.shedding.labels(self.node_id).set(1 if shedding else 0)
        return shedding

    def _renew(self, iv: Interval, m0: float, shedding: bool, rep: CycleReport) -> tuple[frozenset[int], int]:
        """Renew the session and every held lease in one store call; returns (partitions held, n).

        Ownership becomes exactly what the store says is held (below the current count ``n``),
        valid until ``m0 + min(session_ttl, lease_ttl) − 2ε − guard``; partitions no longer held are
        dropped (and listed in ``rep.lost``). Every 120th cycle prunes long-gone sessions."""
        st = self.settings
        now = iv.earliest_us
        assert self._started_us is not None
        held = self.store.timing.heartbeat(
            self.node_id, self.role, now_us=now, started_us=self._started_us, eps_us=iv.eps_us,
            eps_source=iv.source, shedding=shedding, lease_expires_us=now + int(st.lease_ttl_s * S))
        n = int(self.store.timing.partition_count())
        valid_until = m0 + min(st.session_ttl_s, st.lease_ttl_s) - 2 * iv.eps_us / S - st.guard_s
        held_now = frozenset(p for p, _ in held if p < n)
        lost = set(self.ownership().partitions - held_now)
        if lost:
            rep.lost = sorted(lost)
            log.info("node %s no longer holds partitions %s", self.node_id, _fmt(lost))
            self._drop(lost)
        self._set_ownership(held_now, n, valid_until)
        self._cycles += 1
        if self._cycles % 120 == 1:
            self.store.timing.prune_nodes(self.role, now - int(st.prune_after_s * S))
        return held_now, n

    def _read_cluster(self, now: int, n: int, rep: CycleReport) -> _Cluster:
        """Read the lease table (partitions below ``n``) and the sessions of this role.

        A session is live when not stopped and its heartbeat + ``session_ttl_s`` ≥ ``now``; active
        nodes are the live, non-shedding ones, sorted. Sets ``rep.live`` and reports (gauge, one
        log line per episode) a correlated excursion: at least two live nodes, most shedding."""
        table = [lease for lease in self.store.timing.lease_table() if lease.partition < n]
        sessions = self.store.timing.sessions(self.role)
        session_us = int(self.settings.session_ttl_s * S)
        live = {s.id: s for s in sessions if s.stopped_us is None and s.heartbeat_us + session_us >= now}
        active = sorted(i for i, s in live.items() if not s.shedding)
        shed_nodes = sorted(i for i, s in live.items() if s.shedding)
        rep.live = len(live)
        rep.correlated_excursion = len(live) >= 2 and 2 * len(shed_nodes) > len(live)
        METRICS.correlated_excursion.set(1 if rep.correlated_excursion else 0)
        if rep.correlated_excursion and not self._excursion_logged:
            log.error("correlated clock excursion: %d of %d live timing nodes are shedding (%s); "
                      "scheduling capacity is reduced while nothing is wrong with the schedulers",
                      len(shed_nodes), len(live), ", ".join(shed_nodes))
        self._excursion_logged = rep.correlated_excursion
        return _Cluster(table, sessions, live, active)

    def _plan_releases(self, cluster: _Cluster, n: int, quota: int, now: int,
                       rep: CycleReport) -> dict[int, str | None]:
        """Choose what to release: partition → the node it is offered to (``None``: to anyone).

        Beyond the fair share ``quota`` (of ``n``), the longest-held partitions go, each offered to the active
        node furthest below its share. At or under the share (and with another active node), up to
        ``rotate_batch`` partitions held past their staggered ``rotate_after_s`` are offered the same
        way, or to the node holding fewest when all are at their share; those are in ``rep.rotated``."""
        st = self.settings
        active = cluster.active
        counts: dict[str, int] = {}
        for lease in cluster.table:
            if lease.owner is not None:
                counts[lease.owner] = counts.get(lease.owner, 0) + 1
        mine = [lease for lease in cluster.table if lease.owner == self.node_id]
        deficits = {i: quota_for(i, active, n) - counts.get(i, 0)
                    for i in active if i != self.node_id}

        def receiver() -> str | None:
            """The active node furthest below its share (ties: lowest id), charged one partition."""
            if not deficits:
                return None
            best = max(sorted(deficits), key=lambda i: deficits[i])
            if deficits[best] <= 0:
                return None
            deficits[best] -= 1
            return best

        release: dict[int, str | None] = {}
        by_tenure = sorted(mine, key=lambda lease: (lease.granted_us or 0, lease.partition))
        if len(mine) > quota:
            for lease in by_tenure[: len(mine) - quota]:
                release[lease.partition] = receiver()
        elif len(active) >= 2 and st.rotate_after_s > 0:
            for lease in by_tenure:
                if len(rep.rotated) >= st.rotate_batch:
                    break
                held_for = int(st.rotate_after_s * (1 + 0.5 * _spread(f"{lease.partition}:{lease.epoch}")) * S)
                if lease.granted_us is not None and lease.granted_us + held_for <= now:
                    to = receiver()
                    if to is None:  # everyone is at its share: offer it to the node holding fewest
                        others = [i for i in active if i != self.node_id]
                        to = min(sorted(others), key=lambda i: counts.get(i, 0))
                    release[lease.partition] = to
                    rep.rotated.append(lease.partition)
        return release

    def _release(self, release: dict[int, str | None], now: int, m0: float, rep: CycleReport) -> None:
        """Stop claiming the partitions in ``release`` (waiting for a commit in flight), then release
        them in the store, each offered to its node; ``rep.released`` lists those the store released."""
        self._drop(set(release))
        done = self.store.timing.release_leases(self.node_id, sorted(release), now, release)
        rep.released = done
        for p in done:
            self._released_at[p] = m0
        if rep.rotated:
            log.info("node %s hands over partitions %s (routine reassignment)", self.node_id, _fmt(rep.rotated))

    def _takeover_candidates(self, cluster: _Cluster, release: dict[int, str | None], now: int, m0: float,
                             eps: int) -> tuple[list[Grant], list[tuple[float, Grant]], list[tuple[float, Grant]]]:
        """The leases this node could take now: (offered, free, dead), none of its own or just released.

        ``offered``: free partitions handed to this node. ``free``: other free partitions, each with
        its release instant — except, within ``orphan_grace_s``, one this node just released or one
        offered to another active node. ``dead``: leases whose expiry is past ``now`` or whose
        owner's session is not live, keyed by a per-node stable spread (so contested takeovers
        spread out). Each grant carries the handover's duration and cause."""
        st = self.settings
        grace_us = int(st.orphan_grace_s * S)
        lease_ttl_us = int(st.lease_ttl_s * S)
        by_id = {s.id: s for s in cluster.sessions}
        offered: list[Grant] = []
        free: list[tuple[float, Grant]] = []
        dead: list[tuple[float, Grant]] = []
        for lease in cluster.table:
            p = lease.partition
            if lease.owner == self.node_id or p in release:
                continue
            if lease.owner is None:
                since = lease.released_us
                g = Grant(p, lease.rev, now + lease_ttl_us, eps,
                          None if since is None else max(0, now - since), None if since is None else "released")
                if lease.handoff_to == self.node_id:
                    offered.append(g)
                    continue
                mine_recently = (lease.prev_owner == self.node_id and p in self._released_at
                                 and m0 - self._released_at[p] < st.orphan_grace_s)
                lapsed = since is None or since + grace_us <= now
                for_other = lease.handoff_to is not None and lease.handoff_to in cluster.active
                if mine_recently and not lapsed:
                    continue
                if for_other and not lapsed:
                    continue
                free.append((since or 0, g))
                continue
            if lease.expires_us < now:
                last = lease.renewed_us if lease.renewed_us is not None else lease.expires_us - lease_ttl_us
                dead.append((_spread(f"{self.node_id}:{p}"),
                             Grant(p, lease.rev, now + lease_ttl_us, eps, max(0, now - last), "expired")))
            elif cluster.live.get(lease.owner) is None:
                seen = by_id.get(lease.owner)
                last = seen.heartbeat_us if seen is not None else (lease.renewed_us or now)
                if seen is not None and seen.stopped_us is not None:
                    last = seen.stopped_us
                dead.append((_spread(f"{self.node_id}:{p}"),
                             Grant(p, lease.rev, now + lease_ttl_us, eps, max(0, now - last), "session-lost")))
        return offered, free, dead

    def _take(self, grants: list[Grant], n: int, now: int, rep: CycleReport) -> None:
        """Grant ``grants`` by compare-and-set; what the store granted joins the ownership at once
        (same validity), is listed in ``rep.granted``, observed as takeover durations per cause, and
        wakes ``on_change``."""
        got = self.store.timing.grant_leases(self.node_id, grants, now)
        rep.granted = got
        if not got:
            return
        own = self.ownership()
        self._set_ownership(own.partitions | frozenset(got), n, own.valid_until)
        by_p = {g.partition: g for g in grants}
        for p in got:
            g = by_p[p]
            if g.takeover_us is not None and g.cause is not None:
                METRICS.lease_takeover.labels(g.cause).observe(g.takeover_us / S)
        log.info("node %s takes partitions %s", self.node_id, _fmt(got))
        self.on_change()

    # --- running -----------------------------------------------------------------------------

    def run(self, stop: Waker) -> None:
        """Cycle every ``cycle_s`` until ``stop`` is set; errors are logged and retried (a node that
        cannot renew runs out of time and stops claiming by itself)."""
        last_msg, last_at = "", -1e9
        while not stop.is_set():
            try:
                self.cycle()
                last_msg = ""
            except Exception as exc:
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                now = self.clock.monotonic()
                if msg != last_msg or now - last_at > 30:   # one line per distinct failure, 30 s apart
                    log.warning("lease cycle of %s failed (claims stop when its leases run out): %s",
                                self.node_id, msg)
                    last_msg, last_at = msg, now
            stop.wait(self.settings.cycle_s)

    def stop(self) -> None:
        """A clean stop: stop claiming, wait for any commit in flight, release every lease at once."""
        self._drop(set(self.ownership().partitions))
        self._set_ownership(frozenset(), self.ownership().n, 0.0)
        try:
            n = self.store.timing.stop_node(self.node_id, self.clock.now().earliest_us)
            log.info("node %s stopped and released %d partitions", self.node_id, n)
        except Exception as exc:
            log.warning("node %s could not release its leases on stop (they expire): %s", self.node_id, exc)


def _fmt(parts: Iterable[int]) -> str:
    ps = sorted(parts)
    if len(ps) > 12:
        return f"{', '.join(map(str, ps[:12]))}, … ({len(ps)})"
    return ", ".join(map(str, ps))


__all__ = ["NO_OWNERSHIP", "CycleReport", "LeaseManager", "LeaseSettings", "Ownership", "quota_for"]
