"""``GET /v1/reports/delivery`` and the lane, page and drain metrics through the real control app
(issue 18 item 7; decisions 0165–0167): a real SQLite store, the real timing loop on a fake clock,
claims and settlements made as two dispatch runners would (one vanishing mid-attempt)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from apikit import T0, Api, assert_problem
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.model import AttemptResult, FireState
from fireledger.timing import TimingLoop

S = 1_000_000


def samples(text: str, name: str) -> dict[str, float]:
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)}


@pytest.fixture
def api(tmp_path: Path) -> Any:
    a = Api(tmp_path, metrics_cache_s=0)
    yield a
    a.assert_no_sentinel()
    a.close()


def _settle(api: Api, jobs: list[Any], at_us: int) -> list[bool]:
    return api.store.dispatch.settle_attempts(
        [Settlement(j, AttemptResult.DELIVERED, 200, None, FireState.DELIVERED, None, None) for j in jobs], at_us)


def test_the_delivery_report_counts_proven_and_possible_duplicates_of_the_tenant(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    _, other = api.tenant("other")
    target = s.target()["id"]
    tid = s.trigger(target, {"every": "10s", "anchor": "2026-03-27T12:00:00Z"})["id"]
    loop = TimingLoop(api.store, api.clock, "timing-1")
    for k in range(1, 4):                                   # decide 12:00:10, :20, :30 on time
        api.clock.set(T0 + k * 10 * S + 5_000)
        loop.tick()
    now = api.clock.now().latest_us
    [vanished] = api.store.dispatch.claim_dispatch("on-time", now, 1, "runner-1", 1 * S)
    later = now + 5 * S
    jobs = api.store.dispatch.claim_dispatch("on-time", later, 10, "runner-2", 30 * S)
    assert len(jobs) == 3 and _settle(api, jobs, later) == [True] * 3
    window = {"from": "2026-03-27T12:00:00Z", "to": "2026-03-27T12:01:00Z"}
    r = s.get("/v1/reports/delivery", params=window)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["from"] == "2026-03-27T12:00:00Z" and body["to"] == "2026-03-27T12:01:00Z"
    assert (body["delivered_fires"], body["duplicate_attempts"], body["possible_duplicate_attempts"]) == (3, 0, 1)
    assert body["duplicates_per_million"] == 0 and body["possible_duplicates_per_million"] == pytest.approx(1e6 / 3)
    assert "already delivered" in body["definition"]
    # The vanished runner's 2xx arrives: the ledger now proves the duplicate.
    assert _settle(api, [vanished], later + S) == [False]
    body = s.get("/v1/reports/delivery", params=window).json()
    assert (body["duplicate_attempts"], body["possible_duplicate_attempts"]) == (1, 0)
    assert body["duplicates_per_million"] == pytest.approx(1e6 / 3)
    # Default window: the hour before now (the fake clock's 12:00:3x) holds the same fires.
    assert s.get("/v1/reports/delivery").json()["delivered_fires"] == 3
    # Another tenant sees only its own (none): no rate rather than a made-up zero.
    mine = other.get("/v1/reports/delivery", params=window).json()
    assert mine["delivered_fires"] == 0 and mine["duplicates_per_million"] is None
    assert tid not in r.text and tenant_id not in r.text
    # The cluster-wide metric agrees (every tenant, the trailing hour).
    text = api.http.get("/metrics").text
    assert samples(text, "fireledger_duplicate_deliveries_per_million") == {
        '{kind="proven"}': pytest.approx(1e6 / 3), '{kind="possible"}': 0.0}
    assert samples(text, "fireledger_delivered_fires_window") == {"": 3.0}


def test_the_delivery_report_refuses_bad_windows_and_anonymous_callers(api: Api) -> None:
    _, s = api.tenant("acme")
    assert_problem(s.get("/v1/reports/delivery", params={"from": "2026-03-01T00:00:00Z",
                                                         "to": "2026-03-27T00:00:00Z"}), 422, "from")
    assert_problem(s.get("/v1/reports/delivery", params={"from": "2026-03-27T12:00:00Z",
                                                         "to": "2026-03-27T11:00:00Z"}), 422, "to")
    assert_problem(s.get("/v1/reports/delivery", params={"to": "yesterday"}), 422)
    assert_problem(api.anon.get("/v1/reports/delivery"), 401)


def test_lane_due_ages_the_page_and_a_declared_drain_in_metrics(api: Api) -> None:
    _, s = api.tenant("acme")
    target = s.target()["id"]
    s.trigger(target, {"every": "10s", "anchor": "2026-03-27T12:00:00Z"},
              missed_fire_policy="fire-all", catchup_horizon="1h")
    text = api.http.get("/metrics").text
    assert samples(text, "fireledger_lane_due_age_seconds") == {
        '{lane="on-time"}': 0.0, '{lane="catch-up"}': 0.0, '{lane="backfill"}': 0.0}
    assert samples(text, "fireledger_drain_declared") == {"": 0.0}
    # An outage: nothing decides for 5 minutes. The undecided rows page (the timing plane is down).
    api.clock.set(T0 + 300 * S)
    text = api.http.get("/metrics").text
    assert samples(text, "fireledger_page_due_age_seconds")[""] == pytest.approx(290.0)
    assert samples(text, "fireledger_undecided_due_age_seconds")[""] == pytest.approx(290.0)
    # The timing plane is back: the missed instants go to the catch-up lane (drained at its capped
    # rate: here not at all), while the on-time lane is dispatched as it falls due.
    loop = TimingLoop(api.store, api.clock, "timing-1")
    for step in range(0, 101, 5):
        api.clock.set(T0 + (300 + step) * S)
        loop.tick()
        now = api.clock.now().latest_us
        _settle(api, api.store.dispatch.claim_dispatch("on-time", now, 100, "runner-1", 30 * S), now)
    text = api.http.get("/metrics").text
    lanes = samples(text, "fireledger_lane_due_age_seconds")
    assert lanes['{lane="catch-up"}'] == pytest.approx(100.0, abs=0.1)   # waiting since its decision
    assert lanes['{lane="on-time"}'] == 0.0 and lanes['{lane="backfill"}'] == 0.0
    # ...and the catch-up lane's wait is not the page's: only on-time fires and undecided rows are.
    page = samples(text, "fireledger_page_due_age_seconds")[""]
    assert page < 10 and page == samples(text, "fireledger_undecided_due_age_seconds")[""]
    assert max(samples(text, "fireledger_oldest_undispatched_due_age_seconds").values(), default=0.0) == page
    depth = samples(text, "fireledger_lane_depth")['{lane="catch-up",state="pending"}']
    assert depth >= 20                                                   # 12:00:10 … 12:04:00, at least
    # A declared drain shows in the metrics and until when.
    now = api.clock.now().latest_us
    api.store.dispatch.drain_start(now + 3600 * S, "outage catch-up", "operator", now)
    text = api.http.get("/metrics").text
    assert samples(text, "fireledger_drain_declared") == {"": 1.0}
    assert samples(text, "fireledger_drain_remaining_seconds")[""] == pytest.approx(3600.0, abs=1)
