"""Hardening (issue 13, finding 11) — class: one bad row must not stall the rows beside it.

A trigger whose stored version no longer compiles (a tzdata change, a corrupted row) used to abort
the timing loop's whole batch, retried every second forever: every healthy trigger of its partition
stopped firing. Now the bad row is set aside — its due instant recorded ``failed`` with a cause, the
trigger paused with a reason visible in the API — and the rest of the batch is committed in the
same cycle (decision 0087). Real SQLite and real PostgreSQL, a fake clock.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from fireledger.clock import FakeClock
from fireledger.control import create_app
from fireledger.control.auth import create_tenant
from fireledger.domain.keys import FireKey
from fireledger.domain.model import TriggerState
from fireledger.timing import TimingLoop
from storekit import T0, add_target, add_trigger

S = 1_000_000
MS = 1_000
HEALTHY = 8
#: Stored schedules that no longer compile: a zone gone from tzdata, a cron field out of range.
BROKEN = {
    "schedule.zone": '{"cron": "0 9 * * 1-5", "zone": "Europe/Atlantis"}',
    "schedule.minute": '{"cron": "61 * * * *", "zone": "UTC"}',
}


def corrupt(store, trigger_id: str, schedule_json: str) -> None:
    """Write a schedule straight into the stored version, as a bad migration or a tzdata change would."""
    sql = "UPDATE trigger_versions SET schedule = {p} WHERE trigger_id = {t}"
    with store.engine.write() as c:
        if store.engine_name == "sqlite":
            c.execute(sql.format(p=":s", t=":t"), {"s": schedule_json, "t": trigger_id})
        else:
            c.execute(sql.format(p="%(s)s", t="%(t)s"), {"s": schedule_json, "t": trigger_id})


def world(store):
    tenant_id, token = create_tenant(store, "isolation", T0)
    tenant = store.registry.get_tenant(tenant_id)
    target = add_target(store, tenant)
    healthy = [add_trigger(store, tenant, target, {"every": "60s"})[0] for _ in range(HEALTHY)]
    bad = {}
    first = None
    for kind, text in BROKEN.items():
        trig, _, first = add_trigger(store, tenant, target, {"every": "60s"})
        corrupt(store, trig.id, text)
        bad[kind] = trig
    return tenant, token, healthy, bad, first


def test_a_trigger_that_no_longer_compiles_is_failed_and_paused_and_the_rest_fire(store):
    tenant, _token, healthy, bad, first = world(store)
    clock = FakeClock(first + 10 * MS, eps_us=5 * MS)
    handed = []
    loop = TimingLoop(store, clock, "node-a", on_committed=handed.extend)

    res = loop.tick()

    # Every healthy trigger fired in this very cycle, handed to dispatch after the commit.
    assert sorted(f.trigger_id for f in res.inserted) == sorted(t.id for t in healthy)
    assert sorted(f.trigger_id for f in handed) == sorted(t.id for t in healthy)
    assert {f.trigger_id for f in res.failed} == {t.id for t in bad.values()}
    for kind, trig in bad.items():
        fire = store.history.get_fire(FireKey(tenant.id, trig.id, first, 0))
        assert fire is not None and fire.state == "failed", fire
        assert fire.cause.startswith("schedule no longer compiles: "), fire.cause
        assert kind in fire.cause                       # names the field that broke
        assert fire.eps_us == 5 * MS and fire.eps_source == clock.source
        t = store.registry.get_trigger(tenant.id, trig.id)
        assert t.state == TriggerState.PAUSED and t.next_us is None
        assert t.pause_reason is not None and fire.cause in t.pause_reason
    assert {r.trigger_id for r in store.timing.due_index()} == {t.id for t in healthy}

    # The next cycle does not retry the bad ones; the healthy ones keep firing.
    clock.advance(60 * S)
    res2 = loop.tick()
    assert sorted(f.trigger_id for f in res2.inserted) == sorted(t.id for t in healthy)
    assert res2.failed == []
    for trig in bad.values():
        assert [f.state for f in store.history.list_fires(tenant.id, trig.id)] == ["failed"]


def test_the_pause_reason_is_in_the_api_and_a_new_schedule_brings_the_trigger_back(store):
    tenant, token, _healthy, bad, first = world(store)
    clock = FakeClock(first + 10 * MS, eps_us=5 * MS)
    TimingLoop(store, clock, "node-a").tick()
    trig = bad["schedule.zone"]
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(store, clock)) as http:
        view = http.get(f"/v1/triggers/{trig.id}", headers=auth).json()
        assert view["state"] == "paused"
        assert view["pause_reason"].startswith("paused by the timing plane")
        assert "schedule no longer compiles: schedule.zone" in view["pause_reason"]
        assert "pause_reason" in http.get("/openapi.json").json()["components"]["schemas"]["TriggerView"][
            "properties"]
        history = http.get(f"/v1/triggers/{trig.id}/fires", headers=auth).json()["items"]
        assert [(f["state"], f["cause"][:27]) for f in history] == [("failed", "schedule no longer compiles")]
        # Resuming a schedule that still does not compile is refused, naming why; nothing changes.
        refused = http.post(f"/v1/triggers/{trig.id}/resume", headers=auth)
        assert refused.status_code == 409 and "no longer compiles" in refused.json()["detail"]
        # Amending without a schedule is refused naming the field; with a new one, it resumes.
        kept = http.patch(f"/v1/triggers/{trig.id}", headers=auth, json={"name": "renamed"})
        assert kept.status_code == 422 and kept.json()["errors"][0]["field"] == "schedule"
        fixed = http.patch(f"/v1/triggers/{trig.id}", headers=auth,
                           json={"schedule": {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"}})
        assert fixed.status_code == 200, fixed.text
        back = http.post(f"/v1/triggers/{trig.id}/resume", headers=auth)
        assert back.status_code == 200, back.text
        assert back.json()["state"] == "active" and back.json()["pause_reason"] is None
        assert back.json()["next_instant"] is not None
