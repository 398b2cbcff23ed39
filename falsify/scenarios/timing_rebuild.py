"""timing-repartition-drop-rebuild: the partition count is changed on the running cluster, then the
due index is dropped entirely and rebuilt from the registry.

Two ``fireledger timing`` processes (shadow rebuilder on a fast rota) and one ``dispatch`` against one
PostgreSQL (quick form: one timing process, no dispatch), triggers firing every second.

1. ``fireledger partitions set 32`` while everything runs (the documented procedure): leases and
   the shadow rota shrink to 32 partitions, every trigger's stored partition is rewritten.
2. The shadow rebuilder completes a rota reporting no divergence.
3. ``DELETE FROM due``: nothing is due anywhere; the shadow rebuilder's next rota reports every
   trigger's row ``missing``, with the row it expects.
4. ``fireledger due-index rebuild``; the timing nodes decide the instants that fell due meanwhile.

Passes when no instant in the whole window (through the count change, the drop and the rebuild) is
lost or has more than one fire record, no record exists before its instant, the shadow rebuilder
reported exactly the active triggers as missing, the rebuilt rows equal what it reported (each
trigger's first instant decided after the drop is the instant the shadow expected), and the
shadow's rota after the rebuild finds no divergence and nothing left to repartition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from e2e import cli, wait_until
from falsify.timing_cluster import Cluster, EarlyWatch, S, now_us


def _rota_after(c: Cluster, after_us: int, timeout_s: float, what: str) -> list[tuple[Any, ...]]:
    """Wait until every partition's shadow report is newer than ``after_us``; returns the reports."""
    def done() -> list[tuple[Any, ...]] | None:
        rows = c.sql("SELECT partition, reported_us, divergent, missing, repartition_pending, triggers "
                     "FROM shadow_partitions WHERE partition < (SELECT value FROM timing_settings "
                     "WHERE name = 'partitions')")
        return rows if rows and all(r[1] is not None and int(r[1]) > after_us for r in rows) else None

    return wait_until(done, timeout_s, what, interval_s=0.1)  # type: ignore[no-any-return]


def run(quick: bool) -> dict[str, Any]:
    n_trig = 60 if quick else 200
    c = Cluster.create("rebuild")
    try:
        trigs = c.create_direct(n_trig, (1,))
        env = {"FIRELEDGER_SHADOW_INTERVAL_S": "0.01"}
        if not quick:
            c.start("dispatch")   # deliveries are not judged here; the quick form spares the process
        nodes = c.start_timing(1 if quick else 2, env=env)
        ids = {c.node_id(s) for s in nodes}
        c.wait_owned(ids, 30, "the nodes to share every partition")
        watch = EarlyWatch(c.db)
        window_from = now_us() + S
        # 1. the partition count, changed live
        t = time.monotonic()
        rep = json.loads(cli("partitions", "set", "32", "--db", c.db, "--json").stdout)
        wait_until(lambda: len(c.lease_owners()) == 32 and set(c.lease_owners().values()) <= ids
                   and min(c.held_by().values()) >= 32 // len(ids) - 1, 30,
                   "the leases to rebalance over 32 partitions", interval_s=0.1)
        repartition_s = round(time.monotonic() - t, 2)
        # 2. a clean rota
        before = _rota_after(c, now_us(), 60, "a shadow rota after the count change")
        divergent_before = sum(int(r[2]) for r in before)
        pending_before = sum(int(r[4]) for r in before)
        # 3. drop the index
        t_drop = c.server_us()
        dropped = c.sql("WITH d AS (DELETE FROM due RETURNING 1) SELECT COUNT(*) FROM d")[0][0]
        during = _rota_after(c, t_drop + 100_000, 60, "a shadow rota after the drop")
        reported = {tid: (int(nxt), int(ver)) for tid, kind, nxt, ver in c.sql(
            "SELECT trigger_id, kind, expected_next_us, expected_version FROM shadow_divergence") if kind == "missing"}
        reported_kinds = sorted({k for (k,) in c.sql("SELECT DISTINCT kind FROM shadow_divergence")})
        # 4. rebuild
        t_rebuild = c.server_us()
        out = json.loads(cli("due-index", "rebuild", "--db", c.db, "--json").stdout)
        rebuilt_in = round((c.server_us() - t_rebuild) / S, 2)
        time.sleep(1.5 if quick else 5.0)   # run on after the rebuild (pacing, not a wait for a condition)
        window_to = now_us() - S
        c.wait_decided(trigs, window_to, 30)
        early = watch.stop()
        ledger = c.ledger_check(trigs, window_from, window_to)
        first_after = {tid: int(us) for tid, us in c.sql(
            "SELECT trigger_id, MIN(scheduled_us) FROM fires WHERE decided_us > %s GROUP BY trigger_id",
            (t_drop + 200_000,))}
        mismatched = [tid for tid, (nxt, _v) in reported.items() if first_after.get(tid) != nxt]
        after = _rota_after(c, c.server_us(), 60, "a shadow rota after the rebuild")
        divergent_after = sum(int(r[2]) for r in after)
        pending_after = sum(int(r[4]) for r in after)
        active = {t.id for t in trigs}
        passed = (rep["partitions"] == 32 and divergent_before == 0 and pending_before == 0
                  and set(reported) == active and reported_kinds == ["missing"]
                  and out["rows"] == len(active) and not mismatched
                  and ledger["missing_records"] == 0 and ledger["unexpected_records"] == 0
                  and ledger["duplicate_records"] == 0 and early["early_decisions_seen"] == 0
                  and divergent_after == 0 and pending_after == 0)
        return {
            "passed": passed, "quick": quick, "system": "postgres", "triggers": n_trig,
            "repartition": {"from": rep["previous"], "to": rep["partitions"], "moved": rep["moved"],
                            "leases_rebalanced_after_s": repartition_s},
            "shadow_divergent_before_drop": divergent_before, "due_rows_dropped": int(dropped),
            "shadow_reported_missing": len(reported), "shadow_reported_kinds": reported_kinds,
            "shadow_missing_count_after_drop": sum(int(r[3]) for r in during),
            "rebuild": out, "rebuild_s": rebuilt_in,
            "rebuilt_rows_not_as_reported": len(mismatched),
            "shadow_divergent_after_rebuild": divergent_after, "repartition_pending_after": pending_after,
            "instants": ledger["instants"], "missing_records": ledger["missing_records"],
            "unexpected_records": ledger["unexpected_records"], "duplicate_records": ledger["duplicate_records"],
            **early, "examples": ledger["examples"],
        }
    finally:
        c.close()


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "timing-repartition-drop-rebuild", lambda: run(quick)
