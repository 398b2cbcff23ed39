"""``dispatch-two-dispatchers-kill-9``: two ``fireledger dispatch`` processes share the lanes on
PostgreSQL (claims with ``FOR UPDATE SKIP LOCKED``); one is killed with ``kill -9`` mid-run, holding
attempts in flight.

Real processes throughout: a database of its own on the run's throwaway PostgreSQL server
(``falsify.timing_cluster.pg_server``, shared with the timing scenarios; decision 0238), ``fireledger timing`` and two
``fireledger dispatch`` processes, a real HTTP sink on loopback that takes 0.3 s to answer; the kill
lands while the victim holds attempts in flight. Twenty triggers fire every second (timeout 2 s: a dead
runner's lease lapses after 2 s + 5 s margin). After the kill the survivor carries on alone; then
the timing plane stops and every committed fire must settle.

Passing means: every committed fire is ``delivered``; no fire has more than one extra attempt
(attempts − 1 ≤ 1); every fire reached the sink, at most twice (a repeat is always a further attempt
under the same key); both dispatchers delivered before the kill; and the fires the killed process
held were delivered by the survivor after their lease lapsed.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def kill_one_of_two(before_s: float, after_s: float) -> dict[str, Any]:
    from e2e import Service, cli, wait_until
    from falsify.timing_cluster import pg_server
    from fireledger.domain.model import Policies
    from fireledger.store import Store
    from sink import SinkServer
    from storekit import add_target, add_tenant, add_trigger

    failures: list[str] = []
    out: dict[str, Any] = {}
    work = Path(tempfile.mkdtemp(prefix="dispatch-kill-"))
    sink = SinkServer(secrets=[SECRET])
    sink.start_in_thread()
    procs: list[Any] = []
    pg = pg_server()
    url = pg.new_database(prefix="fl_falsify")
    cli("db", "upgrade", "--db", url)
    store = Store.open(url)
    try:
        env = {"FIRELEDGER_KEYRING": str(work / "keys.json")}
        t = add_tenant(store, "shared")
        tg = add_target(store, t, url=f"{sink.base_url}/slow/0.3", secret=SECRET)
        from fireledger.clock import SystemClock

        now = SystemClock().now().latest_us
        for _ in range(20):
            add_trigger(store, t, tg, {"every": "1s"}, now_us=now, policies=Policies(timeout_s=2.0))
        a = Service(url, work, command="dispatch", env=env).start()
        b = Service(url, work, command="dispatch", env=env).start()
        timing = Service(url, work, command="timing", env=env).start()
        procs += [a, b, timing]

        def nodes() -> set[str]:
            with store.engine.read() as c:
                return {r[0] for r in c.execute("SELECT DISTINCT node FROM attempts").fetchall()}

        wait_until(lambda: len(nodes()) >= 2, 30, "both dispatchers to make attempts", interval_s=0.2)
        start = time.time()
        wait_until(lambda: time.time() >= start + before_s, before_s + 5, "the first half", interval_s=0.2)
        assert a.proc is not None
        a_tag = f"-{a.proc.pid}-"

        def a_holds() -> bool:
            with store.engine.read() as c:
                return bool(c.execute("SELECT COUNT(*) FROM fires WHERE state = 'dispatching' "
                                      "AND lease_owner LIKE %s", (f"%{a_tag}%",)).fetchone()[0])

        wait_until(a_holds, 20, "the first dispatcher to hold attempts in flight", interval_s=0.01)
        a.kill9()   # mid-attempt: the sink is still holding its requests
        killed_at = time.time()
        with store.engine.read() as c:
            held = [tuple(r) for r in c.execute(
                "SELECT tenant_id, trigger_id, scheduled_us, seq FROM fires WHERE state = 'dispatching' "
                "AND lease_owner LIKE %s", (f"%{a_tag}%",)).fetchall()]
        out["held_by_killed"] = len(held)
        wait_until(lambda: time.time() >= killed_at + after_s, after_s + 5, "the second half", interval_s=0.2)
        timing.stop()

        def settled() -> bool:
            with store.engine.read() as c:
                return c.execute("SELECT COUNT(*) FROM fires WHERE state IN ('pending', 'dispatching')"
                                 ).fetchone()[0] == 0

        wait_until(settled, 40, "every committed fire to settle", interval_s=0.25)
        settled_at = time.time()
        with store.engine.read() as c:
            states = dict(c.execute("SELECT state, COUNT(*) FROM fires GROUP BY state").fetchall())
            attempts = {(r[0], r[1], r[2], r[3]): int(r[4]) for r in c.execute(
                "SELECT tenant_id, trigger_id, scheduled_us, seq, attempts FROM fires").fetchall()}
            second = {(r[0], r[1], r[2], r[3]): r[4] for r in c.execute(
                "SELECT tenant_id, trigger_id, scheduled_us, seq, node FROM attempts WHERE attempt = 2"
            ).fetchall()}
            by_node = dict(c.execute("SELECT node, COUNT(*) FROM attempts GROUP BY node").fetchall())
    finally:
        for p in procs:
            p.stop()
        store.close()
        sink.stop()
    from fireledger.domain.keys import FireKey

    out["fires"] = sum(states.values())
    out["states"] = states
    out["attempts_by_node"] = {("killed" if a_tag in k else "survivor"): v for k, v in by_node.items()}
    extra = [n - 1 for n in attempts.values()]
    out["extra_attempts"] = sum(extra)
    out["max_extra_attempts_per_fire"] = max(extra, default=0)
    out["extra_attempts_per_fire"] = round(sum(extra) / max(1, len(extra)), 4)
    recs = Counter(r["fire_key"] for r in sink.records())
    keys = {str(FireKey(*k)) for k in attempts}
    out["deliveries"] = sum(recs.values())
    out["duplicate_deliveries"] = sum(v - 1 for v in recs.values())
    out["settle_s_after_kill"] = round(settled_at - killed_at, 1)
    if states.get("delivered", 0) != out["fires"]:
        failures.append(f"not every committed fire was delivered: {states}")
    if out["max_extra_attempts_per_fire"] > 1:
        failures.append(f"a fire had {out['max_extra_attempts_per_fire']} extra attempts")
    missing = keys - set(recs)
    if missing:
        failures.append(f"{len(missing)} fires never reached the sink")
    if set(recs) - keys:
        failures.append("the sink received a key the ledger does not hold")
    if max(recs.values(), default=0) > 2:
        failures.append("a fire reached the sink more than twice")
    if len(by_node) < 2:
        failures.append("the two dispatchers did not share the work")
    redone = [k for k in held if k in second and a_tag not in second[k]]
    out["held_redelivered_by_survivor"] = len(redone)
    if not held:
        failures.append("the killed dispatcher held no attempt at the kill (nothing was tested)")
    elif len(redone) != len(held):
        failures.append(f"{len(held) - len(redone)} of the killed dispatcher's fires were not taken over")
    out["failures"] = failures
    out["passed"] = not failures
    return out


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "dispatch-two-dispatchers-kill-9", lambda: kill_one_of_two(2.0 if quick else 15.0, 2.0 if quick else 15.0)
