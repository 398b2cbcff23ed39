"""timing-eps-shed: a timing node's ε is pushed past the 100 ms ceiling while it owns partitions.

Three ``fireledger timing`` processes against one PostgreSQL:

* A — healthy;
* B — healthy at first, its connections to PostgreSQL through a TCP proxy; once B holds its share,
  the proxy delays B's traffic to the server by 250 ms. The clock cross-check measures the round trip
  (ε ≈ |offset| + rtt/2 ≈ 125 ms), so B's ε crosses the ceiling: a real excursion, not a flag;
* C — started with ``FIRELEDGER_DECLARED_EPS_MS=150``: its declared bound is over the ceiling from
  the start.

Passes when B says it sheds (its session row) and every partition is owned elsewhere within 15 s of
the delay (B may lose its leases even before its next clock probe: a 250 ms round trip also slows its
renewals, and whichever comes first moves the partitions), C
never holds a lease (and says it sheds), two of three nodes shedding is reported as a correlated
excursion by A within the 30 s window (polled with the rest: B's heartbeats over the slowed link
come close to the 3 s session TTL, so A may read B as live only on some of its cycles), and (full
form) B rejoins — takes partitions again — once the delay is removed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from e2e import wait_until
from falsify.timing_cluster import Cluster, DelayProxy


def run(quick: bool) -> dict[str, Any]:
    c = Cluster.create("shed")
    parts = urlsplit(c.db)
    proxy = DelayProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        fast = {"FIRELEDGER_REJOIN_AFTER_S": "2"}
        a = c.start_timing(1, env=fast)[0]
        b = c.start_timing(1, env=fast, db=proxy.url_for(c.db))[0]
        cc = c.start_timing(1, env={**fast, "FIRELEDGER_DECLARED_EPS_MS": "150"})[0]
        ida, idb, idc = c.node_id(a), c.node_id(b), c.node_id(cc)
        wait_until(lambda: c.held_by()[ida] == 128 and c.held_by()[idb] == 128, 40,
                   "A and B to share the partitions (C sheds from the start)", interval_s=0.1)
        c_state = c.sql("SELECT shedding, eps_us FROM nodes WHERE id = %s", (idc,))[0]
        proxy.delay_s = 0.25
        t0 = time.monotonic()
        shed_at = owned_at = excursion_at = None
        deadline = t0 + 30
        b_eps = None
        while time.monotonic() < deadline and (owned_at is None or shed_at is None or excursion_at is None):
            row = c.sql("SELECT shedding, eps_us FROM nodes WHERE id = %s", (idb,))[0]
            if shed_at is None and row[0]:
                shed_at = round(time.monotonic() - t0, 2)
                b_eps = int(row[1])
            if owned_at is None and set(c.lease_owners().values()) == {ida}:
                owned_at = round(time.monotonic() - t0, 2)
            if excursion_at is None and "correlated clock excursion" in a.log_text():
                excursion_at = round(time.monotonic() - t0, 2)   # A saw two of three shedding
            time.sleep(0.05)
        c_held_ever = c.held_by()[idc]
        excursion = excursion_at is not None
        proxy.delay_s = 0.0
        t1 = time.monotonic()
        rejoin_s = None
        if not quick:   # the quick form leaves rejoining to tests/planes/test_timing_leases.py (fake clock)
            try:
                wait_until(lambda: c.held_by()[idb] >= 100, 40, "B to rejoin", interval_s=0.1)
                rejoin_s = round(time.monotonic() - t1, 2)
            except TimeoutError:
                pass
        passed = (owned_at is not None and owned_at <= 15.0 and shed_at is not None and shed_at <= 15.0
                  and c_held_ever == 0 and bool(c_state[0])
                  and excursion and (quick or rejoin_s is not None))
        # a failure says why: the lines B logged at warning or above (no payloads are ever logged)
        b_said = [ln for ln in b.log_text().splitlines() if any(w in ln for w in ("WARNING", "ERROR", "sheds"))]
        return {
            **({} if passed else {"b_log_tail": [ln[:300] for ln in b_said[-12:]]}),
            "passed": passed, "quick": quick, "system": "postgres", "excursion": "rtt +250 ms on B's connections",
            "b_shed_after_s": shed_at, "b_eps_ms_when_shed": None if b_eps is None else round(b_eps / 1000, 1),
            "owned_elsewhere_after_s": owned_at, "budget_s": 15,
            "c_declared_eps_ms": round(int(c_state[1]) / 1000, 1), "c_shedding": bool(c_state[0]),
            "c_partitions_held": c_held_ever, "correlated_excursion_reported": excursion,
            "excursion_reported_after_s": excursion_at,
            "b_rejoined_after_s": rejoin_s,
        }
    finally:
        c.close()
        proxy.close()


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "timing-eps-shed", lambda: run(quick)
