"""What one dispatch claim costs as the backlog grows (issue 15, decision 0130): wall time of
``claim_shaped`` on a backlog of due fires, on SQLite and PostgreSQL.

One tenant, ``--triggers`` triggers, a backlog of B due fires spread over them (B from ``--backlogs``);
for each B the median and max of ``--runs`` claims that offer the dispatcher's default window
(528 candidates) to a shaper that admits nothing (the store is unchanged between runs), then the
time of one real claim that leases (the dispatcher's default shaper and capacity, 256 slots).
Prints one JSON object per (engine, backlog). PostgreSQL: a private throwaway server
(``tests/pgserver.py``) unless ``--pg ADMIN_URL``.

    PYTHONPATH=src python bench/claim_time.py [--backlogs 1000,5000,20000] [--engines sqlite,postgres]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fireledger.dispatch.lanes import DispatchConfig  # noqa: E402
from fireledger.dispatch.runner import _Shaper  # noqa: E402
from fireledger.dispatch.shaping import Capacity  # noqa: E402
from fireledger.domain.dispatch_records import ShapedDecision  # noqa: E402
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire  # noqa: E402
from fireledger.store import Store  # noqa: E402
from storekit import T0, add_target, add_tenant, add_trigger, open_store  # noqa: E402

S = 1_000_000
WINDOW = 528


class _Nothing:
    def bucket_keys(self, candidates: Any) -> list[str]:
        return []

    def decide(self, snapshot: Any) -> ShapedDecision:
        return ShapedDecision([], {})


def _fill(store: Store, triggers: list[Any], upto: int, have: int) -> None:
    """Add due fires so each trigger holds ``upto`` (it held ``have``), older ones last."""
    for trig in triggers:
        row = store.registry.get_trigger(trig.tenant_id, trig.id)
        fires = tuple(NewFire(trig.tenant_id, trig.id, T0 + k * S, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                              FireState.PENDING, T0 + k * S, "2026f", "t") for k in range(have, upto))
        store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])


def measure(store: Store, engine: str, n_triggers: int, backlogs: list[int], runs: int) -> None:
    t = add_tenant(store, "bench")
    tg = add_target(store, t)
    triggers = [add_trigger(store, t, tg, {"every": "1s"})[0] for _ in range(n_triggers)]
    have = 0
    for b in backlogs:
        per = max(1, b // n_triggers)
        _fill(store, triggers, per, have)
        have = per
        now = T0 + (per + 10) * S
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            store.dispatch.claim_shaped(now, "bench", {"on-time": WINDOW}, _Nothing(), 5 * S)
            times.append(time.perf_counter() - started)
        cap = Capacity(256, {"on-time": 256, "catch-up": 0, "backfill": 0}, 128)
        store.dispatch.set_tenant_quota(t.id, fires_per_s=1e6, inflight=100_000)
        started = time.perf_counter()
        res = store.dispatch.claim_shaped(now, "bench", {"on-time": WINDOW}, _Shaper(DispatchConfig(), cap), 5 * S)
        leasing = time.perf_counter() - started
        print(json.dumps({"scenario": "claim-time", "system": engine, "n": per * n_triggers,
                          "triggers": n_triggers, "claim_read_median_ms": round(1e3 * statistics.median(times), 2),
                          "claim_read_max_ms": round(1e3 * max(times), 2), "claim_lease_ms": round(1e3 * leasing, 2),
                          "leased": len(res.jobs)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlogs", default="1000,5000,20000")
    ap.add_argument("--triggers", type=int, default=300)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--engines", default="sqlite,postgres")
    ap.add_argument("--pg", default=None, help="an admin URL of a PostgreSQL server (else a private one)")
    args = ap.parse_args()
    backlogs = sorted(int(x) for x in args.backlogs.split(","))
    engines = args.engines.split(",")
    for engine in engines:
        with tempfile.TemporaryDirectory() as d:
            from e2e import use_state_dir  # a state directory (KEK, key ring) for the run

            use_state_dir(Path(d) / "state")
            server = None
            if engine == "postgres":
                from pgserver import PgServer

                server = PgServer.external(args.pg) if args.pg else PgServer.start()
            try:
                store = open_store(engine, d, server)
                try:
                    measure(store, engine, args.triggers, backlogs, args.runs)
                finally:
                    store.close()
            finally:
                if server is not None:
                    server.close()

if __name__ == "__main__":
    main()
