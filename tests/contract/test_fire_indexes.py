"""The fires table's secondary indexes, each with the named query that needs it (issue 15, decision
0194). Every index is written on each fire inserted, claimed and settled it covers, so the set is
kept to what a bounded query reads: the inventory below is the schema on both engines, and each
query's plan (``EXPLAIN``; on PostgreSQL with sequential scans priced out, since on a tiny table
its planner would rightly prefer one) reads its index.
"""

from __future__ import annotations

import re
from typing import Any

#: index -> the named query (``store.q``) whose plan reads it. Partial indexes hold only the rows
#: their WHERE names: live (pending/dispatching), dispatching, held, never attempted, dead letters.
INVENTORY = {
    "fires_undelivered": "oldest_undelivered",            # MIN over live fires (the paging signal)
    "fires_inflight": "dp_inflight",                      # a tenant's attempts in flight (its quota)
    "fires_by_trigger": "hist_trigger_asc",               # a trigger's history (every fire; 0210)
    "fires_held": "ov_held_all",                          # overlap-held fires
    "fires_lane_tenant_due": "dp_claim_fires",            # the bounded claim (decision 0130)
    "fires_dead_letters": "dl_page",                      # a tenant's dead letters
    "fires_never_attempted": "hist_undispatched_by_partition",   # the on-time wait (0165, 0194)
}


def _fire_indexes(store: Any) -> set[str]:
    with store.engine.read() as c:
        if store.engine_name == "postgres":
            rows = c.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'fires'").fetchall()
            return {str(r[0]) for r in rows if not str(r[0]).endswith("_pkey")}
        rows = c.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'fires'").fetchall()
        return {str(r[0]) for r in rows if not str(r[0]).startswith("sqlite_autoindex")}


def _params(sql: str) -> dict[str, Any]:
    """A value of the right kind for each ``:name`` / ``%(name)s`` (the plan, not the result, is
    what is read)."""
    out: dict[str, Any] = {}
    for name in re.findall(r"(?<![:\w]):([a-z_][a-z0-9_]*)|%\(([a-z_0-9]+)\)s", sql):
        name = name[0] or name[1]
        if name in ("ids", "batch"):
            out[name] = '[["acme", 8]]' if name == "batch" else '["acme"]'
        elif name.endswith(("_us", "_seq")) or name in ("limit", "k", "seq", "lo", "hi"):
            out[name] = 0
        else:
            out[name] = {"lane": "on-time", "meth": "scheduled"}.get(name, "acme")
    return out


def _plan(store: Any, name: str) -> str:
    sql = store.q[name]
    with store.engine.read() as c:
        if store.engine_name == "postgres":
            c.execute("SET LOCAL enable_seqscan = off")
            return " ".join(str(r[0]) for r in c.execute("EXPLAIN " + sql, _params(sql)).fetchall())
        return " ".join(str(r[-1]) for r in c.execute("EXPLAIN QUERY PLAN " + sql, _params(sql)).fetchall())


def test_the_fires_indexes_are_the_inventory(store):
    """Migration 0020 dropped fires_dispatchable (only the whole-lane claim read it); migration 0021
    keyed the table by tenant and instant, so fires_by_tenant_instant (the same order) went and
    fires_by_trigger came (decision 0210). An index added later must name the query that needs it here."""
    assert _fire_indexes(store) == set(INVENTORY)


def test_each_fires_index_is_read_by_its_query(store):
    for index, name in INVENTORY.items():
        plan = _plan(store, name)
        assert index in plan, (index, name, plan)


def test_the_on_time_wait_per_partition_is_an_ordered_probe(store):
    """The paging read of decision 0165 reads only fires never attempted, never the whole live set."""
    plan = _plan(store, "hist_undispatched_by_partition")
    assert "fires_never_attempted" in plan, plan
    assert "fires_lane_tenant_due" not in plan and "fires_undelivered" not in plan, plan
