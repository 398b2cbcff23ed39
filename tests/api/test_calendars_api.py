"""``/v1/calendars`` and what triggers do with them and with several specs, through the real app, a
real SQLite store and the real timing loop driven by a fake clock (decisions 0155-0157):

* calendars: create/read/list/replace/delete with roles (author writes, reader reads), audit rows,
  409 for a taken name, a stale revision and a calendar a live trigger names (naming the triggers);
* a trigger naming a calendar the tenant lacks is refused (``schedule.calendars[0]``); preview and
  dry-run show which instants are excluded, and which specs produce each instant;
* the timing loop: a shared instant of two specs is ONE fire naming both specs; an excluded instant is
  recorded ``skipped`` with the calendar entry as its cause and never handed to dispatch; a calendar
  replaced after a decision changes no decided fire, only later ones; a calendar gone at decision
  time pauses the trigger with the cause (decision 0087's path).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from apikit import T0, Api, Session, assert_problem, us
from fireledger.control.history import fire_story
from fireledger.domain.keys import FireKey
from fireledger.domain.model import NewFire
from fireledger.timing import TimingLoop

S = 1_000_000
H = 3600 * S
XMAS = {"date": "2026-03-28", "zone": "Europe/Paris", "label": "Saturday off"}   # T0 is Friday 27 March 12:00Z


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def _reader(api: Api, s: Session) -> Session:
    return Session(api, s.post("/v1/principals", json={"name": "r", "roles": ["reader"]}).json()["token"])


def test_calendars_crud_roles_and_audit(api: Api) -> None:
    _, s = api.tenant("acme")
    _, other = api.tenant("globex")
    reader = _reader(api, s)
    assert_problem(reader.post("/v1/calendars", json={"name": "h", "entries": []}), 403)
    r = s.post("/v1/calendars", json={"name": "holidays", "entries": [XMAS]})
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == "/v1/calendars/holidays"
    assert r.json()["revision"] == 1 and r.json()["entries"] == [XMAS]
    assert_problem(s.post("/v1/calendars", json={"name": "holidays", "entries": []}), 409)
    assert_problem(s.post("/v1/calendars", json={"name": "bad", "entries": [{"date": "2026-02-30"}]}), 422,
                   "entries[0].date")
    assert_problem(s.post("/v1/calendars", json={"name": "bad", "entries": [{"cron": "0 0 9 * * *"}]}), 422,
                   "entries[0].cron")
    s.post("/v1/calendars", json={"name": "audit", "entries": [{"from": "2026-04-01", "to": "2026-04-03"}]})
    page = reader.get("/v1/calendars", params={"limit": 1}).json()
    assert [c["name"] for c in page["items"]] == ["audit"] and page["next"] == "c.audit"
    assert [c["name"] for c in reader.get("/v1/calendars", params={"cursor": page["next"]}).json()["items"]] == [
        "holidays"]
    assert reader.get("/v1/calendars/holidays").json()["entries"] == [XMAS]
    assert_problem(other.get("/v1/calendars/holidays"), 404)   # another tenant's reads as missing
    assert_problem(reader.request("PUT", "/v1/calendars/holidays", json={"entries": []}), 403)
    put = s.request("PUT", "/v1/calendars/holidays", json={"entries": [XMAS, {"cron": "* * 1 5 *"}], "revision": 1})
    assert put.status_code == 200 and put.json()["revision"] == 2
    assert_problem(s.request("PUT", "/v1/calendars/holidays", json={"entries": [], "revision": 1}), 409)
    assert_problem(s.request("PUT", "/v1/calendars/nope", json={"entries": []}), 404)
    assert_problem(reader.delete("/v1/calendars/audit"), 403)
    assert s.delete("/v1/calendars/audit").status_code == 204
    assert_problem(s.delete("/v1/calendars/audit"), 404)
    actions = [i["action"] for i in s.get("/v1/audit").json()["items"] if i["action"].startswith("calendar.")]
    assert actions == ["calendar.create", "calendar.create", "calendar.update", "calendar.delete"]


def test_triggers_name_existing_calendars_and_deleting_one_in_use_is_refused(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()["id"]
    body = {"name": "n", "target_id": tg, "schedule": {"cron": "0 9 * * *", "calendars": ["holidays"]}}
    assert_problem(s.post("/v1/triggers", json=body), 422, "schedule.calendars[0]")
    s.post("/v1/calendars", json={"name": "holidays", "entries": [XMAS]})
    made = s.post("/v1/triggers", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["schedule"]["calendars"] == ["holidays"]
    refused = assert_problem(s.delete("/v1/calendars/holidays"), 409)
    assert made.json()["id"] in refused["detail"]
    patch = {"schedule": {"cron": "0 9 * * *", "calendars": ["gone"]}}
    assert_problem(s.patch(f"/v1/triggers/{made.json()['id']}", json=patch), 422, "schedule.calendars[0]")
    assert s.delete(f"/v1/triggers/{made.json()['id']}").status_code == 204
    assert s.delete("/v1/calendars/holidays").status_code == 204


def _tick_until(api: Api, loop: TimingLoop, until_us: int) -> list[NewFire]:
    """Advance the fake clock by whole minutes to ``until_us``, one cycle each; the fires handed to
    dispatch (committed pending)."""
    handed: list[NewFire] = []
    loop.on_committed = handed.extend
    while api.clock.true_us < until_us:
        api.clock.advance(min(60 * S, until_us - api.clock.true_us))
        loop.tick()
    return handed


def _fires(s: Session, trigger_id: str) -> list[dict[str, object]]:
    items: list[dict[str, object]] = s.get(f"/v1/triggers/{trigger_id}/fires").json()["items"]
    return items


def _keys(fires: Sequence[NewFire]) -> list[int]:
    return [f.scheduled_us for f in fires]


def test_two_specs_fire_once_and_an_excluded_instant_is_recorded_skipped(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()["id"]
    s.post("/v1/calendars", json={"name": "weekend", "entries": [XMAS]})
    schedule = {"specs": [{"cron": "0 13 * * *", "zone": "UTC"}, {"every": "30m", "anchor": "2026-03-27T12:00:00Z"}],
                "calendars": ["weekend"]}
    trig = s.trigger(tg, schedule)
    prev = s.get(f"/v1/triggers/{trig['id']}/preview", params={"count": 25}).json()["items"]
    assert [(p["instant"][11:16], p["specs"]) for p in prev[:3]] == [("12:30", [1]), ("13:00", [0, 1]),
                                                                      ("13:30", [1])]
    # Paris's 28 March starts at 27 March 23:00 UTC: from there on, every instant is excluded.
    excluded = [p["instant"] for p in prev if p["excluded"]]
    assert excluded and excluded[0] == "2026-03-27T23:00:00Z"
    assert all("calendar 'weekend' entry 0" in p["excluded"] for p in prev if p["excluded"])

    loop = TimingLoop(api.store, api.clock, "node-a")
    handed = _tick_until(api, loop, us("2026-03-27T23:30:00Z"))
    thirteen = us("2026-03-27T13:00:00Z")
    assert _keys(handed).count(thirteen) == 1      # one fire for the shared instant
    assert us("2026-03-27T23:00:00Z") not in _keys(handed) and us("2026-03-27T23:30:00Z") not in _keys(handed)
    fires = {f["scheduled_instant"]: f for f in _fires(s, trig["id"])}
    assert fires["2026-03-27T13:00:00Z"]["specs"] == [0, 1] and fires["2026-03-27T13:30:00Z"]["specs"] == [1]
    skipped = fires["2026-03-27T23:00:00Z"]
    assert skipped["state"] == "skipped" and skipped["specs"] == [1]
    assert skipped["cause"] == ("skipped: excluded by calendar 'weekend' entry 0 (2026-03-28 in Europe/Paris, "
                                "'Saturday off')")
    assert fires["2026-03-27T23:30:00Z"]["state"] == "skipped"
    key = FireKey.parse(str(fires["2026-03-27T13:00:00Z"]["key"]))
    fire = api.store.history.get_fire(key)
    assert fire is not None
    story = " ".join(t for _, t in fire_story(fire, None, api.store.registry.get_version(trig["id"], 1)))
    assert "produced by schedule.specs 0, 1" in story


def test_a_calendar_change_reaches_only_later_decisions(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()["id"]
    s.post("/v1/calendars", json={"name": "cal", "entries": []})
    trig = s.trigger(tg, {"cron": "*/10 * * * *", "calendars": ["cal"]})
    loop = TimingLoop(api.store, api.clock, "node-a")
    handed = _tick_until(api, loop, T0 + 10 * 60 * S)
    assert _keys(handed) == [T0 + 10 * 60 * S]
    # Exclude all of 27 March: the decided 12:10 fire stays pending; 12:20 onwards are skipped.
    s.request("PUT", "/v1/calendars/cal", json={"entries": [{"date": "2026-03-27"}]})
    handed = _tick_until(api, loop, T0 + 30 * 60 * S)
    assert handed == []
    states = {f["scheduled_instant"][11:16]: f["state"] for f in _fires(s, trig["id"])}
    assert states == {"12:10": "pending", "12:20": "skipped", "12:30": "skipped"}
    dry = s.post("/v1/triggers/dry-run", json={"name": "n", "target_id": tg,
                                              "schedule": {"cron": "0 * * * *", "calendars": ["cal"]}}).json()
    assert dry["items"][0]["excluded"].startswith("skipped: excluded by calendar 'cal' entry 0 (2026-03-27")


def test_a_calendar_gone_at_decision_time_pauses_the_trigger(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()["id"]
    s.post("/v1/calendars", json={"name": "cal", "entries": []})
    trig = s.trigger(tg, {"cron": "*/10 * * * *", "calendars": ["cal"]})
    with api.store.engine.write() as c:     # as a delete racing the trigger's creation would leave it
        c.execute("DELETE FROM calendars")
    loop = TimingLoop(api.store, api.clock, "node-a")
    assert _tick_until(api, loop, T0 + 10 * 60 * S) == []
    got = s.get(f"/v1/triggers/{trig['id']}").json()
    assert got["state"] == "paused" and "calendar 'cal'" in got["pause_reason"]
    [fire] = _fires(s, trig["id"])
    assert fire["state"] == "failed" and "calendar 'cal'" in str(fire["cause"])


def test_dry_run_of_several_specs_lists_the_union(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()["id"]
    body = {"name": "n", "target_id": tg, "schedule": {"specs": [{"cron": "0 13 * * *"}, {"every": "1h"}]}}
    dry = s.post("/v1/triggers/dry-run", params={"count": 3}, json=body).json()
    # The interval is anchored at the dry run's instant (12:00Z): 13:00 is on both specs.
    assert [(i["instant"][11:16], i["specs"], i["excluded"]) for i in dry["items"]] == [
        ("13:00", [0, 1], None), ("14:00", [1], None), ("15:00", [1], None)]
    assert dry["definition"]["schedule"]["specs"][1]["anchor"] == "2026-03-27T12:00:00Z"
    assert any("without an anchor" in n for n in dry["notes"])
    bad = {**body, "schedule": {"specs": [{"cron": "0 13 * * *"}, {"cron": "0 0 31 2 *"}]}}
    assert_problem(s.post("/v1/triggers/dry-run", json=bad), 422, "schedule.specs[1].cron")
