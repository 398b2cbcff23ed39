"""The multi-node timing plane's store operations: the timing area's first half,
:class:`TimingLeases` (:class:`~fireledger.store.timing.SqlTiming` extends it); its SQL text is
in :mod:`fireledger.store.lease_sql`.

* **Sessions and partition leases.** A timing node's session is its ``nodes`` row: ``heartbeat``
  upserts it and, in the same transaction, renews every lease the node holds (``expires_us``) — or,
  while the node sheds, releases them all. A lease is granted by compare-and-set on the row's
  ``rev`` as the granter read it (``rev`` is bumped by every grant, renewal and release), so a lease
  renewed or granted meanwhile is never taken by a stale decision. ``epoch`` counts grants.
* **The partition count** (``timing_settings``), and the lease and shadow rows of every partition.
* **Claims restricted to partitions.** ``due_rows_in`` / ``earliest_due_in`` read only the due rows
  whose ``partition mod n`` is in the caller's set, so a row whose stored partition predates a
  count change is still claimed by exactly one range of owners.
* **The shadow rebuilder's snapshot and report**, and the per-partition rebuild of the due index
  (``rebuild_partition``: lock, snapshot and replace in one transaction).

Every method takes instants from its caller (``now_us``, ``until_us``): the store never reads a clock.
Lists of partitions are bound as one JSON array (``json_each`` on SQLite, ``jsonb_array_elements_text``
on PostgreSQL), so every statement has a fixed text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from fireledger.domain.model import DueRow
from fireledger.domain.timing_records import (
    DIVERGENCE_KINDS,
    Divergence,
    Grant,
    Lease,
    NodeSession,
    RebuildStats,
    ShadowReport,
    ShadowRow,
    StrayDue,
)

from . import rows as rec
from .core import Area, expect_one
from .engine import StoreError
from .lease_sql import LEASE_QUERIES  # its import registers the SQL text

#: Divergent rows stored per partition report at most (the counts are always complete).
DIVERGENCE_ROWS_CAP = 1000


def _parts(parts: Sequence[int]) -> str:
    return json.dumps(sorted(int(p) for p in parts))


#: Attempts of a maintenance transaction that PostgreSQL aborted to break a deadlock.
RETRIES = 5


def _retrying(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (one transaction), again when PostgreSQL chose it as a deadlock or serialization
    victim. Maintenance transactions (rebuild, repartition) lock due rows in trigger-id order like
    the timing loop's commits; this covers any other writer."""
    for attempt in range(RETRIES):
        try:
            return fn()
        except Exception as exc:
            if type(exc).__name__ not in ("DeadlockDetected", "SerializationFailure") or attempt == RETRIES - 1:
                raise
    raise AssertionError("unreachable")


class TimingLeases(Area):
    """Partitions, leases, node sessions, partition-restricted due reads and the shadow rebuilder (the
    timing area's first half: :class:`~fireledger.store.timing.SqlTiming` extends it)."""

    def partition_count(self) -> int:
        """The keyspace's partition count (``timing_settings``; 256 unless changed)."""
        with self.engine.read() as c:
            row = c.execute(self.q["tl_partitions_get"]).fetchone()
        return int(row[0]) if row else 256

    def ensure_partitions(self, n: int | None = None) -> int:
        """Make sure a lease row and a shadow row exist for every partition < n (idempotent)."""
        n = self.partition_count() if n is None else n
        with self.engine.write() as c:
            c.execute(self.q["tl_ensure_leases"], {"n": n})
            c.execute(self.q["tl_ensure_shadow"], {"n": n})
        return n

    def set_partition_count(self, n: int) -> int:
        """Record a new partition count and resize the lease and shadow tables (one transaction);
        returns the previous count. Lease rows ≥ n disappear: their owners drop them at their next
        renewal. Triggers keep their stored partition until :meth:`repartition_batch` rewrites it."""
        if not 1 <= n <= 65536:
            raise StoreError(f"partitions: {n} is out of range 1-65536")

        def once() -> int:
            # Running lease managers renew and shed lease rows while this trims them: PostgreSQL may
            # pick this transaction as a deadlock victim; it is whole or nothing, so run it again.
            with self.engine.write() as c:
                row = c.execute(self.q["tl_partitions_get"]).fetchone()
                old = int(row[0]) if row else 256
                c.execute(self.q["tl_partitions_set"], {"n": n})
                c.execute(self.q["tl_trim_leases"], {"n": n})
                c.execute(self.q["tl_trim_shadow"], {"n": n})
                c.execute(self.q["tl_trim_divergence"], {"n": n})
                c.execute(self.q["tl_ensure_leases"], {"n": n})
                c.execute(self.q["tl_ensure_shadow"], {"n": n})
            return old

        return _retrying(once)  # type: ignore[no-any-return]

    def repartition_batch(self, after_id: str, limit: int, partition_of: Callable[[str], int]) -> tuple[str, int, int]:
        """Rewrite the stored partition of up to ``limit`` triggers with id > ``after_id`` (and of
        their due rows) to ``partition_of(id)``, in one transaction.

        Returns ``(last id seen, triggers seen, triggers moved)``; last id "" when none was left."""
        def once() -> tuple[str, int, int]:
            with self.engine.write() as c:
                rows = c.execute(self.q["tl_trigger_partitions"], {"after": after_id, "limit": limit}).fetchall()
                moved = 0
                for tid, part in rows:   # trigger-id order, like every other writer of due rows
                    want = partition_of(str(tid))
                    if int(part) != want:
                        c.execute(self.q["tl_set_trigger_partition"], {"id": tid, "partition": want})
                        c.execute(self.q["tl_set_due_partition"], {"id": tid, "partition": want})
                        moved += 1
            return (str(rows[-1][0]) if rows else "", len(rows), moved)

        return _retrying(once)  # type: ignore[no-any-return]

    def count_out_of_range(self, n: int) -> int:
        """Triggers whose stored partition is ≥ n (left behind by a count change not yet applied)."""
        with self.engine.read() as c:
            return int(c.execute(self.q["tl_out_of_range"], {"n": n}).fetchone()[0])

    def count_triggers(self) -> int:
        """Every trigger row, whatever its state."""
        with self.engine.read() as c:
            return int(c.execute(self.q["tl_count_triggers"]).fetchone()[0])

    def out_of_range_partitions(self, n: int) -> list[int]:
        """The distinct stored partition numbers ≥ n."""
        with self.engine.read() as c:
            return [int(r[0]) for r in c.execute(self.q["tl_out_of_range_partitions"], {"n": n}).fetchall()]

    def heartbeat(self, node_id: str, role: str, *, now_us: int, started_us: int, eps_us: int,
                  eps_source: str, shedding: bool, lease_expires_us: int) -> list[tuple[int, int]]:
        """Renew the session of ``node_id`` and, in the same transaction, every lease it holds
        (``expires_us`` = ``lease_expires_us``); while ``shedding``, release them all instead.

        Returns the (partition, epoch) pairs the node holds after the commit."""
        with self.engine.write() as c:
            c.execute(self.q["tl_heartbeat"], {
                "id": node_id, "role": role, "started_us": started_us, "now_us": now_us, "eps_us": eps_us,
                "eps_source": eps_source, "shedding": 1 if shedding else 0})
            if shedding:
                c.execute(self.q["tl_release_all"], {"owner": node_id, "now_us": now_us})
                return []
            rows = c.execute(self.q["tl_renew"], {"owner": node_id, "now_us": now_us,
                                                  "expires_us": lease_expires_us}).fetchall()
        return sorted((int(p), int(e)) for p, e in rows)

    def lease_table(self) -> list[Lease]:
        """Every lease row, by partition."""
        with self.engine.read() as c:
            rows = c.execute(self.q["tl_leases"]).fetchall()
        return [Lease(int(r[0]), r[1], int(r[2]), int(r[3]), int(r[4]), rec.opt_int(r[5]), rec.opt_int(r[6]),
                      rec.opt_int(r[7]),
                      rec.opt_int(r[8]), r[9], r[10], rec.opt_int(r[11]), r[12]) for r in rows]

    def sessions(self, role: str = "timing") -> list[NodeSession]:
        """The session rows of ``role`` (live or not: the caller judges with its own clock)."""
        with self.engine.read() as c:
            rows = c.execute(self.q["tl_sessions"], {"role": role}).fetchall()
        return [NodeSession(str(r[0]), str(r[1]), int(r[2]), int(r[3]), rec.opt_int(r[4]), r[5], bool(r[6]),
                            rec.opt_int(r[7]))
                for r in rows]

    def grant_leases(self, node_id: str, grants: Sequence[Grant], now_us: int) -> list[int]:
        """Take each lease by compare-and-set on the ``rev`` its granter read; returns the partitions
        granted (a lease that moved meanwhile is simply not granted). Rows are written in partition
        order whatever the order of ``grants``, as every lease write is, so concurrent cycles of
        several nodes never deadlock."""
        got: list[int] = []
        if not grants:
            return got
        with self.engine.write() as c:
            for g in sorted(grants, key=lambda g: g.partition):     # partition order: no deadlock
                n = c.execute(self.q["tl_grant"], {
                    "owner": node_id, "expires_us": g.expires_us, "eps_us": g.eps_us, "now_us": now_us,
                    "takeover_us": g.takeover_us, "cause": g.cause, "partition": g.partition,
                    "rev": g.rev}).rowcount
                if expect_one(n, "grant_lease"):
                    got.append(g.partition)
        return got

    def release_leases(self, node_id: str, partitions: Sequence[int], now_us: int,
                       handoff_to: dict[int, str | None] | None = None) -> list[int]:
        """Release the listed leases ``node_id`` still holds (each offered to ``handoff_to[p]`` first);
        returns the partitions released."""
        out: list[int] = []
        if not partitions:
            return out
        with self.engine.write() as c:
            for p in sorted(partitions):                             # partition order: no deadlock
                n = c.execute(self.q["tl_release"], {"owner": node_id, "partition": p, "now_us": now_us,
                                                     "handoff_to": (handoff_to or {}).get(p)}).rowcount
                if expect_one(n, "release_lease"):
                    out.append(p)
        return out

    def release_all_leases(self, node_id: str, now_us: int) -> int:
        """Release every lease of ``node_id``; returns how many."""
        with self.engine.write() as c:
            return int(c.execute(self.q["tl_release_all"], {"owner": node_id, "now_us": now_us}).rowcount)

    def stop_node(self, node_id: str, now_us: int) -> int:
        """A clean shutdown: release every lease at once and mark the session stopped."""
        with self.engine.write() as c:
            n = int(c.execute(self.q["tl_release_all"], {"owner": node_id, "now_us": now_us}).rowcount)
            c.execute(self.q["tl_stop_node"], {"id": node_id, "now_us": now_us})
        return n

    def prune_nodes(self, role: str, before_us: int) -> int:
        """Forget sessions of ``role`` silent since before ``before_us``."""
        with self.engine.write() as c:
            return int(c.execute(self.q["tl_prune_nodes"], {"role": role, "before_us": before_us}).rowcount)

    def due_rows_in(self, until_us: int, limit: int, partitions: Sequence[int], n: int) -> list[DueRow]:
        """Due rows with ``next_us <= until_us`` whose ``partition mod n`` is in ``partitions``,
        earliest first."""
        if not partitions:
            return []
        with self.engine.read() as c:
            rows = c.execute(self.q["tl_due_rows_in"], {"until_us": until_us, "limit": limit, "n": n,
                                                        "parts": _parts(partitions)}).fetchall()
        return [DueRow(*r) for r in rows]

    def earliest_due_in(self, partitions: Sequence[int], n: int) -> int | None:
        """The earliest ``next_us`` among the due rows of ``partitions`` (None when there is none)."""
        if not partitions:
            return None
        with self.engine.read() as c:
            row = c.execute(self.q["tl_earliest_due_in"], {"n": n, "parts": _parts(partitions)}).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def due_index(self) -> list[DueRow]:
        """The whole due index, by trigger id (operator commands and tests)."""
        with self.engine.read() as c:
            return [DueRow(*r) for r in c.execute(self.q["tl_due_index"]).fetchall()]

    def shadow_claim(self, node_id: str, now_us: int, n: int) -> int | None:
        """Claim the partition whose shadow check is stalest (compare-and-set on its claim instant,
        so two nodes never check the same partition at once); None when another node won it."""
        with self.engine.read() as c:
            row = c.execute(self.q["tl_shadow_stalest"], {"n": n}).fetchone()
        if row is None:
            return None
        with self.engine.write() as c:
            ok = c.execute(self.q["tl_shadow_claim"], {"partition": int(row[0]), "seen": int(row[1]),
                                                       "now_us": now_us, "node": node_id}).rowcount
        return int(row[0]) if ok == 1 else None

    def shadow_snapshot(self, partition: int) -> tuple[list[ShadowRow], list[StrayDue]]:
        """The triggers of ``partition`` with what the registry, the ledger and the live due index say
        about each (one statement: one snapshot), and the due rows of the partition with no trigger."""
        with self.engine.read() as c:
            rows = c.execute(self.q["tl_shadow_rows"], {"partition": partition}).fetchall()
            strays = c.execute(self.q["tl_shadow_strays"], {"partition": partition}).fetchall()
        return [rec.shadow_row(r) for r in rows], [StrayDue(str(s[0]), int(s[1]), int(s[2])) for s in strays]

    def shadow_write(self, report: ShadowReport) -> None:
        """Store ``report`` as the partition's latest (its divergent rows replace the previous ones)."""
        with self.engine.write() as c:
            c.execute(self.q["tl_shadow_report"], {
                "partition": report.partition, "now_us": report.reported_us, "node": report.node,
                "triggers": report.triggers, "live_rows": report.live_rows, "divergent": report.divergent,
                **{k: report.count(k) for k in DIVERGENCE_KINDS},
                "repartition_pending": report.repartition_pending, "duration_us": report.duration_us})
            c.execute(self.q["tl_shadow_clear"], {"partition": report.partition})
            for d in report.divergences[:DIVERGENCE_ROWS_CAP]:
                c.execute(self.q["tl_shadow_insert"], {
                    "partition": report.partition, "trigger_id": d.trigger_id, "kind": d.kind,
                    "live_next_us": d.live_next_us, "live_version": d.live_version,
                    "expected_next_us": d.expected_next_us, "expected_version": d.expected_version,
                    "reported_us": report.reported_us, "node": report.node})

    def shadow_reports(self) -> list[ShadowReport]:
        """The latest report of every partition (divergent rows not included; see
        :meth:`shadow_divergences`). A partition never checked has ``reported_us`` 0."""
        with self.engine.read() as c:
            rows = c.execute(self.q["tl_shadow_reports"]).fetchall()
        return [rec.shadow_report(r) for r in rows]

    def shadow_divergences(self) -> list[Divergence]:
        """Every divergent row of the latest reports, by partition and trigger."""
        with self.engine.read() as c:
            rows = c.execute(self.q["tl_shadow_divergences"]).fetchall()
        return [Divergence(int(r[0]), str(r[1]), str(r[2]), rec.opt_int(r[3]), rec.opt_int(r[4]), rec.opt_int(r[5]),
                           rec.opt_int(r[6]),
                           int(r[7]), str(r[8])) for r in rows]

    def rebuild_partition(self, partition: int, expected: Callable[[ShadowRow], int | None]) -> RebuildStats:
        """Replace the due rows of the triggers of ``partition`` (and any due row stored under it)
        with the rows ``expected`` computes from the registry and the ledger, in one transaction.

        On PostgreSQL the affected due rows are locked before the snapshot is read, so a decision
        committing concurrently is either seen by the snapshot or waits and then compare-and-sets
        against the rebuilt row."""
        def once() -> RebuildStats:
            with self.engine.write() as c:
                c.execute(self.q["tl_rebuild_lock"], {"partition": partition}).fetchall()
                found = c.execute(self.q["tl_shadow_rows"], {"partition": partition}).fetchall()
                rows = [rec.shadow_row(r) for r in found]
                strays = c.execute(self.q["tl_shadow_strays"], {"partition": partition}).fetchall()
                before = {r.trigger_id: (r.due_next_us, r.due_version, r.due_partition)
                          for r in rows if r.due_next_us is not None}
                before.update({str(s[0]): (int(s[1]), int(s[2]), partition) for s in strays})
                after: dict[str, tuple[int, int, int]] = {}
                inserts = []
                for r in rows:
                    nxt = expected(r)
                    if nxt is None:
                        continue
                    after[r.trigger_id] = (nxt, r.version, r.partition)
                    inserts.append({"trigger_id": r.trigger_id, "tenant_id": r.tenant_id, "partition": r.partition,
                                    "next_us": nxt, "version": r.version})
                c.execute(self.q["tl_rebuild_clear_partition"], {"partition": partition})
                c.execute(self.q["tl_rebuild_clear_triggers"], {"partition": partition})
                for params in inserts:
                    c.execute(self.q["tl_rebuild_insert"], params)
            added = sum(1 for t in after if t not in before)
            removed = sum(1 for t in before if t not in after)
            changed = sum(1 for t, v in after.items() if t in before and before[t] != v)
            return RebuildStats(partition, len(rows), len(after), added, removed, changed)

        return _retrying(once)  # type: ignore[no-any-return]

    def delete_orphan_due(self) -> int:
        """Remove due rows whose trigger does not exist; returns how many."""
        with self.engine.write() as c:
            return int(c.execute(self.q["tl_delete_orphans"]).rowcount)


__all__ = ["LEASE_QUERIES", "TimingLeases"]
