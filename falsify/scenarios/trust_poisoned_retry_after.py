"""``trust-poisoned-retry-after``: one tenant's target answering ``503`` with an absurd
``Retry-After`` must not stall anyone else's fires, and the process must still stop on SIGTERM
(issue 13, high #2; DESIGN.md invariants 15 and 17).

Real processes: ``fireledger serve`` on SQLite (``FIRELEDGER_STOP_TIMEOUT_S=5``), a real HTTP sink on
loopback, tenants as ``fireledger tenant create`` makes them, targets and triggers through the API.

* tenant ``poisoner`` — two one-shot triggers to targets answering ``503`` with
  ``Retry-After: 10000000000000`` (delta seconds) and ``Retry-After: Fri, 31 Dec 9999 23:59:59 GMT``;
* tenant ``bystander`` — 100 triggers every second to a target that answers at once.

Passing means, over the run after the poisoned answers: at least 99 % of the bystander's recorded
fires are delivered and their lateness (sink arrival − scheduled instant) has p99 ≤ 1 s; none of
its fires is left ``dispatching`` or ``pending``; the poisoned fires are recorded (``pending``, next
attempt within the one-hour cap); and the process exits within the stop bound after SIGTERM.

Before the fix the retry instant overflowed the store's 64-bit integer, the batch settlement raised
and was retried for ever: the bystander's fires stayed ``dispatching`` (2 delivered, 12 stuck 14 s
later in the review's run) and ``serve`` ignored SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fireledger.recurrence import parse_instant

STOP_S = 5
STOP_MARGIN_S = 3.0
POISONS = ("/retry-after/10000000000000", "/retry-after-date")   # delta seconds; HTTP-date (below)
FAR_DATE = "Fri, 31 Dec 9999 23:59:59 GMT"
CAP_S = 3600


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def poisoned_retry_after(run_s: float, n_bystander: int = 100) -> dict[str, Any]:
    from e2e import Api, Service, verify_target, wait_until
    from fireledger.control.auth import create_tenant
    from fireledger.store import Store
    from sink import Behaviour, SinkServer

    work = Path(tempfile.mkdtemp(prefix="trust-poisoned-"))
    db = f"sqlite:///{work}/fl.db"
    sink = SinkServer(behaviours={"/retry-after-date": Behaviour(status=503, headers=(("Retry-After", FAR_DATE),))})
    sink.start_in_thread()
    svc = Service(db, work, env={"FIRELEDGER_STOP_TIMEOUT_S": str(STOP_S)}).start()
    failures: list[str] = []
    out: dict[str, Any] = {"bystander_triggers": n_bystander}
    try:
        store = Store.open(db)
        try:
            now_us = int(time.time() * 1e6)
            poisoner_id, poisoner_token = create_tenant(store, f"poisoner-{time.monotonic_ns()}", now_us)
            bystander_id, bystander_token = create_tenant(store, f"bystander-{time.monotonic_ns()}", now_us)
        finally:
            store.close()
        poisoner = Api(svc.base, poisoner_token)
        bystander = Api(svc.base, bystander_token)
        ok = bystander.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(ok["secret"])
        verify_target(bystander, sink, ok)
        ids = [bystander.ok("POST", "/v1/triggers", {"name": f"b-{i}", "schedule": {"every": "1s"},
                                                      "target_id": ok["id"], "timeout": "5s", "jitter": "0s"},
                            201)["id"] for i in range(n_bystander)]
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2))
        poisoned_ids = []
        for i, path in enumerate(POISONS):
            tg = poisoner.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{path}"}, 201)
            sink.add_secret(tg["secret"])
            verify_target(poisoner, sink, tg)
            poisoned_ids.append(poisoner.ok("POST", "/v1/triggers", {"name": f"p-{i}", "schedule": {"at": at},
                                                                      "target_id": tg["id"]}, 201)["id"])
        wait_until(lambda: {r["path"] for r in sink.records()} >= set(POISONS),
                   20, "the poisoned answers")
        start = time.time()
        wait_until(lambda: time.time() >= start + run_s, run_s + 5, "the run", interval_s=0.2)
        end = time.time()
        wait_until(lambda: time.time() >= end + 2, 5, "the last fires of the run to settle", interval_s=0.2)

        mine = set(ids)
        late = [r["arrived_at"] - parse_instant(r["scheduled_instant"]).timestamp() for r in sink.records()
                if r["trigger_id"] in mine and start <= parse_instant(r["scheduled_instant"]).timestamp() <= end]
        recorded = delivered = stuck = 0
        for tid in ids:
            for f in bystander.ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]:
                sched = parse_instant(f["scheduled_instant"]).timestamp()
                if not start <= sched <= end:
                    continue
                recorded += 1
                delivered += f["state"] == "delivered"
                stuck += f["state"] in ("dispatching", "pending")
        expected = int(run_s) * n_bystander
        out["bystander_fires_recorded"] = recorded
        out["bystander_fires_expected_about"] = expected
        out["bystander_delivered_fraction"] = round(delivered / recorded, 4) if recorded else 0.0
        out["bystander_lateness_p50_s"] = round(_pct(late, 50), 4)
        out["bystander_lateness_p99_s"] = round(_pct(late, 99), 4)
        out["bystander_stuck_dispatching_or_pending"] = stuck
        if recorded < 0.9 * expected:
            failures.append(f"only {recorded} bystander fires recorded in the run (about {expected} due)")
        if not recorded or delivered / recorded < 0.99:
            failures.append(f"bystander delivered fraction {out['bystander_delivered_fraction']}")
        if not late or _pct(late, 99) > 1.0:
            failures.append(f"bystander lateness p99 {out['bystander_lateness_p99_s']} s")
        if stuck:
            failures.append(f"{stuck} bystander fires left dispatching/pending")

        store = Store.open(db)
        try:
            waits = []
            for tid in poisoned_ids:
                for f in store.history.list_fires(poisoner_id, tid):
                    if f.state != "pending" or f.next_attempt_us is None or not f.attempt_list:
                        failures.append(f"a poisoned fire was not recorded as a retry: state {f.state}")
                        continue
                    waits.append((f.next_attempt_us - (f.attempt_list[-1].finished_us or 0)) / 1e6)
        finally:
            store.close()
        out["poisoned_next_attempt_in_s"] = [round(w, 1) for w in waits]
        if len(waits) != len(POISONS) or any(w > CAP_S + 1 for w in waits):
            failures.append(f"poisoned retries not capped at {CAP_S} s: {waits}")

        assert svc.proc is not None
        sent = time.monotonic()
        os.killpg(svc.proc.pid, signal.SIGTERM)
        try:
            svc.proc.wait(timeout=STOP_S + STOP_MARGIN_S)
        except subprocess.TimeoutExpired:
            failures.append(f"serve still running {STOP_S + STOP_MARGIN_S:g} s after SIGTERM (bound {STOP_S} s)")
        out["stop_s"] = round(time.monotonic() - sent, 2)
        out["stop_bound_s"] = STOP_S
        out["exit_status"] = svc.proc.returncode
    finally:
        svc.stop()
        sink.stop()
    out["failures"] = failures
    out["passed"] = not failures
    return out


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "trust-poisoned-retry-after", lambda: poisoned_retry_after(5.0 if quick else 30.0)
