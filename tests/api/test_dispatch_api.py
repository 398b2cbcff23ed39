"""Dispatch-plane surfaces of the control API: target kinds (http, queue, internal), queue pull/ack
with a visibility timeout, and signed outcome callbacks inside a replay window."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import SENTINEL, Api, Session, assert_problem
from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.dispatch.signing import build_headers
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey

S = 1_000_000
WIDE = Capacity(100, {"on-time": 100, "catch-up": 100, "backfill": 100}, 100)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


def deliver_all(api: Api, *, result: str = "delivered") -> list[str]:
    """Play the timing and dispatch planes through the store: decide every due instant, claim it and
    settle its attempt. Returns the fire keys."""
    from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire

    now = api.clock.now().latest_us
    for row in api.store.timing.due_rows(now, 100):
        f = NewFire(row.tenant_id, row.trigger_id, row.next_us, 0, row.version, FireKind.SCHEDULED, Lane.ON_TIME,
                    FireState.PENDING, now, "2026f", "t")
        api.store.timing.apply_decisions([Decision(Advance(row.trigger_id, row.next_us, row.version, None, row.version),
                                            (f,))])
    res = api.store.dispatch.claim_shaped(now, "d", {"on-time": 100}, _Shaper(DispatchConfig(), WIDE), 5 * S)
    items = [Settlement(c.job, result, None, None, result, None, None) for c in res.jobs]
    assert all(api.store.dispatch.settle_dispatch(items, now))
    return [str(FireKey(c.job.fire.tenant_id, c.job.fire.trigger_id, c.job.fire.scheduled_us, 0)) for c in res.jobs]


def one_shot(s: Session, target_id: str, api: Api, ahead_s: int = 60) -> dict[str, Any]:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    at = format_instant(from_us((api.clock.now().latest_us // S + ahead_s) * S))
    return s.trigger(target_id, {"at": at})


# --- target kinds -------------------------------------------------------------------------------


def test_queue_and_internal_targets_are_created_and_bad_kinds_refused(api: Api) -> None:
    _, s = api.tenant("acme")
    q = s.post("/v1/targets", json={"kind": "queue"})
    assert q.status_code == 201, q.text
    assert q.json()["kind"] == "queue" and q.json()["url"] is None and q.json()["secret"].startswith("whsec_")
    assert q.json()["verification"]["state"] == "verified"
    i = s.post("/v1/targets", json={"kind": "internal", "name": "billing.close_day"})
    assert i.status_code == 201 and i.json()["url"] == "internal:billing.close_day"
    before = api.snapshot()
    assert_problem(s.post("/v1/targets", json={"kind": "smtp", "url": "https://x.example"}), 422, "kind")
    assert_problem(s.post("/v1/targets", json={"kind": "internal"}), 422, "name")
    assert_problem(s.post("/v1/targets", json={"kind": "internal", "name": "no spaces"}), 422, "name")
    assert_problem(s.post("/v1/targets", json={"kind": "internal", "name": "x", "url": "https://a.example"}),
                   422, "url")
    assert_problem(s.post("/v1/targets", json={"kind": "queue", "url": "https://a.example"}), 422, "url")
    assert_problem(s.post("/v1/targets", json={"kind": "queue", "name": "x"}), 422, "name")
    assert_problem(s.post("/v1/targets", json={"kind": "http", "url": "https://a.example", "name": "x"}),
                   422, "name")
    assert api.snapshot() == before
    # A trigger may point at a queue target at once (nothing to verify).
    t = one_shot(s, q.json()["id"], api)
    assert t["target_id"] == q.json()["id"]


# --- queues -------------------------------------------------------------------------------------


def test_queue_pull_ack_visibility_and_isolation(api: Api) -> None:
    _, s = api.tenant("acme")
    qid = s.post("/v1/targets", json={"kind": "queue"}).json()["id"]
    for _ in range(3):
        one_shot(s, qid, api)
    api.clock.advance(61 * S)
    keys = deliver_all(api)
    assert len(keys) == 3
    st = s.get(f"/v1/queues/{qid}").json()
    assert st["messages"] == 3 and st["visible"] == 3 and st["oldest_scheduled_instant"].endswith("Z")
    r = s.post(f"/v1/queues/{qid}/pull", json={"max": 2, "visibility_timeout": "10s"})
    assert r.status_code == 200, r.text
    msgs = r.json()["messages"]
    assert len(msgs) == 2 and msgs[0]["receives"] == 1
    body = msgs[0]["body"]
    assert body["payload"] == {"secret": SENTINEL} and body["fire_key"] == msgs[0]["fire_key"]
    assert {"trigger_id", "scheduled_instant", "attempt", "lane", "kind", "version"} <= set(body)
    assert body["lane"] == "on-time" and body["attempt"] == 1
    assert len(s.post(f"/v1/queues/{qid}/pull", json={}).json()["messages"]) == 1
    assert s.post(f"/v1/queues/{qid}/pull", json={}).json()["messages"] == []
    acked = s.post(f"/v1/queues/{qid}/ack", json={"fire_keys": [msgs[0]["fire_key"]]}).json()
    assert acked == {"acked": [msgs[0]["fire_key"]], "not_found": []}
    # Not acked within its visibility timeout: handed out again, under the same fire key.
    api.clock.advance(11 * S)
    again = s.post(f"/v1/queues/{qid}/pull", json={"max": 10}).json()["messages"]
    assert [m["fire_key"] for m in again] == [msgs[1]["fire_key"]] and again[0]["receives"] == 2
    # Another tenant sees no such queue; a non-queue target is not a queue.
    _, other = api.tenant("other")
    assert_problem(other.post(f"/v1/queues/{qid}/pull", json={}), 404)
    assert_problem(other.post(f"/v1/queues/{qid}/ack", json={"fire_keys": [msgs[1]["fire_key"]]}), 404)
    assert_problem(other.get(f"/v1/queues/{qid}"), 404)
    http_target = s.target()["id"]
    assert_problem(s.post(f"/v1/queues/{http_target}/pull", json={}), 404)
    # Bad input names the field.
    assert_problem(s.post(f"/v1/queues/{qid}/pull", json={"max": 0}), 422, "max")
    assert_problem(s.post(f"/v1/queues/{qid}/pull", json={"visibility_timeout": "13h"}), 422, "visibility_timeout")
    assert_problem(s.post(f"/v1/queues/{qid}/ack", json={"fire_keys": ["nope"]}), 422, "fire_keys.0")
    assert_problem(s.post(f"/v1/queues/{qid}/ack", json={"fire_keys": []}), 422, "fire_keys")
    assert_problem(api.anon.post(f"/v1/queues/{qid}/pull", json={}), 401)


# --- outcomes -----------------------------------------------------------------------------------


def signed(secret: str, body: dict[str, Any] | bytes, ts: int, msg_id: str = "msg_1", *,
           key: str | None = None) -> tuple[bytes, dict[str, str]]:
    """A signed callback; a dict body gets ``fire_key`` = ``key`` first (the binding every callback needs)."""
    raw = body if isinstance(body, bytes) else json.dumps({**({"fire_key": key} if key else {}), **body}).encode()
    return raw, {**build_headers(secret, msg_id, ts, raw), "content-type": "application/json"}


def test_signed_outcome_callbacks(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    created = s.post("/v1/targets", json={"kind": "queue"}).json()
    secret = created["secret"]
    one_shot(s, created["id"], api)
    one_shot(s, created["id"], api, ahead_s=120)
    api.clock.advance(61 * S)
    [key] = deliver_all(api)
    now_s = api.clock.now().latest_us // S
    path = f"/v1/fires/{key}/outcome"
    assert s.get(path).json() == {"key": key, "outcome": "unknown", "reported_at": None}

    raw, h = signed(secret, {"outcome": "succeeded"}, now_s, key=key)
    r = api.anon.post(path, content=raw, headers=h)          # no bearer token: the signature is the auth
    assert r.status_code == 201, r.text
    assert r.json()["outcome"] == "succeeded" and r.json()["reported_at"].endswith("Z")
    assert s.get(path).json()["outcome"] == "succeeded"
    # The very same request again: a replay, refused.
    assert_problem(api.anon.post(path, content=raw, headers=h), 409)
    # The same outcome under a new id: harmless, 200. A different outcome: 409 (the first is final).
    raw2, h2 = signed(secret, {"outcome": "succeeded"}, now_s, "msg_2", key=key)
    assert api.anon.post(path, content=raw2, headers=h2).status_code == 200
    raw3, h3 = signed(secret, {"outcome": "failed"}, now_s, "msg_3", key=key)
    assert "already recorded" in assert_problem(api.anon.post(path, content=raw3, headers=h3), 409)["detail"]

    # Stale or future timestamps, a wrong secret, a swapped body, no signature: 401.
    for ts in (now_s - 301, now_s + 301):
        raw, h = signed(secret, {"outcome": "failed"}, ts, f"msg_t{ts}", key=key)
        assert_problem(api.anon.post(path, content=raw, headers=h), 401)
    other_secret = s.post("/v1/targets", json={"kind": "queue"}).json()["secret"]
    raw, h = signed(other_secret, {"outcome": "failed"}, now_s, "msg_x", key=key)
    assert_problem(api.anon.post(path, content=raw, headers=h), 401)
    raw, h = signed(secret, {"outcome": "succeeded"}, now_s, "msg_y", key=key)
    assert_problem(api.anon.post(path, content=b'{"outcome": "failed"}', headers=h), 401)
    assert_problem(api.anon.post(path, json={"outcome": "failed"}), 401)

    # Bad bodies (correctly signed) name the field; nothing is recorded.
    raw, h = signed(secret, {"outcome": "maybe"}, now_s, "msg_b1", key=key)
    assert_problem(api.anon.post(path, content=raw, headers=h), 422, "outcome")
    raw, h = signed(secret, {"outcome": "failed", "extra": 1}, now_s, "msg_b2", key=key)
    assert_problem(api.anon.post(path, content=raw, headers=h), 422, "extra")
    raw, h = signed(secret, b"not json", now_s, "msg_b3")
    assert_problem(api.anon.post(path, content=raw, headers=h), 400, "body")
    raw, h = signed(secret, b"x" * (65 * 1024), now_s, "msg_b4")
    assert_problem(api.anon.post(path, content=raw, headers=h), 413)
    assert s.get(path).json()["outcome"] == "succeeded"

    # Unknown fires, malformed keys, another tenant's fire: 404 (and GET is tenant-isolated).
    assert_problem(api.anon.post("/v1/fires/nope/outcome", content=raw2, headers=h2), 404)
    fk = FireKey.parse(key)
    ghost = str(FireKey(fk.tenant_id, fk.trigger_id, fk.scheduled_us + 1, 0))
    assert_problem(api.anon.post(f"/v1/fires/{ghost}/outcome", content=raw2, headers=h2), 404)
    _, other = api.tenant("other")
    assert_problem(other.get(path), 404)
    assert_problem(api.anon.get(path), 401)             # reading needs a token
    assert fk.tenant_id == tenant_id


def test_outcome_for_a_fire_not_dispatched_is_refused(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    created = s.post("/v1/targets", json={"kind": "queue"}).json()
    t = one_shot(s, created["id"], api)
    from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire

    row = api.store.timing.due_rows(2**62, 10)[0]
    f = NewFire(tenant_id, t["id"], row.next_us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                row.next_us, "2026f", "t")
    api.store.timing.apply_decisions([Decision(Advance(t["id"], row.next_us, 1, None, 1), (f,))])
    key = str(FireKey(tenant_id, t["id"], row.next_us, 0))
    raw, h = signed(created["secret"], {"outcome": "succeeded"}, api.clock.now().latest_us // S, key=key)
    assert "never dispatched" in assert_problem(api.anon.post(f"/v1/fires/{key}/outcome", content=raw,
                                                              headers=h), 409)["detail"]
    assert api.store.dispatch.get_outcome(FireKey.parse(key)) is None
