"""``policy-pause-…``: a paused gap is decided by the missed-fire policy and the catch-up horizon, like
an outage (invariant 7, decision 0063), and caught-up fires drain within the tenant's catch-up cap
(invariant 8).

Expected counts are computed here from the declared policy itself — every instant of the gap (from the
resume point the pause recorded to the decision instant) classified by its lateness: on time (≤ the
miss threshold), expired (older than the horizon), otherwise missed within the horizon and then
dispatched (``fire-all``), the most recent one dispatched only if none is on time (``fire-once-now``)
or skipped (``skip``). The recorded counts are read from the ledger (a range record counts its range).

* ``policy-pause-fire-all``, ``policy-pause-fire-once-now``, ``policy-pause-skip`` — one process, the
  real control API (FastAPI test client) over a real SQLite store, the real timing loop driven by a
  fake clock (``TimingLoop.tick``): a 1-minute trigger (horizon 1 h) fires three times, is paused for
  three hours and resumed. Passed when the recorded counts equal the expected ones, every
  non-dispatch has its cause in the history, the shadow rebuilder sees no divergence before and after
  the decision, and then — the real dispatcher delivering to a real HTTP sink on a system clock
  shifted to the fake timeline — every released fire arrives (caught-up ones in the catch-up lane,
  with their original instant) and the catch-up drain, measured from the attempts' start instants,
  stays within the tenant's cap (catch-up fraction × quota; 2 % stamp tolerance as in
  ``dispatch-lanes``).
* ``policy-pause-real`` — real processes: ``fireledger serve`` on SQLite with a shortened miss
  threshold (``FIRELEDGER_MISS_THRESHOLD_S``), a real sink, an ownership-verified target, an
  every-second ``fire-all`` trigger with a short horizon, paused for a few seconds of wall time and
  resumed over HTTP. Expected counts come from the resume point and the decision instant the store
  recorded (no edge allowance); passed when they match exactly, the causes are in the history, the
  caught-up fires arrive in the catch-up lane with their original instants, and the catch-up drain
  stays within the cap.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

S = 1_000_000
M = 60 * S
H = 3600 * S
#: Attempt starts are stamped at claim time; see falsify/scenarios/dispatch_lanes.py.
MEASURE_TOLERANCE = 1.02
COUNT_KEYS = ("dispatched", "caught_up", "on_time", "skipped", "expired")


# --- shared -----------------------------------------------------------------------------------


def expected_counts(instants: list[int], decided_us: int, policy: str, horizon_us: int,
                    threshold_us: int) -> dict[str, int]:
    """The declared policy applied to ``instants`` decided at ``decided_us`` (not the planner's code)."""
    on_time = [u for u in instants if decided_us - u <= threshold_us]
    missed = [u for u in instants if decided_us - u > threshold_us]
    expired = [u for u in missed if decided_us - u > horizon_us]
    within = [u for u in missed if decided_us - u <= horizon_us]
    if policy == "fire-all":
        caught, skipped = len(within), 0
    elif policy == "fire-once-now":
        caught = 1 if within and not on_time else 0
        skipped = len(within) - caught
    else:
        caught, skipped = 0, len(within)
    return {"dispatched": caught + len(on_time), "caught_up": caught, "on_time": len(on_time),
            "skipped": skipped, "expired": len(expired)}


def ledger_counts(fires: list[Any]) -> dict[str, int]:
    """One plan's instants by outcome from its fire records (a range record counts its range)."""
    from fireledger.domain.policies import record_weight

    out = dict.fromkeys(COUNT_KEYS, 0)
    for f in fires:
        n, _ = record_weight(f.cause)
        if f.state in ("skipped", "expired"):
            out[f.state] += n
        else:
            out["dispatched"] += n
            out["caught_up" if f.lane == "catch-up" else "on_time"] += n
    return out


def instants_between(schedule: dict[str, Any], after_us: int, until_us: int) -> list[int]:
    from fireledger.definitions import compile_schedule, next_us

    rec = compile_schedule(schedule)
    out: list[int] = []
    t = next_us(rec, after_us)
    while t is not None and t <= until_us:
        out.append(t)
        t = next_us(rec, t)
    return out


def rate_per_s(starts: list[int]) -> float:
    """Attempts per second between the first and last start (n − 1 intervals); 0 for fewer than 2."""
    if len(starts) < 2:
        return 0.0
    span = starts[-1] - starts[0]
    return float("inf") if span <= 0 else (len(starts) - 1) / (span / S)


def first_attempt_starts(store: Any, tenant_id: str, trigger_id: str, lane: str) -> list[int]:
    with store.engine.read() as c:
        rows = c.execute(
            "SELECT a.started_us FROM attempts a JOIN fires f ON f.tenant_id = a.tenant_id "
            "AND f.trigger_id = a.trigger_id AND f.scheduled_us = a.scheduled_us AND f.seq = a.seq "
            f"WHERE a.attempt = 1 AND f.lane = '{lane}' AND a.tenant_id = ? AND a.trigger_id = ? "
            "ORDER BY a.started_us", (tenant_id, trigger_id)).fetchall()
    return [int(r[0]) for r in rows]


def iso(us: int) -> str:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    return format_instant(from_us(us))


class ShiftedClock:
    """The system clock read ``offset_us`` later (the dispatcher continues the fake timeline)."""

    def __init__(self, offset_us: int, eps_us: int = 2_000) -> None:
        from fireledger.clock import SystemClock

        self.base = SystemClock(declared_eps_us=eps_us)
        self.offset_us = offset_us

    def now(self) -> Any:
        from fireledger.clock.base import Interval

        iv = self.base.now()
        return Interval(iv.earliest_us + self.offset_us, iv.latest_us + self.offset_us, iv.source)

    def monotonic(self) -> float:
        return self.base.monotonic()


def _causes(history: list[dict[str, Any]], policy: str, horizon: str, failures: list[str]) -> dict[str, Any]:
    quiet = [f for f in history if f["state"] in ("expired", "skipped")]
    without = [f["key"] for f in quiet if not f["cause"]]
    if without:
        failures.append(f"{len(without)} non-dispatched fires without a cause in the history")
    expired_ok = all(f"catch-up horizon ({horizon})" in f["cause"] for f in quiet
                     if f["state"] == "expired" and f["cause"])
    skipped_ok = all(policy in f["cause"] for f in quiet if f["state"] == "skipped" and f["cause"])
    if not (expired_ok and skipped_ok):
        failures.append("a cause does not name the horizon (expired) or the policy (skipped)")
    return {"history_non_dispatched_records": len(quiet),
            "history_range_records": sum(1 for f in quiet if (f["cause"] or "").startswith("range: "))}


# --- in one process ---------------------------------------------------------------------------


def in_process(policy: str, quota_per_s: float, pause_h: int) -> dict[str, Any]:
    """The sink is on loopback, which the egress guard admits only while the operator's switch is on
    (restored afterwards)."""
    before = os.environ.get("FIRELEDGER_ALLOW_PRIVATE_TARGETS")
    os.environ["FIRELEDGER_ALLOW_PRIVATE_TARGETS"] = "1"
    try:
        return _in_process(policy, quota_per_s, pause_h)
    finally:
        if before is None:
            os.environ.pop("FIRELEDGER_ALLOW_PRIVATE_TARGETS", None)
        else:
            os.environ["FIRELEDGER_ALLOW_PRIVATE_TARGETS"] = before


def _in_process(policy: str, quota_per_s: float, pause_h: int) -> dict[str, Any]:
    import asyncio

    from fastapi.testclient import TestClient

    from fireledger.clock import FakeClock
    from fireledger.control import create_app
    from fireledger.control.auth import create_tenant
    from fireledger.dispatch.runner import Dispatcher
    from fireledger.domain.policies import DEFAULT_MISS_THRESHOLD_US
    from fireledger.store import Store
    from fireledger.timing import TimingLoop
    from fireledger.timing.shadow import compare
    from sink import SinkServer
    from storekit import run_planes_until

    failures: list[str] = []
    out: dict[str, Any] = {"policy": policy, "period_s": 60, "horizon_s": 3600, "pause_s": pause_h * 3600,
                           "miss_threshold_s": DEFAULT_MISS_THRESHOLD_US / S}
    sink = SinkServer()
    sink.start_in_thread()
    work = Path(tempfile.mkdtemp(prefix=f"policy-pause-{policy}-"))
    store = Store.open(f"sqlite:///{work}/fl.db")
    # The fake timeline ends (at the resume) about a minute before real time, so the dispatcher's
    # shifted clock and the sink's signature window agree.
    t0 = (time.time_ns() // 1000 // M) * M - pause_h * H - 5 * M
    clock = FakeClock(t0)
    client = TestClient(create_app(store, clock, allow_private_targets=True), raise_server_exceptions=False)
    client.__enter__()
    try:
        tenant_id, token = create_tenant(store, f"pause-{policy}-{time.monotonic_ns()}", t0)
        store.dispatch.set_tenant_quota(tenant_id, fires_per_s=quota_per_s)
        auth = {"Authorization": f"Bearer {token}"}

        def call(method: str, path: str, body: Any = None, ok: int = 200, **kw: Any) -> Any:
            r = client.request(method, path, json=body, headers=auth, **kw)
            if r.status_code != ok:
                raise RuntimeError(f"{method} {path} -> {r.status_code}: {r.text[:300]}")
            return r.json()

        tg = call("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hook"}, ok=201)
        sink.add_secret(tg["secret"])
        sink.add_challenge(tg["verification"]["token"], tg["verification"]["response"])
        if call("POST", f"/v1/targets/{tg['id']}/verify")["verification"]["state"] != "verified":
            raise RuntimeError("the target's ownership was not verified")
        tr = call("POST", "/v1/triggers", {"name": "every minute", "schedule": {"every": "60s"},
                                           "target_id": tg["id"], "payload": {"report": "minutely"},
                                           "missed_fire_policy": policy, "jitter": "0s"}, ok=201)
        tid = tr["id"]
        loop = TimingLoop(store, clock, "pause-timing")
        for _ in range(3):
            clock.advance(M)
            loop.tick()
        clock.advance(25 * S)
        call("POST", f"/v1/triggers/{tid}/pause")
        paused, point = store.registry.resume_point(tenant_id, tid)
        if not paused or point is None:
            raise RuntimeError("the pause recorded no resume point")
        clock.advance(pause_h * H)
        if loop.tick().inserted:
            failures.append("fires were decided while the trigger was paused")
        resumed = call("POST", f"/v1/triggers/{tid}/resume")
        schedule = call("GET", f"/v1/triggers/{tid}")["schedule"]
        gap0 = instants_between(schedule, point, point + M)[0]   # the first instant after the pause
        if resumed["next_instant"] != iso(gap0):
            failures.append(f"resume set {resumed['next_instant']}, not the first instant after the pause")

        def divergent() -> int:
            part = store.registry.get_trigger(tenant_id, tid).partition
            rows, strays = store.timing.shadow_snapshot(part)
            return compare(part, rows, strays, store.timing.partition_count(), node="f", now_us=0).divergent

        shadow_before = divergent()
        res = loop.tick()
        decided = res.earliest_us
        shadow_after = divergent()
        if shadow_before or shadow_after:
            failures.append(f"the shadow rebuilder saw divergence ({shadow_before} before, {shadow_after} after)")
        gap = instants_between(schedule, point, decided)
        expected = expected_counts(gap, decided, policy, H, DEFAULT_MISS_THRESHOLD_US)
        plan = store.registry.last_gap_fires(tenant_id, tid)
        recorded = ledger_counts(plan)
        out.update(gap_instants=len(gap), expected=expected, recorded=recorded,
                   plan_records=len(plan), paused_at=iso(point), decided_at=iso(decided))
        if not plan or plan[0].decided_us != decided:
            failures.append("the resumed gap's plan is not the last recorded gap")
        if recorded != expected:
            failures.append(f"recorded {recorded} != expected {expected}")
        history = call("GET", f"/v1/triggers/{tid}/fires", params={"limit": 1000})["items"]
        out.update(_causes(history, policy, "1h", failures))
        # Dispatch: every released fire (the three before the pause, the plan's) over real HTTP.
        offset = clock.now().latest_us - time.time_ns() // 1000
        dispatcher = Dispatcher(store, ShiftedClock(offset), "pause-dispatch")
        released = 3 + recorded["dispatched"]

        def delivered() -> bool:
            with store.engine.read() as c:
                n = c.execute("SELECT COUNT(*) FROM fires WHERE trigger_id = ? AND state = 'delivered'",
                              (tid,)).fetchone()[0]
            return int(n) >= released

        cap = _cap(store, tenant_id)
        asyncio.run(run_planes_until([dispatcher], delivered, 30 + 2 * recorded["caught_up"] / cap))
        recs = sink.records()
        caught = [r for r in recs if r["lane"] == "catch-up"]
        gap_iso = {iso(u) for u in gap}
        wrong = [r for r in caught if r["kind"] != "catch-up" or r["scheduled_instant"] not in gap_iso]
        if wrong or len(caught) != recorded["caught_up"]:
            failures.append(f"{len(caught)} catch-up deliveries ({len(wrong)} wrong), expected "
                            f"{recorded['caught_up']} with their original instants")
        if len({r["fire_key"] for r in recs}) != released or not all(r["signature_ok"] for r in recs):
            failures.append("not every released fire arrived once, signed")
        starts = first_attempt_starts(store, tenant_id, tid, "catch-up")
        rate = rate_per_s(starts)
        out.update(deliveries=len(recs), catch_up_attempts=len(starts), catch_up_rate_per_s=round(rate, 3),
                   catch_up_cap_per_s=cap, quota_per_s=quota_per_s)
        if rate > cap * MEASURE_TOLERANCE:
            failures.append(f"catch-up drained at {rate:.3f}/s, over the tenant's cap {cap}/s")
    finally:
        client.__exit__(None, None, None)
        store.close()
        sink.stop()
    out["failures"] = failures
    out["passed"] = not failures
    return out


def _cap(store: Any, tenant_id: str) -> float:
    quota = store.dispatch.tenant_quota(tenant_id)
    assert quota is not None
    return round(quota[0] * quota[2], 6)


# --- real processes ---------------------------------------------------------------------------


def real(pause_s: float, horizon_s: int, threshold_s: float, quota_per_s: float) -> dict[str, Any]:
    from e2e import Api, Service, new_tenant, verify_target, wait_until
    from fireledger.store import Store
    from sink import SinkServer

    failures: list[str] = []
    out: dict[str, Any] = {"policy": "fire-all", "period_s": 1, "horizon_s": horizon_s,
                           "miss_threshold_s": threshold_s, "pause_s": pause_s}
    sink = SinkServer()
    sink.start_in_thread()
    work = Path(tempfile.mkdtemp(prefix="policy-pause-real-"))
    db = f"sqlite:///{work}/fl.db"
    svc = Service(db, work, env={"FIRELEDGER_MISS_THRESHOLD_S": str(threshold_s),
                                 "FIRELEDGER_KEYRING": str(work / "keys.json")})
    store = None
    try:
        svc.start()
        tenant_id, token = new_tenant(db, "pause-real")
        store = Store.open(db)
        store.dispatch.set_tenant_quota(tenant_id, fires_per_s=quota_per_s)
        api = Api(svc.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hook"}, 201)
        sink.add_secret(tg["secret"])
        verify_target(api, sink, tg)
        tr = api.ok("POST", "/v1/triggers", {"name": "every second", "schedule": {"every": "1s"},
                                             "target_id": tg["id"], "payload": {"n": 1},
                                             "missed_fire_policy": "fire-all", "catchup_horizon": f"{horizon_s}s",
                                             "jitter": "0s"}, 201)
        tid = tr["id"]
        wait_until(lambda: len(sink.records()) >= 2, 20, "the trigger to fire on time")
        api.ok("POST", f"/v1/triggers/{tid}/pause", None, 200)
        time.sleep(pause_s)   # the pause itself (the stimulus), not a wait for a condition
        api.ok("POST", f"/v1/triggers/{tid}/resume", None, 200)
        before = len(sink.records())
        assert store is not None
        st = store

        def plan_settled() -> list[Any] | None:
            plan = st.registry.last_gap_fires(tenant_id, tid)
            if plan and all(f.state not in ("pending", "dispatching") for f in plan):
                return plan
            return None

        plan = wait_until(plan_settled, 30 + 2 * horizon_s, "the resumed gap to be decided and delivered", 0.1)
        with st.engine.read() as c:
            point = c.execute("SELECT paused_us FROM triggers WHERE id = ?", (tid,)).fetchone()[0]
        decided = plan[0].decided_us
        schedule = api.ok("GET", f"/v1/triggers/{tid}")["schedule"]
        gap = instants_between(schedule, int(point), decided)
        expected = expected_counts(gap, decided, "fire-all", horizon_s * S, round(threshold_s * S))
        recorded = ledger_counts(plan)
        out.update(gap_instants=len(gap), expected=expected, recorded=recorded, resume_point=iso(int(point)),
                   decided_at=iso(decided), gap_length_s=round((decided - int(point)) / S, 3))
        if recorded != expected:
            failures.append(f"recorded {recorded} != expected {expected}")
        if not expected["caught_up"] or not expected["expired"]:
            failures.append("the figures exercised no catch-up or no expiry (pause too short?)")
        history = api.ok("GET", f"/v1/triggers/{tid}/fires?state=expired,skipped&limit=1000")["items"]
        out.update(_causes(history, "fire-all", f"{horizon_s}s", failures))
        recs = sink.records(before)
        caught = [r for r in recs if r["lane"] == "catch-up"]
        gap_iso = {iso(u) for u in gap}
        wrong = [r for r in caught if r["kind"] != "catch-up" or r["scheduled_instant"] not in gap_iso
                 or not r["signature_ok"]]
        if wrong or len({r["fire_key"] for r in caught}) != recorded["caught_up"]:
            failures.append(f"{len(caught)} catch-up deliveries ({len(wrong)} wrong), expected "
                            f"{recorded['caught_up']} with their original instants")
        starts = first_attempt_starts(st, tenant_id, tid, "catch-up")
        rate = rate_per_s(starts)
        cap = _cap(st, tenant_id)
        out.update(catch_up_attempts=len(starts), catch_up_rate_per_s=round(rate, 3), catch_up_cap_per_s=cap,
                   quota_per_s=quota_per_s)
        if rate > cap * MEASURE_TOLERANCE:
            failures.append(f"catch-up drained at {rate:.3f}/s, over the tenant's cap {cap}/s")
    finally:
        svc.stop()
        if store is not None:
            store.close()
        sink.stop()
    out["failures"] = failures
    out["passed"] = not failures
    return out


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    # Quick: a higher quota drains the 59 caught-up fires of fire-all faster (cap 20/s instead of 10/s).
    quota = 200.0 if quick else 100.0
    for policy in ("fire-all", "fire-once-now", "skip"):
        yield f"policy-pause-{policy}", lambda policy=policy: in_process(policy, quota, 3)
    if quick:
        yield "policy-pause-real", lambda: real(pause_s=10, horizon_s=6, threshold_s=2, quota_per_s=20.0)
    else:
        yield "policy-pause-real", lambda: real(pause_s=40, horizon_s=20, threshold_s=5, quota_per_s=50.0)
