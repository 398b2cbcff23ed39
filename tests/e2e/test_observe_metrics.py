"""``/metrics``: the paging signal per partition, lane depths, leases, node ε — and the acceptance
test: a stalled timing plane raises the due age while every health check still passes."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import SENTINEL, Api
from e2e import Api as HttpApi
from e2e import Service, cli, new_tenant, verify_target, wait_until
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.observe.metrics import DUE_AGE
from fireledger.recurrence import TZDATA_VERSION
from sink import SinkServer

S = 1_000_000
ROOT = Path(__file__).resolve().parents[2]


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of every sample of metric ``name`` in a text exposition."""
    out = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path, metrics_cache_s=0)   # each scrape here must see the change just made
    yield a
    a.close()


def test_due_age_is_per_partition_and_lanes_leases_nodes_are_exported(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    target = s.target()["id"]
    a = s.trigger(target, {"every": "60s"})
    part_a = api.store.registry.get_trigger(tenant_id, a["id"]).partition
    for _ in range(20):   # a second trigger in another partition (ids are random: 1/256 collide)
        b = s.trigger(target, {"every": "60s"})
        if api.store.registry.get_trigger(tenant_id, b["id"]).partition != part_a:
            break
        s.delete(f"/v1/triggers/{b['id']}")
    parts = {t["id"]: api.store.registry.get_trigger(tenant_id, t["id"]).partition for t in (a, b)}
    assert parts[a["id"]] != parts[b["id"]]
    first = api.store.registry.get_trigger(tenant_id, a["id"]).next_us
    text = api.http.get("/metrics").text
    assert samples(text, DUE_AGE) == {} and samples(text, DUE_AGE.replace("_seconds", "_max_seconds")) == {"": 0}
    assert samples(text, "fireledger_store_up") == {"": 1.0}
    # 30 s past the first instants, with no timing plane: both partitions wait, by their own age.
    api.clock.set(first + 30 * S)
    got = samples(api.http.get("/metrics").text, DUE_AGE)
    assert got == {f'{{partition="{parts[a["id"]]}"}}': 30.0, f'{{partition="{parts[b["id"]]}"}}': 30.0}
    # Decide a's instant (commit, no dispatch yet): a's partition now waits on the dispatch plane.
    row = next(d for d in api.store.timing.due_rows(2**62, 10) if d.trigger_id == a["id"])
    fire = NewFire(tenant_id, a["id"], row.next_us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                   first + 20 * S, TZDATA_VERSION, "timing-1")
    api.store.timing.apply_decisions([Decision(Advance(a["id"], row.next_us, 1, row.next_us + 60 * S, 1), (fire,))])
    text = api.http.get("/metrics").text
    by_part = samples(text, DUE_AGE)
    assert by_part[f'{{partition="{parts[a["id"]]}"}}'] == 10.0     # waiting since its dispatch time
    assert by_part[f'{{partition="{parts[b["id"]]}"}}'] == 30.0
    assert samples(text, DUE_AGE.replace("_seconds", "_max_seconds")) == {"": 30.0}
    assert samples(text, "fireledger_lane_depth")['{lane="on-time",state="pending"}'] == 1.0
    with api.store.engine.write() as c:
        c.execute(f"INSERT INTO leases (partition, owner, epoch, expires_us, eps_us) VALUES "
                  f"(1, 'timing-1', 3, {first + 60 * S}, 2000), (2, 'timing-1', 1, {first}, 2000), "
                  "(3, NULL, 0, 0, NULL)")
        c.execute(f"INSERT INTO nodes (id, role, started_us, heartbeat_us, eps_us, eps_source) VALUES "
                  f"('timing-1', 'timing', {first}, {first + 28 * S}, 2000, 'declared')")
    text = api.http.get("/metrics").text
    assert samples(text, "fireledger_leases_held") == {'{owner="timing-1"}': 1.0}
    assert samples(text, "fireledger_partitions_unleased") == {"": 2.0}
    eps = samples(text, "fireledger_node_eps_seconds")
    assert eps == {'{node="timing-1",role="timing",source="declared"}': 0.002}
    assert samples(text, "fireledger_node_heartbeat_age_seconds") == {'{node="timing-1",role="timing"}': 2.0}
    assert SENTINEL not in text and tenant_id not in text and a["id"] not in text


def test_metrics_still_answer_when_the_store_does_not(api: Api) -> None:
    api.store.close()
    api.store.engine.path = "/nonexistent/dir/x.db"   # every new connection now fails
    r = api.http.get("/metrics")
    assert r.status_code == 200 and samples(r.text, "fireledger_store_up") == {"": 0.0}


def test_shipped_alert_rules_and_dashboard_use_exported_metrics(api: Api) -> None:
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    assert re.search(rf"max by \(partition\) \({DUE_AGE}\) > 60", rules)
    assert "severity: page" in rules
    # Issue 17 item 3: verifications expiring unrenewed raise a ticket per tenant (decision 0172).
    assert re.search(r"max by \(tenant\) \(fireledger_targets_verification_expiring\) > 0", rules)
    # The page is suppressed while a drain is declared (decision 0166); shadow divergence alerts (0168).
    assert re.search(rf"{DUE_AGE}\) > 60 unless on\(\) \(max\(fireledger_drain_declared\) == 1\)", rules)
    assert re.search(r"alert: FireledgerShadowDivergence\b", rules)
    assert re.search(r"expr: .*fireledger_shadow_divergence\{kind=~\"missing\|wrong_instant\"\}", rules)
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "fireledger.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and any(DUE_AGE in e for e in exprs)
    # Issue 17 item 3: a panel shows the unrenewed expiring verifications per tenant (the ticket's signal).
    expiring = [p for p in dashboard["panels"]
                if any("fireledger_targets_verification_expiring" in t["expr"] for t in p.get("targets", []))]
    assert [t["expr"] for p in expiring for t in p["targets"]] == [
        "max by (tenant) (fireledger_targets_verification_expiring)"]
    assert expiring[0]["targets"][0]["legendFormat"] == "{{tenant}}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exported = set(re.findall(r"^# TYPE (\S+) ", api.http.get("/metrics").text, re.M))
    for e in exprs + re.findall(r"expr: (.+)", rules):
        for name in re.findall(r"\b(fireledger_[a-z_]+)", e):
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            if name.startswith("fireledger_replica_"):   # only with FIRELEDGER_REPLICA: test_replica_health.py
                continue
            assert name in exported or base in exported, f"{name} is not exported"


# --- acceptance: a stalled timing plane pages while every health check passes --------------------


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def due_age_max(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return max(samples(text, DUE_AGE).values(), default=0.0)


def healthy(svc: Service, *others: Service) -> bool:
    with urllib.request.urlopen(svc.base + "/healthz", timeout=10) as r:
        ok = r.status == 200 and json.loads(r.read()) == {"status": "ok"}
    return ok and all(o.proc is not None and o.proc.poll() is None for o in (svc, *others))


@pytest.mark.e2e
def test_a_stalled_timing_plane_pages_while_health_checks_pass(tmp_path: Path, sink: SinkServer) -> None:
    threshold_s = 5.0        # the shipped rule pages at 60 s; the test uses a short threshold
    db = f"sqlite:///{tmp_path}/stall.db"
    cli("db", "upgrade", "--db", db)
    control = Service(db, tmp_path, command="control").start()
    dispatch = Service(db, tmp_path, command="dispatch").start()
    timing = None
    try:
        _, token = new_tenant(db)
        api = HttpApi(control.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        ids = [api.ok("POST", "/v1/triggers", {"name": f"t{i}", "schedule": {"every": "1s"},
                                                "target_id": target["id"]}, 201)["id"] for i in range(3)]
        seen = []

        def paging() -> bool:
            assert healthy(control, dispatch), "a health check failed"
            seen.append(due_age_max(control.base))
            return seen[-1] > threshold_s

        wait_until(paging, 60, "the due age to pass the threshold", interval_s=0.5)
        assert healthy(control, dispatch) and sink.records() == []   # up, healthy, and not firing
        status = json.loads(cli("status", "--db", db, "--json").stdout)
        assert status["due_age_max_s"] > threshold_s
        # Positive control: with a timing plane back, the backlog is decided and the signal clears.
        timing = Service(db, tmp_path, command="timing").start()
        wait_until(lambda: due_age_max(control.base) < 1.0, 60, "the due age to clear")
        def attempted() -> bool:   # the backlog was decided, and its fires attempted by dispatch
            firsts = [api.ok("GET", f"/v1/triggers/{tid}/fires?limit=1")["items"] for tid in ids]
            return all(f and f[0]["dispatched_at"] is not None for f in firsts)

        wait_until(attempted, 30, "the backlog to be attempted", interval_s=0.2)
        assert due_age_max(control.base) < threshold_s
    finally:
        for svc in (timing, dispatch, control):
            if svc is not None:
                svc.stop()
