"""Dead letters and redrive through the API (decision 0148): the list and its filters and cursor, a
redrive of one fire (same key, audited, role author), the refusals (not dead, past retention, another
tenant's, a reader), and the bulk redrive with its dry-run count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apikit import Api, Session, assert_problem, us
from fireledger.domain.keys import FireKey
from fireledger.domain.model import FireKind, FireState, Lane, NewFire
from fireledger.recurrence import TZDATA_VERSION

HOUR = 3600 * 1_000_000
DAY = 24 * HOUR


@pytest.fixture
def api(tmp_path: Path):
    a = Api(tmp_path)
    yield a
    a.close()


def _fire(tenant_id: str, trigger_id: str, at: int, state: FireState, cause: str | None) -> NewFire:
    return NewFire(tenant_id, trigger_id, at, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, state, at + 1000,
                   TZDATA_VERSION, "node-a", cause=cause)


def _world(api: Api) -> dict[str, Any]:
    """Two triggers of one tenant: A has a failed fire at 08:00 and 10:00, an unknown one at 09:00 and a
    delivered one at 11:00; B a failed one at 09:00 (on 27 March 2026; the API's clock reads 12:00)."""
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    a, b = s.trigger(tg["id"])["id"], s.trigger(tg["id"])["id"]
    h = us("2026-03-27T08:00:00Z")
    exhausted = "failed: retries exhausted after 8 attempts (last: HTTP 503)"
    fires = [_fire(tenant_id, a, h, FireState.FAILED, exhausted),
             _fire(tenant_id, a, h + HOUR, FireState.UNKNOWN, "unknown: no answer within 30s and no attempts left"),
             _fire(tenant_id, a, h + 2 * HOUR, FireState.FAILED, "failed: HTTP 404 is final"),
             _fire(tenant_id, a, h + 3 * HOUR, FireState.DELIVERED, None),
             _fire(tenant_id, b, h + HOUR, FireState.FAILED, exhausted),
             _fire(tenant_id, a, h - 100 * DAY, FireState.FAILED, exhausted)]       # past the 90-day retention
    assert len(api.store.timing.insert_fires(fires)) == len(fires)
    keys = [str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)) for f in fires]
    return {"tenant": tenant_id, "s": s, "a": a, "b": b, "keys": keys}


def test_dead_letters_are_listed_filtered_and_paged(api: Api) -> None:
    w = _world(api)
    s, k = w["s"], w["keys"]
    r = s.get("/v1/dead-letters")
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    # Oldest instant first; at 09:00 by trigger id. The delivered fire is not a dead letter.
    nine = sorted([(w["a"], k[1]), (w["b"], k[4])])
    assert [i["key"] for i in items] == [k[5], k[0], nine[0][1], nine[1][1], k[2]]
    assert {i["state"] for i in items} == {"failed", "unknown"}
    assert items[1]["cause"].startswith("failed: retries exhausted") and items[1]["redriven_at"] is None
    by_trigger = s.get("/v1/dead-letters", params={"trigger_id": w["b"]}).json()["items"]
    assert [i["key"] for i in by_trigger] == [k[4]]
    window = s.get("/v1/dead-letters", params={"from": "2026-03-27T09:00:00Z", "to": "2026-03-27T10:00:00Z"})
    assert sorted(i["key"] for i in window.json()["items"]) == sorted([k[1], k[4]])
    caused = s.get("/v1/dead-letters", params={"cause": "HTTP 404"}).json()["items"]
    assert [i["key"] for i in caused] == [k[2]]
    seen, cursor = [], None
    while True:
        page = s.get("/v1/dead-letters", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [i["key"] for i in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [i["key"] for i in items]
    assert_problem(s.get("/v1/dead-letters", params={"cursor": "bm9wZQ"}), 422, "cursor")
    assert_problem(s.get("/v1/dead-letters", params={"from": "yesterday"}), 422, "from")


def test_a_redrive_is_the_same_key_again_audited_and_refused_when_not_dead(api: Api) -> None:
    w = _world(api)
    s, k = w["s"], w["keys"]
    api.clock.advance(5_000_000)
    r = s.post(f"/v1/fires/{k[0]}/redrive")
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["key"] == k[0] and f["state"] == "pending" and f["cause"] is None
    assert f["redriven_at"] == "2026-03-27T12:00:05Z"
    stored = api.store.history.get_fire(FireKey.parse(k[0]))
    assert stored is not None and stored.next_attempt_us == us("2026-03-27T12:00:05Z")
    assert stored.attempt_base == 0 and stored.finished_us is None
    assert [i["key"] for i in s.get("/v1/dead-letters").json()["items"]].count(k[0]) == 0
    [row] = [e for e in api.store.trust.audit_rows(tenant_id=w["tenant"]) if e.action == "fire.redrive"]
    assert row.as_json()["prior"] == {"fire_key": k[0], "state": "failed", "cause": "failed: retries exhausted after 8 "
                         "attempts (last: HTTP 503)", "attempts": 0}
    assert row.as_json()["new"] == {"fire_key": k[0], "state": "pending", "attempt_base": 0}
    # Now pending: not dead. A delivered fire is not dead either. Nothing more is written.
    before = api.snapshot()["fires"]
    assert "pending" in assert_problem(s.post(f"/v1/fires/{k[0]}/redrive"), 409)["detail"]
    p = assert_problem(s.post(f"/v1/fires/{k[3]}/redrive"), 409)
    assert p["type"].endswith("not-dead") and "delivered" in p["detail"]
    p = assert_problem(s.post(f"/v1/fires/{k[5]}/redrive"), 409)
    assert p["type"].endswith("past-retention") and "90 days" in p["detail"]
    assert_problem(s.post("/v1/fires/not-a-key/redrive"), 404)
    _, other = api.tenant("other")
    assert_problem(other.post(f"/v1/fires/{k[1]}/redrive"), 404)      # another tenant's: reads as missing
    reader = Session(api, s.post("/v1/principals", json={"name": "r", "roles": ["reader"]}).json()["token"])
    assert reader.get("/v1/dead-letters").status_code == 200
    assert_problem(reader.post(f"/v1/fires/{k[1]}/redrive"), 403)
    assert api.snapshot()["fires"] == before


def test_bulk_redrive_counts_in_a_dry_run_and_redrives_what_the_filters_select(api: Api) -> None:
    w = _world(api)
    s, k = w["s"], w["keys"]
    body = {"cause": "retries exhausted", "dry_run": True}
    before = api.snapshot()
    dry = s.post("/v1/dead-letters/redrive", json=body)
    assert dry.status_code == 200, dry.text
    # Past retention (k[5]) is never selected; the 404 and the unknown fire do not match the cause.
    assert dry.json() == {"dry_run": True, "count": 2, "more": False, "keys": [k[0], k[4]]}
    assert api.snapshot() == before
    one = s.post("/v1/dead-letters/redrive", json={**body, "dry_run": False, "limit": 1})
    assert one.json() == {"dry_run": False, "count": 1, "more": True, "keys": [k[0]]}
    rest = s.post("/v1/dead-letters/redrive", json={"trigger_id": w["b"]})
    assert rest.json() == {"dry_run": False, "count": 1, "more": False, "keys": [k[4]]}
    assert [i["key"] for i in s.get("/v1/dead-letters").json()["items"]] == [k[5], k[1], k[2]]
    notes = [e for e in api.store.trust.audit_rows(tenant_id=w["tenant"]) if e.action == "fire.redrive"]
    assert [n.as_json()["new"]["fire_keys"] for n in notes] == [[k[0]], [k[4]]]
    assert_problem(s.post("/v1/dead-letters/redrive", json={"limit": 0}), 422, "limit")
    assert_problem(s.post("/v1/dead-letters/redrive", json={"state": "failed"}), 422, "state")
