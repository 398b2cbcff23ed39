"""``dispatch-slow-and-silent-targets``: one deliberately slow target and one that never answers must
not make anyone else late (seed ADR-09/12/14; DESIGN.md invariants 8 and 9).

Real processes: ``fireledger serve`` on SQLite with 32 attempt slots, a real HTTP sink on loopback,
tenants made as ``fireledger tenant create`` makes them, targets and triggers through the API. Three
tenants fire every second:

* ``fast``   — 5 triggers to a target that answers at once;
* ``slow``   — 10 triggers to a target that answers after 2 s (20 attempts wanted in flight);
* ``silent`` — 30 triggers to a target that never answers, timeout 2 s (60 wanted in flight).

The slow and silent tenants want far more than the plane's 32 slots; their in-flight quota (6
each) keeps them to their share. Passing means: every fast fire in the run is delivered and its
lateness (sink arrival − scheduled instant) has p99 ≤ 1 s; every finished attempt at the silent
target ended at its deadline (2 s after it started, within 1.5 s of slack) and is ``unknown`` if
the sink received it, or ``retry`` with a cause naming the connection limit if it never got a
connection (the silent tenant's own adaptive limit for that endpoint, halved by its timeouts,
decision 0133: not sent, so not unknown, decision 0115); some silent fires end ``unknown``; the
slow target's attempts are delivered.

Remove the in-flight quota (``shaping.shape``) and the fast tenant's fires wait behind ~60 hung
attempts: its lateness grows by seconds and the scenario fails. Key the connection limits per
origin alone (the sink serves all three tenants on one port) and the fast tenant waits behind the
silent tenant's hung connections: the scenario fails too.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fireledger.recurrence import parse_instant

TIMEOUT_S = 2.0


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def slow_and_silent(run_s: float) -> dict[str, Any]:
    from e2e import Api, Service, verify_target, wait_until
    from fireledger.control.auth import create_tenant
    from fireledger.store import Store
    from sink import SinkServer

    work = Path(tempfile.mkdtemp(prefix="dispatch-targets-"))
    db = f"sqlite:///{work}/fl.db"
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(db, work, env={"FIRELEDGER_DISPATCH_CONCURRENCY": "32"}).start()
    failures: list[str] = []
    out: dict[str, Any] = {}
    t_setup = time.time()
    try:
        plan = {"fast": ("/ok", 5, "5s"), "slow": ("/slow/2", 10, "5s"), "silent": ("/hang", 30, f"{TIMEOUT_S:g}s")}
        apis: dict[str, Api] = {}
        ids: dict[str, list[str]] = {}
        store = Store.open(db)
        try:
            for name, (path, n, timeout) in plan.items():
                tenant_id, token = create_tenant(store, f"{name}-{time.monotonic_ns()}", int(time.time() * 1e6))
                if name != "fast":
                    store.dispatch.set_tenant_quota(tenant_id, inflight=6)     # an operator act (no API yet)
                api = apis[name] = Api(svc.base, token)
                tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{path}"}, 201)
                sink.add_secret(tg["secret"])
                verify_target(api, sink, tg)
                # jitter 0s: the whole-minute instants are not smeared (decision 0007), so lateness
                # measures the dispatch plane alone.
                ids[name] = [api.ok("POST", "/v1/triggers", {"name": f"{name}-{i}", "schedule": {"every": "1s"},
                                                             "target_id": tg["id"], "timeout": timeout,
                                                             "jitter": "0s"}, 201)["id"]
                             for i in range(n)]
        finally:
            store.close()
        start = time.time()
        out["setup_s"] = round(start - t_setup, 1)
        wait_until(lambda: time.time() >= start + run_s, run_s + 5, "the run", interval_s=0.2)
        end = time.time()
        # Let the fast fires of the run arrive, and the last silent attempts reach their deadline.
        fast_ids = set(ids["fast"])
        wait_until(lambda: time.time() >= end + TIMEOUT_S + 1.5, 10, "the last deadlines", interval_s=0.2)

        recs = sink.records()
        fast = [r for r in recs if r["trigger_id"] in fast_ids]
        late = [r["arrived_at"] - parse_instant(r["scheduled_instant"]).timestamp() for r in fast]
        out["fast_deliveries"] = len(fast)
        out["fast_lateness_p50_s"] = round(_pct(late, 50), 4)
        out["fast_lateness_p99_s"] = round(_pct(late, 99), 4)
        out["fast_lateness_max_s"] = round(max(late, default=float("nan")), 4)
        if not fast or _pct(late, 99) > 1.0:
            failures.append(f"fast tenant late: p99 {out['fast_lateness_p99_s']} s over {len(fast)} deliveries")
        # Every fast fire of the run was delivered (one record per instant per trigger at least).
        missing = 0
        for tid in ids["fast"]:
            fires = apis["fast"].ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]
            for f in fires:
                if parse_instant(f["scheduled_instant"]).timestamp() <= end - 1 and f["state"] != "delivered":
                    missing += 1
        out["fast_not_delivered"] = missing
        # The silent target: every attempt that was written ends unknown at its deadline; one that
        # never got a connection (its tenant's adaptive limit for the endpoint was in use until the
        # deadline, decision 0133) was never sent: retry, with a cause naming the limit (0115's rule).
        hang_sent = {(r["fire_key"], r["attempt"]) for r in sink.records() if r["path"] == "/hang"}
        durations: list[float] = []
        results: dict[str, int] = {}
        states: dict[str, int] = {}
        wrong: list[str] = []
        for tid in ids["silent"]:
            for f in apis["silent"].ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]:
                states[f["state"]] = states.get(f["state"], 0) + 1
                for a in f["attempts"]:
                    if a["finished_at"] is None:
                        continue
                    results[a["result"]] = results.get(a["result"], 0) + 1
                    durations.append(parse_instant(a["finished_at"]).timestamp()
                                     - parse_instant(a["started_at"]).timestamp())
                    written = (f["key"], a["attempt"]) in hang_sent
                    if a["result"] == "unknown" and not written:
                        wrong.append(f"unknown but never received: {f['key']}#{a['attempt']}")
                    elif a["result"] == "retry" and written:
                        wrong.append(f"retry, but received: {f['key']}#{a['attempt']}: {a['error']}")
                    elif a["result"] == "retry" and "free connection" not in (a["error"] or ""):
                        wrong.append(f"retry not for the connection limit: {a['error']}")
                    elif a["result"] not in ("unknown", "retry"):
                        wrong.append(f"{a['result']}: {a['error']}")
        out["silent_attempt_results"] = results
        out["silent_fire_states"] = states
        out["silent_attempt_s_min"] = round(min(durations, default=float("nan")), 3)
        out["silent_attempt_s_max"] = round(max(durations, default=float("nan")), 3)
        if not results.get("unknown") or wrong:
            failures.append(f"silent attempts: {results}; {wrong[:3]}")
        if durations and (min(durations) < TIMEOUT_S - 0.01 or max(durations) > TIMEOUT_S + 1.5):
            failures.append(f"silent attempts did not end at their deadline: {min(durations):.3f}–"
                            f"{max(durations):.3f} s for a {TIMEOUT_S:g} s timeout")
        if not states.get("unknown"):
            failures.append(f"no silent fire ended unknown: {states}")
        # The slow tenant is served too (its quota, not the fast tenant's time).
        slow_ok = sum(1 for r in recs if r["path"] == "/slow/2")
        out["slow_attempts_sent"] = slow_ok
        slow_delivered = 0
        for tid in ids["slow"]:
            slow_delivered += sum(1 for f in apis["slow"].ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]
                                  if f["state"] == "delivered")
        out["slow_delivered"] = slow_delivered
        if not slow_delivered:
            failures.append("the slow target got no delivery")
        out["silent_inflight_wanted"] = int(30 * TIMEOUT_S)
        out["plane_slots"] = 32
        out["median_silent_attempt_s"] = round(statistics.median(durations), 3) if durations else None
    finally:
        svc.stop()
        sink.stop()
    out["failures"] = failures
    out["passed"] = not failures
    return out


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "dispatch-slow-and-silent-targets", lambda: slow_and_silent(4.0 if quick else 30.0)
