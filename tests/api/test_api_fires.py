"""Fire history over HTTP: oldest first, opaque cursors, attempts, one fire by key; never payloads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import SENTINEL, Api, assert_problem, us
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.recurrence import TZDATA_VERSION


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


HOUR = 3600 * 1_000_000


def _decide(api: Api, tenant_id: str, trigger_id: str, instants: int, *, extra_seq_at: int | None = None) -> None:
    """Play the timing plane: decide ``instants`` hourly fires through the store's claim path."""
    for _ in range(instants):
        due = api.store.timing.due_rows(2**62, 10)
        row = next(d for d in due if d.trigger_id == trigger_id)
        fires = [NewFire(tenant_id, trigger_id, row.next_us, 0, row.version, FireKind.SCHEDULED, Lane.ON_TIME,
                         FireState.PENDING, row.next_us + 1000, TZDATA_VERSION, "node-a")]
        if extra_seq_at == row.next_us:
            fires.append(NewFire(tenant_id, trigger_id, row.next_us, 1, row.version, FireKind.MANUAL,
                                 Lane.ON_TIME, FireState.SKIPPED, row.next_us + 2000, TZDATA_VERSION, "node-a",
                                 cause="overlap-skip"))
        out = api.store.timing.apply_decisions([Decision(Advance(trigger_id, row.next_us, row.version,
                                                          row.next_us + HOUR, row.version), tuple(fires))])
        assert out[0].advanced


def _setup(api: Api) -> tuple[str, Any, dict[str, Any]]:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"], {"cron": "0 * * * *", "zone": "UTC"})
    first = us("2026-03-27T13:00:00Z")
    _decide(api, tenant_id, t["id"], 3, extra_seq_at=first + HOUR)
    # One attempt for the first fire, delivered.
    jobs = api.store.dispatch.claim_dispatch("on-time", first + 5000, 1, "runner-1", 30_000_000)
    assert len(jobs) == 1 and jobs[0].fire.scheduled_us == first
    settled = api.store.dispatch.settle_attempts([Settlement(jobs[0], result="delivered", http_status=204, error=None,
                                                    state="delivered", cause=None, next_attempt_us=None)],
                                        now_us=first + 9000)
    assert settled == [True]
    return tenant_id, s, t


def test_fires_listed_oldest_first_with_attempts(api: Api) -> None:
    tenant_id, s, t = _setup(api)
    r = s.get(f"/v1/triggers/{t['id']}/fires")
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["next"] is None
    items = page["items"]
    assert [(i["scheduled_instant"], i["key"].rsplit(".", 1)[1]) for i in items] == [
        ("2026-03-27T13:00:00Z", "0"), ("2026-03-27T14:00:00Z", "0"), ("2026-03-27T14:00:00Z", "1"),
        ("2026-03-27T15:00:00Z", "0")]
    first = items[0]
    assert first == {
        "key": f"{tenant_id}.{t['id']}.20260327T130000Z.0",
        "trigger_id": t["id"],
        "scheduled_instant": "2026-03-27T13:00:00Z",
        "decided_at": "2026-03-27T13:00:00.001000Z",
        "dispatched_at": "2026-03-27T13:00:00.005000Z",
        "finished_at": "2026-03-27T13:00:00.009000Z",
        "state": "delivered", "cause": None, "kind": "scheduled", "lane": "on-time", "version": 1,
        "tzdata_version": TZDATA_VERSION, "decided_by": "node-a", "eps_s": None, "eps_source": None,
        "lateness_s": 0.005, "redriven_at": None, "warnings": [],
        "attempts": [{"attempt": 1, "started_at": "2026-03-27T13:00:00.005000Z",
                      "finished_at": "2026-03-27T13:00:00.009000Z", "result": "delivered",
                      "http_status": 204, "error": None, "duration_s": 0.004}],
    }
    skipped = items[2]
    assert (skipped["state"], skipped["cause"], skipped["kind"], skipped["attempts"]) == (
        "skipped", "overlap-skip", "manual", [])
    assert items[1]["state"] == "pending" and items[1]["dispatched_at"] is None
    assert SENTINEL not in r.text
    assert FireKey.parse(first["key"]) == FireKey(tenant_id, t["id"], us("2026-03-27T13:00:00Z"), 0)


def test_cursor_walks_every_fire_once(api: Api) -> None:
    _, s, t = _setup(api)
    keys, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1} | ({"cursor": cursor} if cursor else {})
        page = s.get(f"/v1/triggers/{t['id']}/fires", params=params).json()
        keys += [i["key"] for i in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert keys == [i["key"] for i in s.get(f"/v1/triggers/{t['id']}/fires").json()["items"]]
    assert len(keys) == 4
    # The cursor is opaque: not a plain instant.
    c = s.get(f"/v1/triggers/{t['id']}/fires", params={"limit": 2}).json()["next"]
    assert c and ":" not in c and "2026" not in c
    assert s.get(f"/v1/triggers/{t['id']}/fires", params={"limit": 1000}).status_code == 200


def test_one_fire_by_key(api: Api) -> None:
    _, s, t = _setup(api)
    items = s.get(f"/v1/triggers/{t['id']}/fires").json()["items"]
    for item in items:
        r = s.get(f"/v1/fires/{item['key']}")
        assert r.status_code == 200, r.text
        assert r.json() == item
    absent = items[0]["key"].replace("T130000Z", "T120000Z")
    assert_problem(s.get(f"/v1/fires/{absent}"), 404)


@pytest.mark.parametrize("key", ["not-a-key", "a.b.c.d", "tn_x.tr_y.20261301T000000Z.0", "x" * 400,
                                 "tn_x.tr_y.20260101T000000Z.-1"])
def test_malformed_fire_key_is_404(api: Api, key: str) -> None:
    _, s = api.tenant("acme")
    assert_problem(s.get(f"/v1/fires/{key}"), 404)


def test_fires_of_an_unknown_trigger_is_404(api: Api) -> None:
    _, s = api.tenant("acme")
    assert_problem(s.get("/v1/triggers/tr_0123456789abcdef/fires"), 404)


def test_empty_history(api: Api) -> None:
    _, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    assert s.get(f"/v1/triggers/{t['id']}/fires").json() == {"items": [], "next": None}
