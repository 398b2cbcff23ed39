"""``policy-overlap-unknown-window``: a target that holds every request open and never calls back
must not stop an overlap-guarded trigger for longer than one outcome window (seed ADR-12,
DESIGN.md invariant 9, decision 0060).

Real processes: ``fireledger serve`` on SQLite, a real HTTP sink whose ``/hang`` route never
answers, a tenant made as ``fireledger tenant create`` makes it, target and triggers through the
API. Two triggers fire every 2 s with a 1 s attempt timeout and a 4 s outcome window, one with
overlap policy ``skip`` and one with ``queue``. Every dispatched fire times out, so each ends
``unknown`` and no outcome is ever reported.

Passing means, for each trigger and each cycle observed (one in the quick form, three in the full):
the dispatched fire ends ``unknown`` (every attempt ``unknown``, none ``failed``); every instant
decided before its window ended was withheld — ``skipped`` with the overlap cause (``skip``), or
``held`` and then superseded or released (``queue``) — and never dispatched; the next fire that is
dispatched carries the recorded decision ("… had no outcome by the end of its window …; counted as
finished"), is an instant no later than one interval after the previous fire's window end, and was
first dispatched no later than window + one interval (+1 s of scheduling slack) after the previous
one.

Treat ``unknown`` as still running (the rejected option of ADR-12) and the trigger never fires
again: the scenario fails on the missing next dispatch. Drop the window check and fires go out while
the previous is running: it fails on a dispatched fire inside the window.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

INTERVAL_S = 2.0
WINDOW_S = 4.0
TIMEOUT_S = 1.0
SLACK_S = 1.0   # scheduling noise on a loaded 2-core machine (the instant itself is checked exactly)


def _ts(text: str) -> float:
    from fireledger.recurrence import parse_instant

    return parse_instant(text).timestamp()


def _cycles(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dispatched fires (in order) with the withheld fires between each and the next."""
    out: list[dict[str, Any]] = []
    for f in items:
        if f["dispatched_at"] is not None:
            out.append({"fire": f, "withheld": []})
        elif out:
            out[-1]["withheld"].append(f)
    return out


def _check(policy: str, items: list[dict[str, Any]], cycles: int, failures: list[str]) -> dict[str, Any]:
    seen = _cycles(items)
    fig: dict[str, Any] = {}
    unknown_at, after_s, withheld_n, superseded_n = [], [], 0, 0
    for i in range(cycles):
        prev, nxt = seen[i], seen[i + 1]
        p = prev["fire"]
        if p["state"] != "unknown":
            failures.append(f"{policy}: fire {p['key']} ended {p['state']}, not unknown")
            continue
        results = {a["result"] for a in p["attempts"]}
        if results != {"unknown"}:
            failures.append(f"{policy}: attempts of {p['key']} ended {sorted(results)}")
        unknown_at.append(round(_ts(p["finished_at"]) - _ts(p["scheduled_instant"]), 3))
        end = _ts(p["dispatched_at"]) + WINDOW_S
        for w in prev["withheld"]:
            withheld_n += 1
            cause = w["cause"] or ""
            if w["state"] == "skipped" and cause.startswith("superseded: overlap policy queue"):
                superseded_n += 1
            elif not (w["state"] == "skipped" and cause.startswith(
                    f"skipped: overlap policy skip; previous fire {p['key']} still running")) and w["state"] != "held":
                failures.append(f"{policy}: {w['key']} withheld as {w['state']} with cause {cause!r}")
            if _ts(w["decided_at"]) >= end and policy == "skip":
                failures.append(f"{policy}: {w['key']} was decided after the window end and still skipped")
        n = nxt["fire"]
        cause = n["cause"] or ""
        if f"previous fire {p['key']} had no outcome by the end of its window" not in cause \
                or "counted as finished" not in cause:
            failures.append(f"{policy}: the overlap decision is not recorded on {n['key']}: {cause!r}")
        gap = _ts(n["dispatched_at"]) - _ts(p["dispatched_at"])
        after_s.append(round(gap, 3))
        if gap < WINDOW_S:
            failures.append(f"{policy}: {n['key']} dispatched {gap:.3f} s after {p['key']}, inside its window")
        if _ts(n["scheduled_instant"]) > end + INTERVAL_S + 1e-6:
            failures.append(f"{policy}: {n['key']} is scheduled more than one interval after the window end")
        if gap > WINDOW_S + INTERVAL_S + SLACK_S:
            failures.append(f"{policy}: {n['key']} dispatched {gap:.3f} s after {p['key']}: later than "
                            f"window + interval")
    fig["unknown_at"] = unknown_at
    fig["next_dispatched_after_s"] = after_s
    fig["skipped_count" if policy == "skip" else "withheld_count"] = withheld_n
    if policy == "queue":
        fig["superseded_count"] = superseded_n
    return fig


def unknown_window(cycles: int) -> dict[str, Any]:
    from e2e import Api, Service, new_tenant, verify_target, wait_until
    from sink import SinkServer

    work = Path(tempfile.mkdtemp(prefix="policy-overlap-"))
    db = f"sqlite:///{work}/fl.db"
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(db, work).start()
    failures: list[str] = []
    out: dict[str, Any] = {"interval_s": INTERVAL_S, "window_s": WINDOW_S, "timeout_s": TIMEOUT_S,
                           "cycles": cycles}
    try:
        _, token = new_tenant(db)
        api = Api(svc.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hang"}, 201)
        sink.add_secret(tg["secret"])
        verify_target(api, sink, tg)
        ids = {policy: api.ok("POST", "/v1/triggers", {
            "name": f"overlap-{policy}", "schedule": {"every": f"{INTERVAL_S:g}s"}, "target_id": tg["id"],
            "overlap_policy": policy, "outcome_window": f"{WINDOW_S:g}s", "timeout": f"{TIMEOUT_S:g}s",
            "jitter": "0s"}, 201)["id"] for policy in ("skip", "queue")}

        def items(tid: str) -> list[dict[str, Any]]:
            return list(api.ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"])

        def done() -> bool:
            # ``cycles`` dispatched fires settled, and the one after them dispatched.
            for tid in ids.values():
                seen = _cycles(items(tid))
                if len(seen) < cycles + 1 or any(c["fire"]["state"] in ("pending", "dispatching")
                                                 for c in seen[:cycles]):
                    return False
            return True

        budget = cycles * (WINDOW_S + INTERVAL_S + 2) + 10
        started = time.monotonic()
        try:
            wait_until(done, budget, "the overlap cycles", interval_s=0.2)
        except TimeoutError:
            failures.append(f"the next dispatch never came within {budget:g} s (a trigger stopped?)")
        out["observed_s"] = round(time.monotonic() - started, 1)
        for policy, tid in ids.items():
            got = items(tid)
            out[policy] = {"fires": len(got), "states": _states(got)}
            if len(_cycles(got)) >= cycles + 1:
                out[policy].update(_check(policy, got, cycles, failures))
        if sum(r["path"] == "/hang" for r in sink.records()) == 0:
            failures.append("nothing was dispatched to the silent target")
    finally:
        svc.stop()
        sink.stop()
    out["failures"] = failures
    out["passed"] = not failures
    return out


def _states(items: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in items:
        out[f["state"]] = out.get(f["state"], 0) + 1
    return out


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "policy-overlap-unknown-window", lambda: unknown_window(1 if quick else 3)
