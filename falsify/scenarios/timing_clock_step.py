"""timing-clock-step: one timing node's clock is stepped forward by 2 s while it owns partitions.

Three ``fireledger timing`` processes and one ``dispatch`` against one PostgreSQL; one timing node runs
under libfaketime (its own process only: ``LD_PRELOAD``, a timestamp file read live,
``FAKETIME_DONT_FAKE_MONOTONIC=1`` because a real step moves the wall clock and not the monotonic
one). Once that node holds its share of the partitions, its clock is stepped +2 s.

Passes when no fire is delivered before its scheduled instant by the sink's clock, at any percentile
(the minimum of arrival − scheduled over every delivery is ≥ 0), every instant in the window still
has exactly one fire record, and the stepped node sheds (its ε, from the PostgreSQL cross-check,
exceeds the ceiling) so its partitions are owned elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from e2e import wait_until
from falsify.timing_cluster import Cluster, EarlyWatch, S, libfaketime, now_us


def run(quick: bool) -> dict[str, Any]:
    n_trig = 40 if quick else 200
    after_s = 5 if quick else 30
    c = Cluster.create("clockstep")
    stamp = c.work / "faketime.rc"
    stamp.write_text("+0s\n")
    try:
        trigs = c.create_direct(n_trig, (1,))
        c.start("dispatch")
        normal = c.start_timing(2)
        stepped = c.start_timing(1, env={
            "LD_PRELOAD": libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"})[0]
        ids = [c.node_id(s) for s in normal]
        sid = c.node_id(stepped)
        c.wait_owned({*ids, sid}, 30, "the three nodes to share every partition")
        wait_until(lambda: c.held_by()[sid] >= 80, 30, "the node to be stepped to hold its share", interval_s=0.1)
        held_before = c.held_by()[sid]
        watch = EarlyWatch(c.db)
        window_from = now_us()
        time.sleep(1.0)   # let the stepped node decide a few instants with its true clock first
        stamp.write_text("+2s\n")
        t_step = now_us()
        shed_after = owned_after = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < after_s:
            if shed_after is None and c.sql("SELECT shedding FROM nodes WHERE id = %s", (sid,))[0][0]:
                shed_after = round(time.monotonic() - t0, 2)
            if owned_after is None and sid not in c.held_by():
                owned_after = round(time.monotonic() - t0, 2)
            time.sleep(0.1)
        window_to = now_us() - S
        early = watch.stop()
        c.wait_decided(trigs, window_to, 30)
        ledger = c.ledger_check(trigs, window_from, window_to)
        deadline = time.monotonic() + 30
        while c.sink_check(window_from, window_to)["fires_delivered"] < ledger["instants"] \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        sink = c.sink_check()                         # every delivery, at any percentile
        late = c.sink_check(window_from, window_to)
        by_stepped = c.sql("SELECT COUNT(*), MIN(decided_us - scheduled_us) FROM fires WHERE decided_by = %s "
                           "AND decided_us >= %s", (sid, t_step))[0]
        eps = c.sql("SELECT eps_us, eps_source FROM nodes WHERE id = %s", (sid,))[0]
        log_tail = stepped.log_text()
        passed = (sink["early"] == 0 and early["early_decisions_seen"] == 0
                  and ledger["missing_records"] == 0 and ledger["unexpected_records"] == 0
                  and ledger["duplicate_records"] == 0 and held_before > 0 and shed_after is not None
                  and owned_after is not None and sink["deliveries"] > 0)
        return {
            "passed": passed, "quick": quick, "system": "postgres", "triggers": n_trig, "step_s": 2,
            "deliveries": sink["deliveries"], "early": sink["early"],
            "earliest_arrival_minus_scheduled_s": sink["earliest_arrival_minus_scheduled_s"],
            **early,
            "delivery_lateness_p50_s": late["delivery_lateness_p50_s"],
            "delivery_lateness_p99_s": late["delivery_lateness_p99_s"],
            "stepped_node_partitions_before": held_before, "stepped_node_shed_after_s": shed_after,
            "partitions_owned_elsewhere_after_s": owned_after,
            "stepped_node_eps_ms": round(int(eps[0]) / 1000, 1), "stepped_node_eps_source": eps[1],
            "decided_by_stepped_node_after_step": int(by_stepped[0]),
            "step_detected_in_log": "stepped by" in log_tail,
            "instants": ledger["instants"], "missing_records": ledger["missing_records"],
            "duplicate_records": ledger["duplicate_records"],
            "decided_minus_scheduled_min_s": None if by_stepped[1] is None else int(by_stepped[1]) / S,
        }
    finally:
        c.close()


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "timing-clock-step", lambda: run(quick)
