"""Acceptance on real processes (issue 18 item 7; decisions 0165, 0166): an outage of the timing
plane (kill -9) pages; after it, the catch-up drain keeps the catch-up lane's due age high while the
page stays quiet; an on-time backlog (the dispatch plane killed) pages; a declared drain suppresses
the page until it is stopped or expires by itself.

Real ``fireledger control``, ``timing`` and ``dispatch`` processes on one SQLite file, a real HTTP
sink, the real CLI. The shipped page fires at 60 s; the test evaluates the same rule at 5 s
(``drain status --page-threshold-s``), with a 2 s miss threshold so an outage of seconds produces
catch-up fires, and the catch-up lane capped at one fire per 5 s so its drain outlasts the test.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import Api, Service, cli, new_tenant, verify_target, wait_until
from sink import SinkServer

THRESHOLD_S = 5.0


def metric(base: str, name: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)}


def status(db: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cli("drain", "status", "--db", db, "--json",
                                         "--page-threshold-s", str(THRESHOLD_S)).stdout)
    return out


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


@pytest.mark.e2e
def test_catch_up_after_an_outage_does_not_page_an_on_time_backlog_does_and_a_drain_suppresses_it(
        tmp_path: Path, sink: SinkServer) -> None:
    db = f"sqlite:///{tmp_path}/lanes.db"
    cli("db", "upgrade", "--db", db)
    timing_env = {"FIRELEDGER_MISS_THRESHOLD_S": "2"}
    control = Service(db, tmp_path, command="control").start()
    dispatch = Service(db, tmp_path, command="dispatch", env={"FIRELEDGER_LANE_CATCH_UP": "rate=0.2"}).start()
    timing = Service(db, tmp_path, command="timing", env=timing_env).start()
    services = [control, dispatch, timing]
    try:
        tenant_id, token = new_tenant(db)
        api = Api(control.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        for i in range(4):
            api.ok("POST", "/v1/triggers", {"name": f"t{i}", "schedule": {"every": "1s"}, "target_id": target["id"],
                                            "missed_fire_policy": "fire-all", "catchup_horizon": "1h"}, 201)
        wait_until(lambda: len(sink.records()) >= 8, 60, "on-time deliveries")
        assert status(db)["page"]["firing"] is False

        # 1. An outage: the timing plane is killed. Undecided instants age: that pages.
        timing.kill9()
        wait_until(lambda: status(db)["page"]["firing"], 60, "the outage to page", interval_s=0.5)
        assert status(db)["undecided_due_age_s"] > THRESHOLD_S

        # 2. The timing plane is back: the missed instants go to the catch-up lane, drained at
        # 0.2/s. Its due age climbs past the threshold while the page stays quiet.
        timing = Service(db, tmp_path, command="timing", env=timing_env).start()
        services.append(timing)
        def draining_quietly() -> bool:
            s = status(db)
            return s["lane_due_age_s"]["catch-up"] > THRESHOLD_S and s["page"]["firing"] is False

        wait_until(draining_quietly, 90, "a catch-up drain with a quiet page", interval_s=0.5)
        seen: list[dict[str, Any]] = []

        def quiet_while_draining() -> bool:
            s = status(db)
            seen.append(s)
            assert s["page"]["firing"] is False, s
            assert s["lane_due_age_s"]["catch-up"] > THRESHOLD_S, s
            return len(seen) >= 5

        wait_until(quiet_while_draining, 60, "five readings during the drain", interval_s=0.5)
        lanes = metric(control.base, "fireledger_lane_due_age_seconds")
        assert lanes['{lane="catch-up"}'] > THRESHOLD_S
        assert metric(control.base, "fireledger_page_due_age_seconds")[""] < THRESHOLD_S
        assert metric(control.base, "fireledger_lane_depth")['{lane="catch-up",state="pending"}'] > 0

        # 3. An on-time backlog: the dispatch plane is killed while instants keep being decided.
        dispatch.kill9()
        wait_until(lambda: status(db)["page"]["firing"], 60, "the on-time backlog to page", interval_s=0.5)
        assert status(db)["lane_due_age_s"]["on-time"] > THRESHOLD_S

        # 4. A declared drain suppresses the page (and shows in the metrics); stopping it ends that.
        start = json.loads(cli("drain", "start", "--for", "10m", "--reason", "e2e: restore dispatch",
                               "--db", db, "--json").stdout)
        assert start["in_force"] is True
        s = status(db)
        assert s["page"]["over_threshold"] and s["page"]["firing"] is False and s["page"]["suppressed_by_drain"]
        # /metrics reuses its store reading for 1 s (STORE_METRICS_TTL_S): poll, with a deadline.
        wait_until(lambda: metric(control.base, "fireledger_drain_declared") == {"": 1.0}, 10, "the drain metric")
        cli("drain", "stop", "--db", db)
        assert status(db)["page"]["firing"] is True
        wait_until(lambda: metric(control.base, "fireledger_drain_declared") == {"": 0.0}, 10, "the drain to end")
        # A drain ends by itself at its expiry.
        cli("drain", "start", "--for", "2s", "--reason", "e2e: expiry", "--db", db)
        wait_until(lambda: status(db)["page"]["firing"], 30, "the drain to expire", interval_s=0.5)
        assert status(db)["drain"]["in_force"] is False
        audit = [json.loads(line) for line in cli("audit", "export", "--db", db).stdout.splitlines()]
        assert [a["action"] for a in audit if a["action"].startswith("drain.")] == \
            ["drain.start", "drain.stop", "drain.start"]

        # 5. The duplicate-delivery rate: the API, the CLI and the metric read the same ledger (the
        # dispatch plane is dead, so the counts hold still). Nothing here delivered a key twice.
        via_api = api.ok("GET", "/v1/reports/delivery")                              # the last hour
        keys = ("delivered_fires", "duplicate_attempts", "possible_duplicate_attempts")
        for args in (("--tenant", tenant_id), ()):                                     # one tenant, every tenant
            via_cli = json.loads(cli("report", "delivery", "--db", db, "--json", *args).stdout)
            assert [via_cli[k] for k in keys] == [via_api[k] for k in keys]
        empty = json.loads(cli("report", "delivery", "--db", db, "--json", "--from", "2000-01-01T00:00:00Z",
                               "--to", "2000-01-07T00:00:00Z").stdout)
        assert empty["delivered_fires"] == 0 and empty["duplicates_per_million"] is None
        received = [r["fire_key_header"] for r in sink.records()]
        # Every fire the ledger calls delivered reached the sink (a killed runner's last 2xx may not
        # have been recorded: the ledger never claims more than the receiver saw).
        assert 8 <= via_api["delivered_fires"] <= len(set(received))
        # The sink saw no key twice, and the ledger proves none.
        assert len(received) == len(set(received))
        assert via_api["duplicate_attempts"] == 0 and via_api["duplicates_per_million"] == 0
    finally:
        for svc in services:
            svc.stop()
