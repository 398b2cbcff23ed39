"""History benchmark: one trigger's fire history over 30 days, with ≥ 10 million fires in the ledger
(PostgreSQL). Target (seed view 10): p95 ≤ 500 ms; aim ≤ 50 ms.

Generates the ledger fast with ``INSERT … SELECT generate_series`` into a fresh database (of a
throwaway server this script starts, or of ``--pg URL``), ANALYZEs it, then times the store calls
the history API makes (``Store.history_fires`` with attempts, ``lateness_us``, ``state_counts``)
in-process — the query and the row building, without HTTP.

Prints one JSON object per query shape (and one for the data generation):

    .venv/bin/python bench/history.py            # 10,000,000 fires (several minutes to generate)
    .venv/bin/python bench/history.py --quick    # 200,000 fires

Layout: ``--tenants`` tenants × ``--triggers`` triggers each, minutely fires spread evenly over the
triggers (mostly delivered; some skipped, expired, failed), plus the measured trigger with one fire a
minute for 90 days (129,600 fires, one attempt each when dispatched) — its 30-day window holds 43,200.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fireledger.store import Store  # noqa: E402

MINUTE_US = 60_000_000
DAY_US = 86_400_000_000
NOW_US = 1_800_000_000_000_000          # 2027-01-15T08:00:00Z: "now" for the generated ledger
TARGET_DAYS = 90


def log(msg: str) -> None:
    print(f"[history bench] {msg}", file=sys.stderr, flush=True)


def generate(store: Store, total: int, tenants: int, per_tenant: int) -> dict[str, Any]:
    """Fill a freshly migrated PostgreSQL store; returns what was generated."""
    n_triggers = tenants * per_tenant
    target_fires = TARGET_DAYS * 24 * 60
    bulk = max(0, total - target_fires)
    t0 = time.monotonic()
    conn = store.engine.connection()
    conn.execute("SET synchronous_commit = off")
    conn.execute("SET maintenance_work_mem = '512MB'")
    conn.execute(
        "INSERT INTO tenants (id, name, created_us) "
        "SELECT 'tn_' || lpad(g::text, 6, '0'), 'tenant-' || g, %s FROM generate_series(0, %s) g",
        (NOW_US - 400 * DAY_US, tenants - 1))
    conn.execute(
        "INSERT INTO triggers (id, tenant_id, name, state, current_version, partition, created_us, updated_us) "
        "SELECT 'tr_' || lpad(g::text, 8, '0'), 'tn_' || lpad((g %% %s)::text, 6, '0'), 'bench-' || g, 'active', 1, "
        "g %% 256, %s, %s FROM generate_series(0, %s) g",
        (tenants, NOW_US - 400 * DAY_US, NOW_US - 400 * DAY_US, n_triggers))   # id n_triggers: the measured one
    target = f"tr_{n_triggers:08d}"
    target_tenant = f"tn_{n_triggers % tenants:06d}"
    chunk = 1_000_000
    done = 0
    while done < bulk:
        hi = min(bulk, done + chunk) - 1
        # Fire g belongs to trigger g % n_triggers; each trigger fires once a minute, newest at NOW.
        conn.execute(
            "INSERT INTO fires (tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause, "
            "decided_us, decided_by, dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us) "
            "SELECT 'tn_' || lpad(((g %% %(nt)s) %% %(ten)s)::text, 6, '0'), "
            "  'tr_' || lpad((g %% %(nt)s)::text, 8, '0'), "
            "  %(now)s - (g / %(nt)s) * %(min)s, 0, 1, 'scheduled', 'on-time', "
            "  CASE WHEN g %% 100 < 90 THEN 'delivered' WHEN g %% 100 < 95 THEN 'skipped' "
            "       WHEN g %% 100 < 98 THEN 'expired' ELSE 'failed' END, "
            "  CASE WHEN g %% 100 < 90 THEN NULL WHEN g %% 100 < 95 THEN 'skipped: missed; missed-fire policy is skip' "
            "       WHEN g %% 100 < 98 THEN 'expired: missed and older than the catch-up horizon (1h)' "
            "       ELSE 'failed: HTTP 404 is final' END, "
            "  %(now)s - (g / %(nt)s) * %(min)s + 2000, 'timing-bench', "
            "  CASE WHEN g %% 100 < 90 OR g %% 100 >= 98 "
            "       THEN %(now)s - (g / %(nt)s) * %(min)s + 5000 + (g %% 997) * 100 END, "
            "  %(now)s - (g / %(nt)s) * %(min)s + 90000, '2026f', "
            "  CASE WHEN g %% 100 < 90 OR g %% 100 >= 98 THEN 1 ELSE 0 END, NULL "
            "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g",
            {"nt": n_triggers, "ten": tenants, "now": NOW_US, "min": MINUTE_US, "lo": done, "hi": hi})
        done = hi + 1
        log(f"fires: {done:,} of {bulk:,} ({time.monotonic() - t0:.0f} s)")
    conn.execute(
        "INSERT INTO fires (tenant_id, trigger_id, scheduled_us, seq, version, kind, lane, state, cause, "
        "decided_us, decided_by, dispatched_us, finished_us, tzdata_version, attempts, next_attempt_us) "
        "SELECT %(tn)s, %(tr)s, %(now)s - g * %(min)s, 0, 1, 'scheduled', 'on-time', "
        "  CASE WHEN g %% 50 = 7 THEN 'expired' WHEN g %% 200 = 3 THEN 'failed' ELSE 'delivered' END, "
        "  CASE WHEN g %% 50 = 7 THEN 'expired: missed and older than the catch-up horizon (1h)' "
        "       WHEN g %% 200 = 3 THEN 'failed: HTTP 404 is final' END, "
        "  %(now)s - g * %(min)s + 2000, 'timing-bench', "
        "  CASE WHEN g %% 50 = 7 THEN NULL ELSE %(now)s - g * %(min)s + 4000 + (g %% 1009) * 50 END, "
        "  %(now)s - g * %(min)s + 80000, '2026f', CASE WHEN g %% 50 = 7 THEN 0 ELSE 1 END, NULL "
        "FROM generate_series(0::bigint, %(n)s::bigint) g",
        {"tn": target_tenant, "tr": target, "now": NOW_US, "min": MINUTE_US, "n": target_fires - 1})
    conn.execute(
        "INSERT INTO attempts (tenant_id, trigger_id, scheduled_us, seq, attempt, started_us, finished_us, result, "
        "http_status, error, node) SELECT tenant_id, trigger_id, scheduled_us, 0, 1, dispatched_us, "
        "dispatched_us + 40000, CASE WHEN state = 'delivered' THEN 'delivered' ELSE 'failed' END, "
        "CASE WHEN state = 'delivered' THEN 200 ELSE 404 END, NULL, 'dispatch-bench' FROM fires "
        "WHERE tenant_id = %s AND trigger_id = %s AND dispatched_us IS NOT NULL", (target_tenant, target))
    log("analyze")
    conn.execute("ANALYZE")
    rows = int(conn.execute("SELECT COUNT(*) FROM fires").fetchone()[0])
    attempts = int(conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0])
    size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('fires'))").fetchone()[0]
    return {"fires": rows, "attempts": attempts, "fires_table_size": size, "triggers": n_triggers + 1,
            "tenants": tenants, "generate_s": round(time.monotonic() - t0, 1),
            "target": target, "target_tenant": target_tenant}


def timed(fn: Callable[[], Any], runs: int) -> dict[str, Any]:
    fn()   # warm the connection and the plan
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1000)
    ms.sort()
    p95 = ms[min(len(ms) - 1, max(0, int(round(0.95 * len(ms))) - 1))]
    return {"runs": runs, "p50_ms": round(statistics.median(ms), 2), "p95_ms": round(p95, 2),
            "max_ms": round(ms[-1], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200,000 fires instead of 10,000,000")
    ap.add_argument("--rows", type=int, default=None, help="fires in the ledger (default 10,000,000)")
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--triggers", type=int, default=50, help="triggers per tenant")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--pg", default=None, help="an admin URL of a PostgreSQL server to use (else a private one)")
    args = ap.parse_args()
    total = args.rows or (200_000 if args.quick else 10_000_000)
    from pgserver import PgServer

    server = PgServer.external(args.pg) if args.pg else PgServer.start()
    try:
        url = server.new_database("fl_bench_history")
        store = Store.open(url, migrate=True)
        try:
            gen = generate(store, total, args.tenants, args.triggers)
            print(json.dumps({"scenario": "history-generate", "system": "postgres", "n": gen["fires"], **gen}),
                  flush=True)
            tn, tr = gen["target_tenant"], gen["target"]
            lo, hi = NOW_US - 30 * DAY_US, NOW_US + 1
            rng = random.Random(7)

            def first_page() -> Any:
                return store.history.history_fires(tn, trigger_id=tr, from_us=lo, to_us=hi, limit=101)

            def newest_page() -> Any:
                return store.history.history_fires(tn, trigger_id=tr, from_us=lo, to_us=hi, limit=101, descending=True)

            def deep_page() -> Any:
                at = lo + rng.randrange(0, 30 * DAY_US)
                return store.history.history_fires(tn, trigger_id=tr, from_us=lo, to_us=hi, after=(at, 0), limit=1001)

            def failed_only() -> Any:
                return store.history.history_fires(tn, trigger_id=tr, from_us=lo, to_us=hi, states=["failed"],
                                                   limit=101)

            def lateness() -> Any:
                return store.history.lateness_us(tn, tr, lo, hi), store.history.state_counts(tn, lo, hi, trigger_id=tr)

            def tenant_page() -> Any:
                return store.history.history_fires(tn, from_us=lo, to_us=hi, limit=101, descending=True)

            shapes = [("first-page-100", first_page), ("newest-page-100", newest_page),
                      ("random-cursor-page-1000", deep_page), ("state-failed-page-100", failed_only),
                      ("lateness-30d", lateness), ("tenant-newest-page-100", tenant_page)]
            for name, fn in shapes:
                runs = max(20, args.runs // (5 if name == "lateness-30d" else 1))
                res = timed(fn, runs)
                print(json.dumps({"scenario": f"history-{name}", "system": "postgres", "n": gen["fires"],
                                  "window_days": 30, **res, "target_p95_ms": 500, "aim_p95_ms": 50,
                                  "passed": res["p95_ms"] <= 500}), flush=True)
        finally:
            store.close()
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
