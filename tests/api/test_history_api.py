"""History API over HTTP: ranges, states, order, tenant-wide listing, lateness distributions, and
bad input — on the real app over a real SQLite store (FakeClock: the timing plane is played by
committing decisions through the store's own claim path)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import SENTINEL, Api, assert_problem, us
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.recurrence import TZDATA_VERSION

HOUR = 3600 * 1_000_000
S = 1_000_000
FIRST = us("2026-03-27T13:00:00Z")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def decide(api: Api, tenant_id: str, trigger_id: str, states: list[FireState]) -> None:
    """Decide one hourly fire per entry of ``states`` (expired/skipped ones carry a cause)."""
    for state in states:
        row = next(d for d in api.store.timing.due_rows(2**62, 100) if d.trigger_id == trigger_id)
        cause = {FireState.EXPIRED: "expired: missed and older than the catch-up horizon (1h)",
                 FireState.SKIPPED: "skipped: missed; missed-fire policy is skip"}.get(state)
        kind = FireKind.SCHEDULED if cause is None else FireKind.CATCH_UP
        lane = Lane.ON_TIME if cause is None else Lane.CATCH_UP
        fire = NewFire(tenant_id, trigger_id, row.next_us, 0, row.version, kind, lane, state,
                       row.next_us + 1000, TZDATA_VERSION, "node-a", cause=cause)
        out = api.store.timing.apply_decisions([Decision(Advance(trigger_id, row.next_us, row.version,
                                                          row.next_us + HOUR, row.version), (fire,))])
        assert out[0].advanced


def deliver_each(api: Api, lateness_s: list[float]) -> None:
    """Dispatch the pending on-time fires one by one, oldest first, each ``lateness_s[i]`` late."""
    for i, late in enumerate(lateness_s):
        at = FIRST + i * HOUR + int(late * S)
        jobs = api.store.dispatch.claim_dispatch("on-time", at, 1, "runner-1", 30 * S)
        assert len(jobs) == 1 and jobs[0].fire.scheduled_us == FIRST + i * HOUR, (i, jobs)
        api.store.dispatch.settle_attempts([Settlement(jobs[0], "delivered", 200, None, "delivered", None, None)],
                                  at + 250_000)


@pytest.fixture
def world(api: Api) -> dict[str, Any]:
    tenant_id, s = api.tenant("acme")
    target = s.target()["id"]
    t1 = s.trigger(target, {"cron": "0 * * * *", "zone": "UTC"})
    t2 = s.trigger(target, {"cron": "0 * * * *", "zone": "UTC"}, name="second")
    decide(api, tenant_id, t1["id"], [FireState.PENDING] * 4 + [FireState.EXPIRED, FireState.SKIPPED])
    decide(api, tenant_id, t2["id"], [FireState.EXPIRED, FireState.SKIPPED])
    deliver_each(api, [0.02, 0.2, 3.0, 40.0])
    return {"tenant": tenant_id, "s": s, "t1": t1["id"], "t2": t2["id"]}


def test_trigger_history_filters_by_range_and_state_with_lateness(api: Api, world: dict[str, Any]) -> None:
    s, t1 = world["s"], world["t1"]
    items = s.get(f"/v1/triggers/{t1}/fires").json()["items"]
    assert [i["state"] for i in items] == ["delivered"] * 4 + ["expired", "skipped"]
    assert [i["lateness_s"] for i in items] == [0.02, 0.2, 3.0, 40.0, None, None]
    assert items[0]["attempts"][0]["duration_s"] == 0.25 and items[0]["attempts"][0]["http_status"] == 200
    # The original item fields are all still there.
    assert {"key", "scheduled_instant", "decided_at", "dispatched_at", "state", "cause", "kind", "lane",
            "version", "tzdata_version", "attempts"} <= set(items[0])
    r = s.get(f"/v1/triggers/{t1}/fires", params={"from": "2026-03-27T14:00:00Z", "to": "2026-03-27T16:00:00Z"})
    assert [i["scheduled_instant"] for i in r.json()["items"]] == ["2026-03-27T14:00:00Z", "2026-03-27T15:00:00Z"]
    r = s.get(f"/v1/triggers/{t1}/fires", params={"state": "expired,skipped"})
    got = r.json()["items"]
    assert [(i["state"], i["cause"]) for i in got] == [
        ("expired", "expired: missed and older than the catch-up horizon (1h)"),
        ("skipped", "skipped: missed; missed-fire policy is skip")]
    # Newest first, paged with the cursor, with the filters passed again.
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"order": "desc", "limit": 2, "state": "delivered"}
        if cursor:
            params["cursor"] = cursor
        page = s.get(f"/v1/triggers/{t1}/fires", params=params).json()
        seen += [i["scheduled_instant"] for i in page["items"]]
        cursor = page["next"]
        if not cursor:
            break
    assert seen == ["2026-03-27T16:00:00Z", "2026-03-27T15:00:00Z", "2026-03-27T14:00:00Z", "2026-03-27T13:00:00Z"]
    # One fire by key carries the same fields.
    one = s.get(f"/v1/fires/{items[2]['key']}").json()
    assert one["lateness_s"] == 3.0 and one["attempts"][0]["duration_s"] == 0.25


def test_tenant_history_across_triggers_and_isolated(api: Api, world: dict[str, Any]) -> None:
    s, t1, t2 = world["s"], world["t1"], world["t2"]
    items = s.get("/v1/fires", params={"limit": 1000}).json()["items"]
    assert {i["trigger_id"] for i in items} == {t1, t2} and len(items) == 8
    assert [i["scheduled_instant"] for i in items] == sorted(i["scheduled_instant"] for i in items)
    expired = s.get("/v1/fires", params={"state": "expired"}).json()["items"]
    assert sorted(i["trigger_id"] for i in expired) == sorted([t1, t2])
    only_t2 = s.get("/v1/fires", params={"trigger_id": t2}).json()["items"]
    assert {i["trigger_id"] for i in only_t2} == {t2} and len(only_t2) == 2
    # Paging across triggers visits every fire once.
    keys, cursor = [], None
    while True:
        page = s.get("/v1/fires", params={"limit": 3, **({"cursor": cursor} if cursor else {})}).json()
        keys += [i["key"] for i in page["items"]]
        cursor = page["next"]
        if not cursor:
            break
    assert sorted(keys) == sorted(i["key"] for i in items)
    # Another tenant sees none of it, and naming the trigger is a 404, not an empty page.
    _, other = api.tenant("other")
    assert other.get("/v1/fires").json()["items"] == []
    assert_problem(other.get("/v1/fires", params={"trigger_id": t1}), 404)
    assert_problem(other.get(f"/v1/triggers/{t1}/fires", params={"state": "expired"}), 404)
    assert_problem(other.get(f"/v1/triggers/{t1}/lateness"), 404)


def test_lateness_distribution_percentiles_and_histogram(api: Api, world: dict[str, Any]) -> None:
    s, t1 = world["s"], world["t1"]
    r = s.get(f"/v1/triggers/{t1}/lateness", params={"from": "2026-03-27T00:00:00Z", "to": "2026-03-28T00:00:00Z"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == 4 and body["sampled"] is False
    assert (body["p50_s"], body["p90_s"], body["p99_s"], body["max_s"]) == (0.2, 40.0, 40.0, 40.0)
    hist = {b["le"]: b["count"] for b in body["histogram"]}
    assert hist[0.025] == 1 and hist[0.25] == 1 and hist[5] == 1 and hist[60] == 1
    assert sum(hist.values()) == 4 and hist[None] == 0
    assert body["states"] == {"delivered": 4, "expired": 1, "skipped": 1}
    assert (body["from"], body["to"]) == ("2026-03-27T00:00:00Z", "2026-03-28T00:00:00Z")
    # A window with nothing dispatched has no percentiles, not zeros.
    empty = s.get(f"/v1/triggers/{t1}/lateness", params={"from": "2026-01-01T00:00:00Z",
                                                         "to": "2026-01-02T00:00:00Z"}).json()
    assert empty["count"] == 0 and empty["p99_s"] is None and empty["max_s"] is None


@pytest.mark.parametrize(("params", "field"), [
    ({"from": "yesterday"}, "from"), ({"to": "2026-03-27T14:00:00"}, "to"),
    ({"from": "2026-03-27T14:00:00Z", "to": "2026-03-27T13:00:00Z"}, "to"),
    ({"state": "exploded"}, "state"), ({"state": "delivered,"}, "state"), ({"order": "sideways"}, "order"),
    ({"limit": "0"}, "limit"), ({"cursor": "Zzo"}, "cursor"),
])
def test_bad_history_input_names_the_field(api: Api, world: dict[str, Any], params: dict[str, str],
                                           field: str) -> None:
    s, t1 = world["s"], world["t1"]
    for path in (f"/v1/triggers/{t1}/fires", "/v1/fires"):
        body = assert_problem(s.get(path, params=params), 422, field)
        for value in params.values():
            if len(value) > 3 and field != "state":   # state's problem lists the valid states
                assert value not in body["detail"]
    if field in ("from", "to"):
        assert_problem(s.get(f"/v1/triggers/{t1}/lateness", params=params), 422, field)


def test_history_never_carries_the_payload(api: Api, world: dict[str, Any]) -> None:
    s, t1 = world["s"], world["t1"]
    for path in (f"/v1/triggers/{t1}/fires", "/v1/fires", f"/v1/triggers/{t1}/lateness"):
        r = s.get(path)
        assert r.status_code == 200 and SENTINEL not in r.text and "payload" not in r.text
    schema = api.http.get("/openapi.json").text
    assert "lateness_s" in schema and "/v1/triggers/{trigger_id}/lateness" in schema


def test_lateness_default_window_start_stays_inside_the_calendar(api: Api, world: dict[str, Any]) -> None:
    """`to` early in year 1 with the default 24 h start: an answer (the window clamped), not a 500."""
    s, t1 = world["s"], world["t1"]
    r = s.get(f"/v1/triggers/{t1}/lateness", params={"to": "0001-01-01T00:30:00Z"})
    assert r.status_code == 200, r.text
    assert (r.json()["from"], r.json()["count"]) == ("0001-01-01T00:00:00Z", 0)
