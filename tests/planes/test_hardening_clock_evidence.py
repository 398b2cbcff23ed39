"""Hardening (issue 13, "also") — class: claims the product makes about its evidence must be true.

* Invariant 18, "the ledger explains a fire alone": every fire records the clock bound ε in force when
  it was decided and who vouched for it (``eps_us`` / ``eps_source`` on the fire row), shown in the
  history API (``eps_s``, ``eps_source``), in ``fireledger why`` and in the console. The start-up log
  has long said "Every fire records this source"; before migration 0007 no fire did.
* ``fireledger status`` on an embedded ``serve`` shows the running node with its ε and source (it
  said "nodes: none registered").

Real SQLite and PostgreSQL, fake clocks for the decision, real processes for the CLI and ``serve``.
"""

from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient

from e2e import Service, cli, wait_until
from fireledger.clock import CrossCheckedClock, FakeClock
from fireledger.control import create_app
from fireledger.control.auth import create_tenant
from fireledger.domain.keys import FireKey
from fireledger.timing import TimingLoop
from storekit import T0, add_target, add_trigger, open_store

MS = 1_000
EPS_US = 7_500          # ε = 7.5 ms, declared


def db_url(store) -> str:
    return store.engine.url if store.engine_name == "postgres" else f"sqlite:///{store.engine.path}"


def test_a_fire_records_the_clock_bound_it_was_decided_under(store):
    tenant_id, token = create_tenant(store, "evidence", T0)
    tenant = store.registry.get_tenant(tenant_id)
    trig, _, first = add_trigger(store, tenant, add_target(store, tenant), {"every": "60s"})
    clock = FakeClock(first + EPS_US, eps_us=EPS_US, source="declared")
    res = TimingLoop(store, clock, "node-a").tick()
    assert [f.scheduled_us for f in res.inserted] == [first]
    key = FireKey(tenant_id, trig.id, first, 0)

    stored = store.history.get_fire(key)
    assert (stored.eps_us, stored.eps_source) == (EPS_US, "declared")

    # The history API and the single-fire view, and their schema.
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(store, clock)) as http:
        item = http.get(f"/v1/triggers/{trig.id}/fires", headers=auth).json()["items"][0]
        assert (item["eps_s"], item["eps_source"]) == (EPS_US / 1e6, "declared")
        across = http.get("/v1/fires", headers=auth).json()["items"][0]
        assert (across["eps_s"], across["eps_source"]) == (EPS_US / 1e6, "declared")
        one = http.get(f"/v1/fires/{key}", headers=auth).json()
        assert (one["eps_s"], one["eps_source"]) == (EPS_US / 1e6, "declared")
        schemas = http.get("/openapi.json").json()["components"]["schemas"]
        assert {"eps_s", "eps_source"} <= set(schemas["HistoryFire"]["properties"])
        _console_sign_in(http, token)
        page = http.get(f"/console/fires/{key}")
        assert page.status_code == 200 and "ε = 7.5 ms (declared)" in page.text

    # `fireledger why`, a real process reading the ledger alone.
    out = json.loads(cli("why", str(key), "--db", db_url(store), "--json").stdout)
    assert (out["fire"]["eps_s"], out["fire"]["eps_source"]) == (EPS_US / 1e6, "declared")
    assert any("clock bound ε = 7.5 ms (declared)" in line["text"] for line in out["story"]), out["story"]
    text = cli("why", str(key), "--db", db_url(store)).stdout
    assert "7.5 ms (declared)" in " ".join(text.split())


def _console_sign_in(http: TestClient, token: str) -> None:
    """Sign in to the console the way a browser does (the client keeps the session cookie)."""
    page = http.get("/console/login")
    form = {"token": token}
    if 'name="csrf"' in page.text:   # a CSRF field, when the console has one
        form["csrf"] = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    r = http.post("/console/login", data=form, follow_redirects=False)
    assert r.status_code in (302, 303), r.text


def test_a_fire_decided_under_a_postgres_cross_checked_clock_records_that_source(pg_server, tmp_path):
    store = open_store("postgres", tmp_path, pg_server)
    try:
        real = time.time_ns() // 1000
        tenant_id, _ = create_tenant(store, "evidence", real)
        tenant = store.registry.get_tenant(tenant_id)
        add_trigger(store, tenant, add_target(store, tenant, now_us=real), {"every": "10s"}, now_us=real - 15_000 * MS)
        clock = CrossCheckedClock(FakeClock(real, eps_us=5 * MS, source="declared"), store.server_time_us)
        res = TimingLoop(store, clock, "node-pg").tick()
        assert res.shed is None and res.inserted
        for f in res.inserted:
            stored = store.history.get_fire(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
            assert stored.eps_source == "declared+postgres"
            assert stored.eps_us == res.eps_us >= 5 * MS     # the bound of the reading it was decided under
    finally:
        store.close()


def test_status_shows_the_node_of_an_embedded_serve(tmp_path):
    db = f"sqlite:///{tmp_path}/serve.db"
    svc = Service(db, tmp_path, env={"FIRELEDGER_DECLARED_EPS_MS": "5"}).start()
    try:
        def running():
            out = json.loads(cli("status", "--db", db, "--json").stdout)
            return [n for n in out["nodes"] if n["heartbeat_age_s"] < 5] or None

        nodes = wait_until(running, 30, "the serve's node in `fireledger status`")
        assert len(nodes) == 1
        node = nodes[0]
        assert node["eps_source"] in ("kernel", "declared") and node["eps_s"] is not None and node["eps_s"] > 0
        assert node["id"].startswith("timing-")
        table = cli("status", "--db", db).stdout
        assert "none registered" not in table and node["id"][:12] in table
        # Kept fresh: the heartbeat instant moves on while the serve runs.
        first_beat = _heartbeat_us(db, node["id"])
        wait_until(lambda: _heartbeat_us(db, node["id"]) > first_beat, 10, "a fresh heartbeat")
    finally:
        svc.stop()
    # A clean stop marks the session stopped: no running node is listed any more.
    assert json.loads(cli("status", "--db", db, "--json").stdout)["nodes"] == []


def _heartbeat_us(db: str, node_id: str) -> int:
    from fireledger.store import Store

    store = Store.open(db)
    try:
        return next(n.heartbeat_us for n in store.history.node_rows() if n.id == node_id)
    finally:
        store.close()
