"""``dispatch-retry-policy``: a target that fails for a while, three triggers under three retry
policies; each fire's attempts, backoffs and ending must match its policy exactly, and a redrive
after the target recovers delivers each dead letter once more under its original key (issue 17
items 1 and 2; decisions 0147, 0148).

Real processes: ``fireledger serve`` on SQLite, a real HTTP receiver on loopback whose path answers
``503`` until the scenario makes it recover (``200``) after ``outage_s`` (30 s; the quick form as soon
as the dead-lettered policies have ended — decision 0223: the outage's length is not what is checked).
One one-shot trigger per policy, all due at the same instant, all to that target:

* ``fixed``    — ``max_attempts`` 3, backoff 1 s to 1 s: dead-lettered, "retries exhausted after 3";
* ``doubling`` — ``max_attempts`` 5 (quick) / 6, backoff 1 s doubling to 4 s / 8 s: dead-lettered
  after its attempts, every wait twice the one before until the cap;
* ``patient``  — ``max_attempts`` 185, backoff 1 s doubling to 2 s / 4 s: still retrying when the
  target recovers, then delivered.

Checked per fire, from the ledger (µs) and from what the receiver saw: the number of attempts; every
wait between the end of attempt *n* and the start of attempt *n+1* within the policy's step for *n*
— never shorter than half of ``min(max_backoff, min_backoff·2^(n−1))`` (equal jitter), never longer
than the step plus the dispatch latency allowance; the ending (state and the exact cause) and that
a dead-lettered fire ended before the recovery; the receiver saw exactly the attempts the ledger
records, each with its attempt number. Then ``POST /v1/fires/{key}/redrive`` for each dead letter:
the receiver gets exactly one more request per key, attempt *N+1* under the same key, answered 200;
the fire is ``delivered``, no other fire exists for its trigger, and the dead-letter list is empty.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATH = "/flaky"
#: How much later than its backoff step an attempt may start: the claim loop's idle poll, the
#: settlement batch and a loaded 2-core machine (the lower bound has no allowance: never early).
LATENCY_S = 1.5


@dataclass(frozen=True)
class Policy:
    name: str
    max_attempts: int
    min_backoff_s: int
    max_backoff_s: int
    ends: str   # "dead-letter" or "delivered"

    def body(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "min_backoff": f"{self.min_backoff_s}s",
                "max_backoff": f"{self.max_backoff_s}s"}

    def step_s(self, n: int) -> float:
        """The backoff step after failed attempt ``n`` (1-based): the wait is in [step/2, step]."""
        return float(min(self.max_backoff_s, self.min_backoff_s * 2 ** (n - 1)))


def policies(quick: bool) -> list[Policy]:
    return [Policy("fixed", 3, 1, 1, "dead-letter"),
            Policy("doubling", 5 if quick else 6, 1, 4 if quick else 8, "dead-letter"),
            Policy("patient", 185, 1, 2 if quick else 4, "delivered")]


def _attempts(db: str, key: str) -> list[tuple[int, int, int | None, int | None]]:
    """(number, started_us, finished_us, http_status) of the fire's attempts, from the ledger."""
    from fireledger.domain.keys import FireKey
    from fireledger.store import Store

    store = Store.open(db)
    try:
        fire = store.history.get_fire(FireKey.parse(key))
    finally:
        store.close()
    assert fire is not None
    return [(a.number, a.started_us, a.finished_us, a.http_status) for a in fire.attempt_list]


def check_waits(p: Policy, rows: list[tuple[int, int, int | None, int | None]]) -> list[str]:
    """Each wait between two attempts of one fire within the policy's step (see the module docstring)."""
    bad = []
    for (n, _, finished, _), (m, started, _, _) in itertools.pairwise(rows):
        if finished is None:
            bad.append(f"{p.name}: attempt {n} has no finish")
            continue
        wait = (started - finished) / 1e6
        step = p.step_s(n)
        if m != n + 1 or not step / 2 - 0.001 <= wait <= step + LATENCY_S:
            bad.append(f"{p.name}: attempt {m} started {wait:.3f}s after attempt {n} (step {step:g}s: "
                       f"allowed {step / 2:g}..{step + LATENCY_S:g}s)")
    return bad


def retry_policy(outage_s: float | None, quick: bool) -> dict[str, Any]:
    """The scenario (module docstring); ``outage_s`` None: the target recovers once every fire of a
    dead-lettering policy has ended (the patient policy is then still retrying)."""
    from e2e import Api, Service, new_tenant, verify_target, wait_until
    from fireledger.clock.system import SystemClock
    from sink import Behaviour, SinkServer

    work = Path(tempfile.mkdtemp(prefix="dispatch-retry-policy-"))
    db = f"sqlite:///{work}/fl.db"
    sink = SinkServer(behaviours={PATH: Behaviour(status=503)})
    sink.start_in_thread()
    svc = Service(db, work).start(timeout_s=60)
    failures: list[str] = []
    out: dict[str, Any] = {"outage_s": outage_s}
    try:
        _, token = new_tenant(db, "retry-policy")
        api = Api(svc.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{PATH}"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(time.time()) + 3))
        pols = policies(quick)
        trig = {p.name: api.ok("POST", "/v1/triggers", {"name": p.name, "schedule": {"at": at}, "jitter": "0s",
                                                         "target_id": target["id"], "retry": p.body()}, 201)
                for p in pols}
        for p in pols:
            shown = trig[p.name]["retry"]
            if (shown["max_attempts"], shown["min_backoff"], shown["max_backoff"]) != (
                    p.max_attempts, f"{p.min_backoff_s}s", f"{p.max_backoff_s}s"):
                failures.append(f"{p.name}: the trigger shows retry {shown}")
        wait_until(lambda: any(r["path"] == PATH for r in sink.records()), 30, "the first attempt")
        started = time.time()
        dead = [p for p in pols if p.ends == "dead-letter"]

        def ended(p: Policy) -> dict[str, Any] | None:
            items = api.ok("GET", f"/v1/triggers/{trig[p.name]['id']}/fires")["items"]
            return items[0] if items and items[0]["state"] in ("failed", "unknown") else None

        fires = {p.name: wait_until(lambda p=p: ended(p), (outage_s or 30.0) + 10, f"{p.name} to be dead-lettered")
                 for p in dead}
        if outage_s is not None:
            wait_until(lambda: time.time() >= started + outage_s, outage_s + 5, "the outage", interval_s=0.2)
        sink.set_behaviour(PATH, Behaviour(status=200))
        recovered = time.time()
        # The ledger stamps an attempt's end with the latest bound of the service's clock interval
        # (never early; the service runs with the default declared bound, as SystemClock() here):
        # compare it with the same bound read now, not with the bare wall clock, or an
        # attempt settled a few ms before the recovery would look as if it ended after it.
        recovered_latest = SystemClock().now().latest_us / 1e6
        out["recovered_after_s"] = round(recovered - started, 2)

        def delivered(name: str) -> dict[str, Any] | None:
            items = api.ok("GET", f"/v1/triggers/{trig[name]['id']}/fires")["items"]
            return items[0] if items and items[0]["state"] == "delivered" else None

        for p in pols:
            if p.ends == "delivered":
                fires[p.name] = wait_until(lambda p=p: delivered(p.name), p.max_backoff_s + 30,
                                           f"{p.name} to be delivered after the recovery")
        failures += _check_endings(db, pols, fires, recovered, recovered_latest, sink, out)
        failures += _redrive(api, db, dead, fires, trig, sink, out, wait_until)
    finally:
        svc.stop()
        sink.stop()
    out["failures"] = failures
    out["passed"] = not failures
    return out


def _sink_attempts(sink: Any, key: str) -> list[tuple[int, int | None]]:
    return [(r["attempt"], r["status"]) for r in sink.records() if r["fire_key"] == key]


def _check_endings(db: str, pols: list[Policy], fires: dict[str, dict[str, Any]], recovered: float,
                   recovered_latest: float, sink: Any, out: dict[str, Any]) -> list[str]:
    bad: list[str] = []
    for p in pols:
        f = fires[p.name]
        rows = _attempts(db, f["key"])
        statuses = [r[3] for r in rows]
        out[f"{p.name}_attempts"] = len(rows)
        out[f"{p.name}_waits_s"] = [round((b[1] - (a[2] or 0)) / 1e6, 3) for a, b in itertools.pairwise(rows)]
        bad += check_waits(p, rows)
        if p.ends == "dead-letter":
            want = f"failed: retries exhausted after {p.max_attempts} attempts (last: HTTP 503)"
            if (f["state"], f["cause"], len(rows)) != ("failed", want, p.max_attempts):
                bad.append(f"{p.name}: ended {f['state']} ({f['cause']!r}) after {len(rows)} attempts; "
                           f"the policy says failed ({want!r})")
            if statuses != [503] * p.max_attempts:
                bad.append(f"{p.name}: attempt statuses {statuses}")
            last = rows[-1][2] if rows else None
            if last is None or last / 1e6 > recovered_latest:
                bad.append(f"{p.name}: its last attempt did not end before the target recovered (ended "
                           f"{None if last is None else last / 1e6:.6f}, recovered by {recovered_latest:.6f})")
        else:
            if f["state"] != "delivered" or statuses[-1:] != [200] or set(statuses[:-1]) != {503}:
                bad.append(f"{p.name}: ended {f['state']} with statuses {statuses}")
            late = rows[-1][1] / 1e6 - recovered if rows else None
            out[f"{p.name}_delivered_after_recovery_s"] = None if late is None else round(late, 3)
            if late is None or late > p.max_backoff_s + LATENCY_S:
                bad.append(f"{p.name}: delivered {late}s after the recovery (cap {p.max_backoff_s}s)")
        seen = _sink_attempts(sink, f["key"])
        if seen != [(r[0], r[3]) for r in rows]:
            bad.append(f"{p.name}: the receiver saw {seen}, the ledger records {[(r[0], r[3]) for r in rows]}")
    return bad


def _redrive(api: Any, db: str, dead: list[Policy], fires: dict[str, dict[str, Any]], trig: dict[str, Any],
             sink: Any, out: dict[str, Any], wait_until: Callable[..., Any]) -> list[str]:
    bad: list[str] = []
    for p in dead:
        key = fires[p.name]["key"]
        listed = [d["key"] for d in api.ok("GET", f"/v1/dead-letters?trigger_id={trig[p.name]['id']}")["items"]]
        if listed != [key]:
            bad.append(f"{p.name}: the dead-letter list shows {listed}")
        got = api.ok("POST", f"/v1/fires/{key}/redrive", None, 200)
        if got["key"] != key:
            bad.append(f"{p.name}: the redrive answered another key {got['key']}")
    for p in dead:
        key = fires[p.name]["key"]
        done = wait_until(lambda key=key: (f := api.ok("GET", f"/v1/fires/{key}"))["state"] == "delivered" and f,
                          30, f"{p.name}'s redrive to be delivered")
        seen = _sink_attempts(sink, key)
        out[f"{p.name}_after_redrive"] = seen[p.max_attempts:]
        if seen[p.max_attempts:] != [(p.max_attempts + 1, 200)] or len(done["attempts"]) != p.max_attempts + 1:
            bad.append(f"{p.name}: after the redrive the receiver saw {seen[p.max_attempts:]}")
        history = [f["key"] for f in api.ok("GET", f"/v1/triggers/{trig[p.name]['id']}/fires")["items"]]
        if history != [key]:
            bad.append(f"{p.name}: the trigger's history holds {history}, not the one fire")
        if done["redriven_at"] is None:
            bad.append(f"{p.name}: the history does not show the redrive")
    if api.ok("GET", "/v1/dead-letters")["items"]:
        bad.append("dead letters remain after every redrive was delivered")
    return bad


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "dispatch-retry-policy", lambda: retry_policy(None if quick else 30.0, quick)
