"""Bad input at every API boundary (DESIGN.md §5): a problem+json naming the field and the
problem, never a stack trace, never the payload — and the store exactly as it was."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import SENTINEL, Api, Session, assert_problem
from fireledger.control.app import MAX_BODY_BYTES


# One store and app for the module: every test compares its own before/after snapshot, and a refused
# request must leave the store exactly as it was, so sharing loses no isolation between checks.
@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    a = Api(tmp_path_factory.mktemp("bad-input"))
    yield a
    a.assert_no_sentinel()
    a.close()


@pytest.fixture(scope="module")
def world(api: Api) -> tuple[Api, Session, dict[str, Any], dict[str, Any]]:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"])
    return api, s, tg, t


def _good(target: str, /, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "n", "schedule": {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"},
                            "target_id": target, "payload": {"secret": SENTINEL}}
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


# (overrides of a good body, field the problem must name)
BAD_TRIGGER_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"schedule": {"cron": "61 9 * * *", "zone": "UTC"}}, "schedule.cron"),
    ({"schedule": {"cron": "0 9 * *", "zone": "UTC"}}, "schedule.cron"),
    ({"schedule": {"cron": "0 9 * * MON-XYZ", "zone": "UTC"}}, "schedule.cron"),
    ({"schedule": {"cron": "0 0 30 2 *", "zone": "UTC"}}, "schedule.cron"),
    ({"schedule": {"cron": "", "zone": "UTC"}}, "schedule.cron"),
    ({"schedule": {"cron": 5}}, "schedule.cron"),
    ({"schedule": {"cron": "0 0 9 1 1 ? 2300", "zone": "UTC"}}, "schedule.cron"),   # year out of range
    ({"schedule": {"cron": "0 9 W * ?", "zone": "UTC"}}, "schedule.cron"),          # W without a day
    ({"schedule": {"cron": "0 9 ? * ?", "zone": "UTC"}}, "schedule.cron"),          # ? in both day fields
    ({"schedule": {"cron": "0 0 9 29 2 ? 2100", "zone": "UTC"}}, "schedule.cron"),  # no 29 Feb in 2100
    ({"schedule": {"cron": "0 9 * * *", "zone": "Europe/Atlantis"}}, "schedule.zone"),
    ({"schedule": {"cron": "0 9 * * *", "zone": ["UTC"]}}, "schedule.zone"),
    ({"schedule": {"cron": "0 9 * * *", "every": "1m"}}, "schedule"),
    ({"schedule": {}}, "schedule"),
    ({"schedule": {"cron": "0 9 * * *", "tz": "UTC"}}, "schedule.tz"),
    ({"schedule": {"cron": "0 9 * * *", "anchor": "2026-01-01T00:00:00Z"}}, "schedule.anchor"),
    ({"schedule": {"every": "0s"}}, "schedule.every"),
    ({"schedule": {"every": "soon"}}, "schedule.every"),
    ({"schedule": {"every": "1500ms"}}, "schedule.every"),
    ({"schedule": {"at": "2020-01-01T00:00:00Z"}}, "schedule.at"),
    ({"schedule": {"at": "tomorrow"}}, "schedule.at"),
    ({"schedule": {"at": "2027-01-01T00:00:00"}}, "schedule.at"),
    ({"schedule": {"every": "1m", "not_after": "2020-01-01T00:00:00Z"}}, "schedule.not_after"),
    ({"schedule": {"every": "1m", "not_before": "2027-01-02T00:00:00Z",
                   "not_after": "2027-01-01T00:00:00Z"}}, "schedule.not_after"),
    ({"schedule": "0 9 * * *"}, "schedule"),
    ({"schedule": ...}, "schedule"),
    ({"catchup_horizon": "25h"}, "catchup_horizon"),
    ({"catchup_horizon": "1 hour"}, "catchup_horizon"),
    ({"catchup_horizon": 3600}, "catchup_horizon"),
    ({"outcome_window": "0s"}, "outcome_window"),
    ({"outcome_window": "8d"}, "outcome_window"),
    ({"jitter": "2h"}, "jitter"),
    ({"jitter": "1500ms"}, "jitter"),
    ({"timeout": "16m"}, "timeout"),
    ({"timeout": "500ms"}, "timeout"),
    ({"timeout": None}, "timeout"),
    ({"missed_fire_policy": "sometimes"}, "missed_fire_policy"),
    ({"overlap_policy": "never"}, "overlap_policy"),
    ({"overlap_policy": 1}, "overlap_policy"),
    ({"name": ...}, "name"),
    ({"name": ""}, "name"),
    ({"name": "   "}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"name": 42}, "name"),
    ({"name": "bell\x07"}, "name"),
    ({"target_id": ...}, "target_id"),
    ({"target_id": "tg_doesnotexist0000"}, "target_id"),
    ({"target_id": 7}, "target_id"),
    ({"payload": [SENTINEL]}, "payload"),
    ({"payload": SENTINEL}, "payload"),
    ({"payload": {"blob": SENTINEL + "x" * (64 * 1024)}}, "payload"),
    ({"colour": "blue"}, "colour"),
    ({"run_now": True}, "run_now"),
]


@pytest.mark.parametrize(("over", "field"), BAD_TRIGGER_FIELDS,
                         ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD_TRIGGER_FIELDS)])
def test_bad_trigger_create(world: Any, over: dict[str, Any], field: str) -> None:
    api, s, tg, _ = world
    before, changes = api.snapshot(), api.changes
    r = s.post("/v1/triggers", json=_good(tg["id"], **over))
    problem = assert_problem(r, 422, field)
    assert problem["detail"].startswith(problem["errors"][0]["field"] + ": ")
    assert SENTINEL not in r.text
    assert api.snapshot() == before and api.changes == changes


def test_several_problems_are_reported_together(world: Any) -> None:
    api, s, _, _ = world
    r = s.post("/v1/triggers", json=_good("tg_nope", schedule={"cron": "0 25 * * *", "zone": "UTC"},
                                          jitter="2h", timeout="1h"))
    problem = assert_problem(r, 422)
    assert {e["field"] for e in problem["errors"]} == {"schedule.cron", "target_id", "jitter", "timeout"}
    cron = next(e for e in problem["errors"] if e["field"] == "schedule.cron")
    assert cron["problem"].startswith("hour:") and "0-23" in cron["problem"]


@pytest.mark.parametrize(("over", "field"), [
    ({"schedule": {"cron": "61 * * * *"}}, "schedule.cron"),
    ({"schedule": {"at": "2020-01-01T00:00:00Z"}}, "schedule.at"),
    ({"schedule": {"every": "1m", "zone": "Mars/Olympus"}}, "schedule.zone"),
    ({"jitter": "forever"}, "jitter"),
    ({"catchup_horizon": "48h"}, "catchup_horizon"),
    ({"target_id": "tg_nope"}, "target_id"),
    ({"payload": {"blob": SENTINEL * 5000}}, "payload"),
    ({"name": None}, "name"),
    ({"schedule": None}, "schedule"),
    ({"payload": None}, "payload"),
    ({"state": "paused"}, "state"),
    ({"version": 7}, "version"),
    ({}, "body"),
])
def test_bad_trigger_amend(world: Any, over: dict[str, Any], field: str) -> None:
    api, s, _, t = world
    before, changes = api.snapshot(), api.changes
    r = s.patch(f"/v1/triggers/{t['id']}", json=over)
    assert_problem(r, 422, field)
    assert SENTINEL not in r.text
    assert api.snapshot() == before and api.changes == changes
    assert s.get(f"/v1/triggers/{t['id']}").json() == t


def test_malformed_json_is_400(world: Any) -> None:
    api, s, _, t = world
    before = api.snapshot()
    for path, method in (("/v1/triggers", "POST"), (f"/v1/triggers/{t['id']}", "PATCH"), ("/v1/targets", "POST")):
        r = s.request(method, path, content=b'{"name": "x", "payload": {"k": "' + SENTINEL.encode() + b'"',
                      headers={"content-type": "application/json"})
        problem = assert_problem(r, 400, "body")
        assert "JSON" in problem["detail"]
        assert SENTINEL not in r.text
    assert api.snapshot() == before


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"a string"', b"42", b"null"])
def test_body_must_be_an_object(world: Any, raw: bytes) -> None:
    api, s, _, _ = world
    before = api.snapshot()
    r = s.post("/v1/triggers", content=raw, headers={"content-type": "application/json"})
    assert_problem(r, 422, "body")
    assert api.snapshot() == before


def test_nan_in_payload_is_refused(world: Any) -> None:
    api, s, tg, _ = world
    before = api.snapshot()
    raw = json.dumps(_good(tg["id"])).replace('"secret": "' + SENTINEL + '"', '"x": NaN, "s": "' + SENTINEL + '"')
    r = s.post("/v1/triggers", content=raw.encode(), headers={"content-type": "application/json"})
    assert_problem(r, 422, "payload")
    assert api.snapshot() == before


def test_non_json_content_type_is_415(world: Any) -> None:
    api, s, tg, _ = world
    before = api.snapshot()
    r = s.post("/v1/triggers", content=json.dumps(_good(tg["id"])).encode(), headers={"content-type": "text/plain"})
    assert_problem(r, 415)
    r = s.post("/v1/triggers", content=json.dumps(_good(tg["id"])).encode(),
               headers={"content-type": "application/x-www-form-urlencoded"})
    assert_problem(r, 415)
    assert api.snapshot() == before
    # A JSON subtype with parameters is fine.
    r = s.post("/v1/triggers", content=json.dumps(_good(tg["id"])).encode(),
               headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 201, r.text


def test_oversized_body_is_413(world: Any) -> None:
    api, s, tg, _ = world
    before = api.snapshot()
    big = json.dumps(_good(tg["id"], payload={"blob": SENTINEL + "x" * MAX_BODY_BYTES})).encode()
    assert_problem(s.post("/v1/triggers", content=big, headers={"content-type": "application/json"}), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    assert_problem(s.post("/v1/triggers", content=chunks(), headers={"content-type": "application/json"}), 413)
    assert api.snapshot() == before


@pytest.mark.parametrize("path", ["/v1/triggers", "/v1/targets", "{trigger}/fires"])
@pytest.mark.parametrize(("params", "field"), [
    ({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"limit": "ten"}, "limit"), ({"limit": -1}, "limit"),
    ({"cursor": "!!!"}, "cursor"), ({"cursor": "bm9wZQ"}, "cursor"), ({"cursor": "x" * 301}, "cursor"),
    ({"cursor": "Zjox"}, "cursor"), ({"cursor": "aTo"}, "cursor"), ({"cursor": ""}, "cursor"),
])
def test_bad_list_parameters(world: Any, path: str, params: dict[str, Any], field: str) -> None:
    _, s, _, t = world
    r = s.get(path.replace("{trigger}", f"/v1/triggers/{t['id']}"), params=params)
    assert_problem(r, 422, field)


def test_cursor_of_one_list_is_refused_by_another(world: Any) -> None:
    _, s, tg, t = world
    s.target("https://second.example.com/")
    c = s.get("/v1/targets", params={"limit": 1}).json()["next"]
    assert c
    assert_problem(s.get(f"/v1/triggers/{t['id']}/fires", params={"cursor": c}), 422, "cursor")


@pytest.mark.parametrize(("count", "status"), [(0, 422), (1001, 422), ("many", 422), (-3, 422)])
def test_bad_preview_count(world: Any, count: Any, status: int) -> None:
    _, s, _, t = world
    assert_problem(s.get(f"/v1/triggers/{t['id']}/preview", params={"count": count}), status, "count")


def test_unknown_route_and_wrong_method_are_problems(world: Any) -> None:
    api, s, _, t = world
    assert_problem(s.get("/v1/nope"), 404)
    assert_problem(api.anon.get("/nope"), 404)
    assert_problem(s.get(f"/v1/triggers/{t['id']}/nope"), 404)
    r = s.request("PUT", f"/v1/triggers/{t['id']}", json={})
    assert_problem(r, 405)
    assert "PATCH" in r.headers["allow"]
    assert_problem(s.delete("/v1/triggers"), 405)
    assert_problem(s.get(f"/v1/triggers/{t['id']}/pause"), 405)


def test_unexpected_failure_is_a_generic_500(world: Any, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    api, s, _, _ = world

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError(f"database exploded near {SENTINEL}")

    monkeypatch.setattr(api.store.registry, "list_triggers", boom)
    with caplog.at_level(logging.ERROR, logger="fireledger.control"):
        r = s.get("/v1/triggers")
    problem = assert_problem(r, 500)
    assert "exploded" not in r.text and SENTINEL not in r.text and "RuntimeError" not in r.text
    assert problem["detail"] == "an internal error occurred; it has been logged"
    assert "RuntimeError" in caplog.text and SENTINEL not in caplog.text


def test_failing_change_hook_does_not_fail_the_request(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from fireledger.control import create_app

    api = Api(tmp_path)
    try:
        def hook() -> None:
            raise RuntimeError("timing loop gone")

        app = create_app(api.store, api.clock, on_definition_change=hook)
        _, s = api.tenant("acme")
        tg = s.target()
        with TestClient(app, raise_server_exceptions=False) as c:
            r = c.post("/v1/triggers", json=_good(tg["id"]), headers={"Authorization": f"Bearer {s.token}"})
        assert r.status_code == 201, r.text
    finally:
        api.close()


def test_openapi_describes_v1(api: Api) -> None:
    r = api.anon.get("/openapi.json")
    assert r.status_code == 200
    doc = json.loads(r.text)
    assert doc["info"]["title"] == "fireledger"
    paths = set(doc["paths"])
    assert {"/v1/targets", "/v1/targets/{target_id}", "/v1/triggers", "/v1/triggers/{trigger_id}",
            "/v1/triggers/{trigger_id}/pause", "/v1/triggers/{trigger_id}/resume",
            "/v1/triggers/{trigger_id}/preview", "/v1/triggers/{trigger_id}/fires",
            "/v1/fires/{key}", "/healthz"} <= paths
    assert all(p.startswith("/v1/") or p == "/healthz" for p in paths)
    assert "/v1/triggers/{trigger_id}/run" in paths and set(doc["paths"]["/v1/triggers/{trigger_id}/run"]) == {"post"}
    assert set(doc["paths"]["/v1/triggers/{trigger_id}"]) == {"get", "patch", "delete"}
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
