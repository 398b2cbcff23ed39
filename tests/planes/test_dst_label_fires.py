"""Issue 18 item 6: a fire whose instant came from a DST gap or fold says so, end to end in process.

The real timing loop (fake clock) decides cron fires in Europe/London across the 2027 transitions
(2027-03-28T01:00Z spring forward, 2027-10-31T01:00Z fall back): the gap instant carries
``gap 2027-03-28T01:30``, the fold's first pass ``fold 2027-10-31T01:30``, the days around them and
interval triggers nothing — on the on-time path and on the catch-up path (several instants in one
plan). The label is in the history API (and its schema), in ``fireledger why`` (a real process
reading the ledger) and on the console's fire page. Real SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient

from e2e import cli
from fireledger.clock import FakeClock
from fireledger.control import create_app
from fireledger.control.auth import create_tenant
from fireledger.domain.keys import FireKey, to_us
from fireledger.timing import TimingLoop
from storekit import add_target, add_trigger
from test_hardening_clock_evidence import _console_sign_in, db_url

MS = 1_000
H = 3_600_000_000


def _us(text: str) -> int:
    return to_us(datetime.fromisoformat(text.replace("Z", "+00:00")))


def test_gap_and_fold_fires_are_labelled(store: Any) -> None:
    created = _us("2027-03-27T12:00:00Z")
    tenant_id, token = create_tenant(store, "dst", created)
    tenant = store.registry.get_tenant(tenant_id)
    target = add_target(store, tenant)
    gap_trig, _, gap_first = add_trigger(store, tenant, target, {"cron": "30 1 * * *", "zone": "Europe/London"},
                                         now_us=created)
    every, _, _ = add_trigger(store, tenant, target, {"every": "1h"}, now_us=created)
    assert gap_first == _us("2027-03-28T01:00:00Z")
    loop = TimingLoop(store, FakeClock(gap_first + 5 * MS, eps_us=MS, source="declared"), "node-a")
    loop.tick()
    gap_key = FireKey(tenant_id, gap_trig.id, gap_first, 0)
    stored = store.history.get_fire(gap_key)
    assert stored is not None and stored.dst == "gap 2027-03-28T01:30"
    hourly = store.history.history_fires(tenant_id, trigger_id=every.id)
    assert hourly and all(f.dst is None for f in hourly)

    # The next day's 01:30 BST is an ordinary wall time.
    loop.clock = FakeClock(_us("2027-03-29T00:30:00Z") + 5 * MS, eps_us=MS, source="declared")
    loop.tick()
    nxt = store.history.get_fire(FireKey(tenant_id, gap_trig.id, _us("2027-03-29T00:30:00Z"), 0))
    assert nxt is not None and nxt.dst is None

    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(store, loop.clock)) as http:
        items = http.get(f"/v1/triggers/{gap_trig.id}/fires", headers=auth).json()["items"]
        by_instant = {i["scheduled_instant"]: i["dst"] for i in items}
        assert by_instant == {"2027-03-28T01:00:00Z": {"kind": "gap", "wall": "2027-03-28T01:30"},
                              "2027-03-29T00:30:00Z": None}
        one = http.get(f"/v1/fires/{gap_key}", headers=auth).json()
        assert one["dst"] == {"kind": "gap", "wall": "2027-03-28T01:30"}
        schemas = http.get("/openapi.json").json()["components"]["schemas"]
        assert "dst" in schemas["HistoryFire"]["properties"]
        assert set(schemas["DstLabel"]["properties"]) == {"kind", "wall"}
        _console_sign_in(http, token)
        page = http.get(f"/console/fires/{gap_key}")
        assert page.status_code == 200
        assert "DST gap: the wall time asked for, 2027-03-28T01:30 in Europe/London, does not exist" in page.text
        listing = http.get(f"/console/triggers/{gap_trig.id}")
        assert listing.status_code == 200 and "DST gap: 2027-03-28T01:30 asked" in listing.text

    out = json.loads(cli("why", str(gap_key), "--db", db_url(store), "--json").stdout)
    assert out["fire"]["dst"] == {"kind": "gap", "wall": "2027-03-28T01:30"}
    assert any(line["text"].startswith("DST gap: the wall time asked for, 2027-03-28T01:30 in Europe/London")
               for line in out["story"]), out["story"]


def test_a_catch_up_plan_labels_the_fold_among_its_instants(store: Any) -> None:
    created = _us("2027-10-29T12:00:00Z")
    tenant_id, _ = create_tenant(store, "dst-fold", created)
    tenant = store.registry.get_tenant(tenant_id)
    trig, _, first = add_trigger(store, tenant, add_target(store, tenant),
                                 {"cron": "30 1 * * *", "zone": "Europe/London"}, now_us=created)
    assert first == _us("2027-10-30T00:30:00Z")
    # Decided three days late, in one plan: 30 Oct (BST), 31 Oct (fold, first pass), 1 and 2 Nov (GMT).
    loop = TimingLoop(store, FakeClock(_us("2027-11-02T02:00:00Z"), eps_us=MS, source="declared"), "node-a")
    loop.tick()
    got = {f.scheduled_us: f.dst for f in store.history.history_fires(tenant_id, trigger_id=trig.id)}
    assert got == {_us("2027-10-30T00:30:00Z"): None, _us("2027-10-31T00:30:00Z"): "fold 2027-10-31T01:30",
                   _us("2027-11-01T01:30:00Z"): None, _us("2027-11-02T01:30:00Z"): None}
