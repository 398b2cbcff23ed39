"""The smear cap through the real API, timing loop and report (issue 18 item 4, decision 0145).

A 2 s interval trigger with a 4 s jitter window, created over HTTP, decided by the real timing loop
on a fake clock: its whole-minute fire's committed not-before is below half the 2 s gap (it is
dispatched before the 12:01:02 fire), and ``GET /v1/reports/smearing`` counts it as capped and
recomputes exactly the not-before the planner committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apikit import T0, Api
from fireledger.domain.smearing import dispatch_not_before_us, smear_offset_us
from fireledger.observe.smearing import smearing_report
from fireledger.timing import TimingLoop

S = 1_000_000


@pytest.fixture
def api(tmp_path: Path) -> Any:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def test_a_capped_smear_is_committed_reported_and_in_order(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    target = s.target()["id"]
    minute = T0 + 60 * S                                   # 12:01:00, a whole minute
    late: list[str] = []
    for _ in range(40):                                    # until one trigger's uncapped offset is >= 2 s
        tid = s.trigger(target, {"every": "2s", "anchor": "2026-03-27T12:01:00Z"}, jitter="4s")["id"]
        late.append(tid)
        if smear_offset_us(tid, 4) >= 2 * S:
            break
    trigger = late[-1]
    assert smear_offset_us(trigger, 4) >= 2 * S, "no trigger id with a late offset in 40 tries"
    loop = TimingLoop(api.store, api.clock, "timing-1")
    for k in range(4):                                     # decide 12:01:00, :02, :04, :06
        api.clock.set(minute + k * 2 * S + 5_000)
        loop.tick()
    fires = sorted((f for f in api.store.history.history_fires(tenant_id, trigger_id=trigger, limit=100)),
                   key=lambda f: f.scheduled_us)
    assert [f.scheduled_us for f in fires] == [minute + k * 2 * S for k in range(4)]
    first = fires[0]
    assert minute <= first.next_attempt_us < minute + S    # capped below half the 2 s gap
    assert first.next_attempt_us == max(dispatch_not_before_us(trigger, minute, 4, minute + 2 * S) or 0,
                                        minute + 5_000)
    # Each fire may start no earlier than the one before it: the order of the instants.
    starts = [f.next_attempt_us for f in fires]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)

    r = s.get("/v1/reports/smearing", params={"from": "2026-03-27T12:00:00Z", "to": "2026-03-27T12:02:00Z"})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["smeared_fires"] == len(late)               # one whole-minute fire per trigger
    assert rep["capped_fires"] == len(late)                # every one of them: 2 s gap < 2 × 4 s window
    assert "never reorders" in rep["smear_cap"]
    assert rep["smeared_lateness_s"]["raw"]["fires"] == 0  # nothing dispatched yet
    whole = smearing_report(api.store, minute - 60 * S, minute + 60 * S)
    assert whole.capped_fires == len(late)
    # The report's smeared peak is recomputed from the same capped offsets the planner committed.
    assert whole.with_.second_us is not None and whole.with_.second_us < minute + S


def test_the_api_takes_quartz_w_and_year_and_names_schedule_cron(api: Api) -> None:
    """The API passes the expression to the compiler: W, ? and the year need nothing of their own."""
    _, s = api.tenant("acme")
    target = s.target()["id"]
    made = s.trigger(target, {"cron": "0 30 9 15W * ? 2026-2030", "zone": "Europe/London"})
    assert made["schedule"]["cron"] == "0 30 9 15W * ? 2026-2030"
    r = s.post("/v1/triggers", json={"name": "x", "schedule": {"cron": "0 0 9 1 1 ? 2300"}, "target_id": target,
                                     "payload": {}})
    assert r.status_code == 422
    assert r.json()["errors"] == [{"field": "schedule.cron", "problem": "year: 2300 is out of range 1970-2199"}]
