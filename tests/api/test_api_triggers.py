"""Trigger lifecycle over HTTP against a real store: create, read, list, amend, pause, resume,
delete, preview — and the single next instant each change leaves in the due index."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import SENTINEL, T0, Api, assert_problem, us
from fireledger.recurrence import TZDATA_VERSION
from fireledger.security.envelope import cipher_for

PARIS_WEEKDAYS = {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def test_create_returns_the_view_with_the_literal_next_instant(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    r = s.post("/v1/triggers", json={"name": "weekday report", "schedule": PARIS_WEEKDAYS,
                                     "target_id": tg["id"], "payload": {"secret": SENTINEL}})
    assert r.status_code == 201, r.text
    assert r.headers["content-type"] == "application/json"
    t = r.json()
    assert r.headers["location"] == f"/v1/triggers/{t['id']}"
    assert t["id"].startswith("tr_")
    # Friday 2026-03-27 12:00Z: Friday's 09:00 Paris has passed; Monday 30 March is after the switch
    # to CEST (UTC+2), so 09:00 Paris is 07:00Z.
    assert t["next_instant"] == "2026-03-30T07:00:00Z"
    assert t == {
        "id": t["id"], "name": "weekday report", "state": "active", "version": 1,
        "schedule": {"cron": "0 0 9 * * 1-5", "zone": "Europe/Paris"}, "target_id": tg["id"],
        "missed_fire_policy": "fire-once-now", "catchup_horizon": "1h", "overlap_policy": "allow",
        "outcome_window": "1h", "jitter": "10s", "timeout": "30s",
        "retry": {"max_attempts": 8, "min_backoff": "1s", "max_backoff": "5m", "max_event_age": None},
        "next_instant": "2026-03-30T07:00:00Z", "pause_reason": None, "tzdata_version": TZDATA_VERSION,
        "created_at": "2026-03-27T12:00:00Z", "updated_at": "2026-03-27T12:00:00Z",
        "payload_digest": t["payload_digest"],   # keyed, opaque (decision 0186; tests/api/test_payload_digest.py)
    }
    assert "payload" not in t and t["payload_digest"].startswith("hmac-sha256:")
    # The due row says the same; the version stored the payload, the schedule normalised.
    stored = api.store.registry.get_trigger(tenant_id, t["id"])
    assert stored is not None and stored.next_us == us("2026-03-30T07:00:00Z")
    v = api.store.registry.get_version(t["id"], 1)
    assert v is not None and v.tzdata_version == TZDATA_VERSION
    # Stored sealed under the tenant's key (invariant 14): only the attempt runner's cipher opens it.
    assert SENTINEL.encode() not in v.payload
    assert SENTINEL.encode() in cipher_for(api.store).open(tenant_id, t["id"], 1, v.payload)
    assert api.changes == 1


def test_policy_fields_are_stored_and_shown(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], missed_fire_policy="fire-all", catchup_horizon="24h", overlap_policy="queue",
                  outcome_window="90m", jitter="30s", timeout="1500ms")
    assert (t["missed_fire_policy"], t["catchup_horizon"], t["overlap_policy"], t["outcome_window"],
            t["jitter"], t["timeout"]) == ("fire-all", "1d", "queue", "1h30m", "30s", "1s500ms")
    v = api.store.registry.get_version(t["id"], 1)
    assert v is not None
    p = v.policies
    assert (p.catchup_horizon_s, p.outcome_window_s, p.jitter_s, p.timeout_s) == (86400, 5400, 30, 1.5)


def test_interval_is_anchored_at_creation_and_the_anchor_is_stored(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"every": "90s"})
    assert t["schedule"] == {"every": "1m30s", "anchor": "2026-03-27T12:00:00Z", "zone": "UTC"}
    assert t["next_instant"] == "2026-03-27T12:01:30Z"
    # Later computations use the stored anchor, not "now".
    api.clock.advance(10_000_000)
    r = s.get(f"/v1/triggers/{t['id']}/preview", params={"count": 2})
    assert [i["instant"] for i in r.json()["items"]] == ["2026-03-27T12:01:30Z", "2026-03-27T12:03:00Z"]


def test_interval_anchor_is_truncated_to_the_second(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    api.clock.advance(123_456)
    t = s.trigger(tg["id"], {"every": "15m"})
    assert t["schedule"]["anchor"] == "2026-03-27T12:00:00Z"
    assert t["next_instant"] == "2026-03-27T12:15:00Z"
    assert t["created_at"] == "2026-03-27T12:00:00.123456Z"


def test_one_shot_in_the_future(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"at": "2026-04-01T10:00:00+02:00"})
    assert t["next_instant"] == "2026-04-01T08:00:00Z"
    assert t["schedule"] == {"at": "2026-04-01T08:00:00Z", "zone": "UTC"}


def test_get_and_list_with_cursor(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    made = sorted(s.trigger(tg["id"], name=f"t{i}")["id"] for i in range(5))
    assert s.get(f"/v1/triggers/{made[0]}").json()["id"] == made[0]
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        r = s.get("/v1/triggers", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [i["id"] for i in page["items"]]
        pages += 1
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == made and pages == 3
    assert [i["id"] for i in s.get("/v1/triggers").json()["items"]] == made


def test_amend_schedule_changes_next_instant_at_once_and_bumps_version(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"])
    before = api.changes
    api.clock.advance(60_000_000)
    r = s.patch(f"/v1/triggers/{t['id']}", json={"schedule": {"cron": "*/15 * * * *", "zone": "UTC"}})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["version"] == 2
    assert a["next_instant"] == "2026-03-27T12:15:00Z"
    assert a["schedule"] == {"cron": "0 */15 * * * *", "zone": "UTC"}
    assert a["updated_at"] == "2026-03-27T12:01:00Z" and a["created_at"] == "2026-03-27T12:00:00Z"
    assert api.changes == before + 1
    stored = api.store.registry.get_trigger(tenant_id, t["id"])
    assert stored is not None and stored.next_us == us("2026-03-27T12:15:00Z")
    assert stored.current_version == 2
    # The old version is kept, immutable.
    v1 = api.store.registry.get_version(t["id"], 1)
    assert v1 is not None and v1.schedule["cron"] == "0 0 9 * * 1-5"


def test_amend_other_fields_keeps_schedule_and_pending_instant(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    tg2 = s.target("https://other.example.com/hook")
    t = s.trigger(tg["id"])
    r = s.patch(f"/v1/triggers/{t['id']}", json={"name": "renamed", "target_id": tg2["id"],
                                                  "payload": {"v": 2, "secret": SENTINEL},
                                                  "overlap_policy": "skip", "jitter": "5s"})
    assert r.status_code == 200, r.text
    a = r.json()
    assert (a["name"], a["target_id"], a["overlap_policy"], a["jitter"], a["version"]) == (
        "renamed", tg2["id"], "skip", "5s", 2)
    assert a["missed_fire_policy"] == "fire-once-now" and a["timeout"] == "30s"
    assert a["next_instant"] == t["next_instant"] and a["schedule"] == t["schedule"]
    v2 = api.store.registry.get_version(t["id"], 2)
    assert v2 is not None and b'"v":2' in cipher_for(api.store).open(tenant_id, t["id"], 2, v2.payload)
    # An interval keeps its original anchor across amendments that do not touch the schedule.
    iv = s.trigger(tg["id"], {"every": "1h"})
    api.clock.advance(600_000_000)
    b = s.patch(f"/v1/triggers/{iv['id']}", json={"name": "hourly"}).json()
    assert b["schedule"]["anchor"] == "2026-03-27T12:00:00Z" and b["next_instant"] == "2026-03-27T13:00:00Z"


def test_pause_removes_next_instant_and_resume_restores_it(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"cron": "0 * * * *", "zone": "UTC"})
    assert t["next_instant"] == "2026-03-27T13:00:00Z"
    r = s.post(f"/v1/triggers/{t['id']}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "paused" and r.json()["next_instant"] is None
    assert api.store.timing.earliest_due() is None
    assert_problem(s.post(f"/v1/triggers/{t['id']}/pause"), 409)
    # Paused across two instants: resume restarts at the first instant after the pause, so the timing
    # plane decides the paused ones by the missed-fire policy (tests/planes/test_pause_resume.py, decision 0063).
    api.clock.advance(2 * 3600 * 1_000_000 + 1)
    r = s.post(f"/v1/triggers/{t['id']}/resume")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "active" and r.json()["next_instant"] == "2026-03-27T13:00:00Z"
    assert api.store.timing.earliest_due() == us("2026-03-27T13:00:00Z")
    assert_problem(s.post(f"/v1/triggers/{t['id']}/resume"), 409)
    assert s.get(f"/v1/triggers/{t['id']}").json()["next_instant"] == "2026-03-27T13:00:00Z"


def test_amend_while_paused_keeps_it_paused(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"])
    s.post(f"/v1/triggers/{t['id']}/pause")
    r = s.patch(f"/v1/triggers/{t['id']}", json={"schedule": {"every": "5m"}})
    assert r.status_code == 200 and r.json()["state"] == "paused" and r.json()["next_instant"] is None
    assert api.store.timing.earliest_due() is None
    r = s.post(f"/v1/triggers/{t['id']}/resume")
    assert r.json()["next_instant"] == "2026-03-27T12:05:00Z"


def test_delete_removes_trigger_and_due_row(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"])
    keep = s.trigger(tg["id"], {"every": "1h"})
    before = api.changes
    r = s.delete(f"/v1/triggers/{t['id']}")
    assert r.status_code == 204 and r.content == b""
    assert api.changes == before + 1
    assert_problem(s.get(f"/v1/triggers/{t['id']}"), 404)
    assert_problem(s.delete(f"/v1/triggers/{t['id']}"), 404)
    assert_problem(s.post(f"/v1/triggers/{t['id']}/resume"), 404)
    assert [i["id"] for i in s.get("/v1/triggers").json()["items"]] == [keep["id"]]
    assert [d.trigger_id for d in api.store.timing.due_rows(2**62, 10)] == [keep["id"]]


def test_preview_uses_the_compiler_and_declares_dst(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"cron": "30 2 * * *", "zone": "Europe/Paris"})
    r = s.get(f"/v1/triggers/{t['id']}/preview", params={"count": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tzdata_version"] == TZDATA_VERSION
    assert body["items"] == [
        {"instant": "2026-03-28T01:30:00Z", "local": "2026-03-28T02:30:00", "dst": None},
        # 02:30 does not exist on 29 March in Paris: fires when the clock jumps (01:00Z).
        {"instant": "2026-03-29T01:00:00Z", "local": "2026-03-29T02:30:00", "dst": "gap"},
        {"instant": "2026-03-30T00:30:00Z", "local": "2026-03-30T02:30:00", "dst": None},
    ]
    assert body["items"][0]["instant"] == t["next_instant"]
    assert len(s.get(f"/v1/triggers/{t['id']}/preview").json()["items"]) == 10
    assert len(s.get(f"/v1/triggers/{t['id']}/preview", params={"count": 1000}).json()["items"]) == 1000
    once = s.trigger(tg["id"], {"at": "2026-04-01T08:00:00Z", "zone": "Europe/Paris"})
    items = s.get(f"/v1/triggers/{once['id']}/preview", params={"count": 5}).json()["items"]
    assert items == [{"instant": "2026-04-01T08:00:00Z", "local": "2026-04-01T10:00:00", "dst": None}]


def test_run_is_offered_to_authors_only(api: Api) -> None:
    _, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    assert s.post(f"/v1/triggers/{t['id']}/run").status_code == 201   # details: tests/api/test_api_run.py
    assert T0  # the harness's fixed origin
