"""End to end on a real ``fireledger serve`` process and a real local HTTP receiver (decisions
0155-0157): a trigger with two specs that share every even second delivers each instant once, its
shared instants' fires naming both specs; a trigger whose exclusion calendar covers these days has
every instant recorded ``skipped`` with the calendar entry as its cause — in the history and in
``fireledger why`` — and the receiver never sees one of them."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from e2e import Service, cli, wait_until
from sink import SinkServer
from test_e2e_serve import fires_of, setup_tenant

pytestmark = pytest.mark.e2e


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def test_two_specs_fire_once_and_excluded_instants_are_skipped_not_delivered(e2e_db, sink, tmp_path):
    db = e2e_db   # [postgres] is a long form (decision 0203)
    svc = Service(db, tmp_path).start()
    try:
        api, target_id = setup_tenant(svc.base, db, sink)
        today = datetime.now(UTC).date()
        days = {"from": (today - timedelta(days=1)).isoformat(), "to": (today + timedelta(days=1)).isoformat(),
                "zone": "UTC", "label": "freeze"}
        api.ok("POST", "/v1/calendars", {"name": "freeze", "entries": [days]}, 201)
        both = api.ok("POST", "/v1/triggers", {
            "name": "both", "target_id": target_id, "payload": {"n": 1},
            "schedule": {"specs": [{"cron": "* * * * * *"}, {"every": "2s", "anchor": "2026-01-01T00:00:00Z"}]},
        }, 201)["id"]
        off = api.ok("POST", "/v1/triggers", {"name": "off", "target_id": target_id, "payload": {"n": 2},
                                              "schedule": {"every": "1s", "calendars": ["freeze"]}}, 201)["id"]

        def enough():
            got = Counter(r["trigger_id"] for r in sink.records())
            skipped = [f for f in fires_of(api, off) if f["state"] == "skipped"]
            return got[both] >= 6 and len(skipped) >= 4

        wait_until(enough, 40, "deliveries of the two-spec trigger and skipped fires of the excluded one")
        status, refused = api.call("DELETE", "/v1/calendars/freeze")
        assert status == 409 and off in refused["detail"]
        api.ok("POST", f"/v1/triggers/{off}/pause", None)
        api.ok("POST", f"/v1/triggers/{both}/pause", None)
        records = sink.records()
        # The receiver never saw an excluded instant.
        assert not [r for r in records if r["trigger_id"] == off]
        # Each instant of the union was delivered once (the shared even seconds included).
        delivered = [r["scheduled_instant"] for r in records if r["trigger_id"] == both]
        assert len(delivered) == len(set(delivered)) >= 6
        history = {f["scheduled_instant"]: f for f in fires_of(api, both)}
        shared = [f for f in history.values() if int(f["scheduled_instant"][17:19]) % 2 == 0]
        odd = [f for f in history.values() if int(f["scheduled_instant"][17:19]) % 2 == 1]
        assert shared and odd
        assert all(f["specs"] == [0, 1] for f in shared) and all(f["specs"] == [0] for f in odd)
        assert {r["scheduled_instant"] for r in records if r["trigger_id"] == both} <= set(history)
        for f in fires_of(api, off):
            assert f["state"] == "skipped" and f["dispatched_at"] is None and f["attempts"] == []
            assert f["cause"].startswith("skipped: excluded by calendar 'freeze' entry 0 (")
            assert "'freeze')" in f["cause"]
        key = fires_of(api, off)[0]["key"]
    finally:
        svc.stop()
    why = json.loads(cli("why", key, "--db", db, "--json").stdout)
    assert why["fire"]["state"] == "skipped"
    texts = " ".join(line["text"] for line in why["story"])
    assert "not dispatched: skipped: excluded by calendar 'freeze'" in texts
    assert "An exclusion calendar the trigger names" in texts
