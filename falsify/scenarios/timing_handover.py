"""timing-handover-in-flight: a lease handover while a scan is in flight, forced deterministically.

Two timing loops with their lease managers run in this process against one real PostgreSQL
database, on fake clocks (the only way to place the race exactly). Node A holds every partition and
plans a due instant; it is paused *after* its last ownership check and right before its commit (the
loop's ``before_apply`` seam — a GC pause or a stalled socket in real life). Its session expires,
node B takes the partitions over, decides the same instant and commits. Then A resumes and commits.

Passes when A's insert loses on the primary key (``ON CONFLICT DO NOTHING`` inserts zero rows), A's
due-row compare-and-set matches nothing, no statement of A deletes or updates a fire (no application
code resolves the conflict), and the ledger holds exactly one record for the instant — B's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from falsify.timing_cluster import pg_server
from fireledger.clock import FakeClock
from fireledger.domain.model import Decision
from fireledger.store import Store
from fireledger.timing import LeaseManager, LeaseSettings, TimingLoop
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000


class Recorder:
    """Wraps a store engine's write transactions and records every statement's name and rowcount."""

    def __init__(self, store: Store) -> None:
        self.log: list[tuple[str, int]] = []
        names = {v: k for k, v in store.q.items()}
        engine = store.engine
        inner = engine.write

        @contextmanager
        def write() -> Any:
            with inner() as conn:
                yield _Conn(conn, names, self.log)

        engine.write = write  # type: ignore[method-assign]


class _Conn:
    def __init__(self, conn: Any, names: dict[str, str], log: list[tuple[str, int]]) -> None:
        self._conn, self._names, self._log = conn, names, log

    def execute(self, query: str, params: Any = None) -> Any:
        cur = self._conn.execute(query, params)
        self._log.append((self._names.get(query, query[:40]), cur.rowcount))
        return cur

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def run() -> dict[str, Any]:
    url = pg_server().new_database(prefix="fl_falsify")
    setup = Store.open(url, migrate=True)
    store_a = Store.open(url)
    store_b = Store.open(url)
    try:
        setup.timing.ensure_partitions()
        t = add_tenant(setup)
        trig, _, first = add_trigger(setup, t, add_target(setup, t), {"every": "60s"}, partition=17)
        settings = LeaseSettings(rotate_after_s=0)
        clock_a = FakeClock(first - 1 * S, eps_us=5_000)
        clock_b = FakeClock(first - 1 * S, eps_us=5_000)
        a = LeaseManager(store_a, clock_a, "node-a", settings)
        b = LeaseManager(store_b, clock_b, "node-b", settings)
        a.cycle()
        b.cycle()
        held_before = (len(a.ownership().partitions), len(b.ownership().partitions))

        paused, resume = threading.Event(), threading.Event()
        planned: list[Sequence[Decision]] = []

        def pause_before_commit(decisions: Sequence[Decision]) -> None:
            planned.append(decisions)
            paused.set()
            resume.wait(30)

        loop_a = TimingLoop(store_a, clock_a, "node-a", leases=a, before_apply=pause_before_commit)
        loop_b = TimingLoop(store_b, clock_b, "node-b", leases=b)
        # The instant is due; A scans, plans and stops right before its commit.
        clock_a.advance(1 * S + 10_000)
        clock_b.advance(1 * S + 10_000)
        result_a: dict[str, Any] = {}
        rec = Recorder(store_a)
        th = threading.Thread(target=lambda: result_a.update(res=loop_a.tick()), name="node-a-tick")
        th.start()
        if not paused.wait(30):
            return {"passed": False, "error": "node A never reached its commit"}
        log_start = len(rec.log)
        # A is silent: its session expires by B's clock; B takes every partition over and decides.
        clock_b.advance(int(settings.session_ttl_s * S) + 200_000)
        b.cycle()
        b.cycle()
        taken = len(b.ownership().partitions)
        res_b = loop_b.tick()
        # A resumes and commits its stale decision.
        resume.set()
        th.join(30)
        res_a = result_a.get("res")
        a_stmts = rec.log[log_start:]
        inserts = [n for q, n in a_stmts if q == "insert_fire"]
        advances = [n for q, n in a_stmts if q in ("advance_due", "retire_due")]
        resolving = [q for q, _ in a_stmts if q in ("delete_fire",) or q.startswith("UPDATE fires")]
        with setup.engine.read() as c:
            rows = c.execute("SELECT decided_by FROM fires WHERE trigger_id = %s AND scheduled_us = %s",
                             (trig.id, first)).fetchall()
            lease = c.execute("SELECT owner, epoch, takeover_cause FROM leases WHERE partition = 17").fetchone()
        decided_by = [r[0] for r in rows]
        passed = (res_a is not None and res_b is not None and len(planned) == 1
                  and [f.scheduled_us for f in res_b.inserted] == [first]
                  and inserts == [0] and advances == [0] and not resolving
                  and res_a.inserted == [] and res_a.lost == 1 and decided_by == ["node-b"]
                  and lease[0] == "node-b")
        return {
            "passed": passed, "system": "postgres",
            "held_before": {"node-a": held_before[0], "node-b": held_before[1]},
            "taken_over_by_b": taken, "lease_17": {"owner": lease[0], "epoch": lease[1], "cause": lease[2]},
            "b_inserted": len(res_b.inserted),
            "a_insert_rowcounts": inserts, "a_advance_rowcounts": advances,
            "a_resolving_statements": resolving, "a_lost": None if res_a is None else res_a.lost,
            "records_for_instant": len(decided_by), "decided_by": decided_by,
        }
    finally:
        for s in (store_a, store_b, setup):
            s.close()


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "timing-handover-in-flight", run
