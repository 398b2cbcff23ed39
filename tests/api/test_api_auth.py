"""Authentication, roles and tenant isolation (invariants 13 and 15)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import T0, Api, Session, assert_problem
from fireledger.control.auth import hash_token, new_token
from fireledger.domain.keys import FireKey, new_id
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Principal


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    a = Api(tmp_path_factory.mktemp("auth"))
    a.tenant("acme")
    yield a
    a.assert_no_sentinel()
    a.close()


ENDPOINTS = [
    ("GET", "/v1/triggers"),
    ("POST", "/v1/triggers"),
    ("GET", "/v1/triggers/tr_0000000000000000"),
    ("PATCH", "/v1/triggers/tr_0000000000000000"),
    ("DELETE", "/v1/triggers/tr_0000000000000000"),
    ("POST", "/v1/triggers/tr_0000000000000000/pause"),
    ("POST", "/v1/triggers/tr_0000000000000000/resume"),
    ("GET", "/v1/triggers/tr_0000000000000000/preview"),
    ("GET", "/v1/triggers/tr_0000000000000000/fires"),
    ("GET", "/v1/fires/tn_x.tr_y.20260101T000000Z.0"),
    ("GET", "/v1/targets"),
    ("POST", "/v1/targets"),
    ("GET", "/v1/targets/tg_0000000000000000"),
    ("DELETE", "/v1/targets/tg_0000000000000000"),
    ("GET", "/v1/no-such-route"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_no_token_is_401_everywhere(shared: Api, method: str, path: str) -> None:
    before = shared.snapshot()
    r = shared.anon.request(method, path, json={"name": "x"})
    body = assert_problem(r, 401)
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert body["type"].endswith("unauthorized")
    assert shared.snapshot() == before


@pytest.mark.parametrize("header", [
    "Bearer fl_not-a-real-token",
    "Bearer ",
    "Basic dXNlcjpwYXNz",
    "fl_token-without-scheme",
    "Bearer two words",
])
def test_bad_token_is_401(shared: Api, header: str) -> None:
    api = shared
    assert_problem(api.anon.get("/v1/triggers", headers={"Authorization": header}), 401)
    assert_problem(api.anon.post("/v1/targets", headers={"Authorization": header},
                                 json={"kind": "http", "url": "https://a.example.com"}), 401)


def test_authentication_comes_before_body_parsing(api: Api) -> None:
    """An unauthenticated client learns nothing: not whether its JSON parses, nor the routes."""
    r = api.anon.post("/v1/triggers", content=b"{not json", headers={"content-type": "application/json"})
    assert_problem(r, 401)
    assert_problem(api.anon.get("/v1/secret-admin-route"), 401)


def test_healthz_and_openapi_need_no_token(api: Api) -> None:
    assert api.anon.get("/healthz").json() == {"status": "ok"}
    assert api.anon.get("/openapi.json").status_code == 200


def _principal(api: Api, tenant_id: str, roles: set[str]) -> Session:
    token = new_token()
    api.store.trust.create_principal(Principal(new_id("pr"), tenant_id, "limited", frozenset(roles), T0),
                               hash_token(token))
    return Session(api, token)


def test_roles_are_checked_per_endpoint(api: Api) -> None:
    tenant_id, owner = api.tenant("acme")
    tg = owner.target()
    t = owner.trigger(tg["id"])
    reader = _principal(api, tenant_id, {"reader"})
    assert reader.get(f"/v1/triggers/{t['id']}").status_code == 200
    assert reader.get("/v1/targets").status_code == 200
    author = _principal(api, tenant_id, {"author", "reader"})
    before = api.snapshot()
    assert_problem(reader.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1m"},
                                                     "target_id": tg["id"]}), 403)
    assert_problem(reader.patch(f"/v1/triggers/{t['id']}", json={"name": "y"}), 403)
    assert_problem(reader.post(f"/v1/triggers/{t['id']}/pause"), 403)
    assert_problem(reader.delete(f"/v1/triggers/{t['id']}"), 403)
    assert_problem(reader.post("/v1/targets", json={"kind": "http", "url": "https://b.example.com"}), 403)
    assert_problem(reader.delete(f"/v1/targets/{tg['id']}"), 403)
    # An author without the policy role may define triggers but not set policy fields.
    assert_problem(author.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1m"},
                                                     "target_id": tg["id"], "catchup_horizon": "24h"}), 403)
    assert_problem(author.patch(f"/v1/triggers/{t['id']}", json={"missed_fire_policy": "skip"}), 403)
    assert api.snapshot() == before
    assert author.patch(f"/v1/triggers/{t['id']}", json={"jitter": "1s"}).status_code == 200
    r = author.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1m"}, "target_id": tg["id"]})
    assert r.status_code == 201, r.text
    # No role at all: authenticated, but nothing is allowed.
    nobody = _principal(api, tenant_id, set())
    assert_problem(nobody.get("/v1/triggers"), 403)


def test_tenants_are_isolated(api: Api) -> None:
    a_id, a = api.tenant("tenant-a")
    _, b = api.tenant("tenant-b")
    tg = a.target()
    t = a.trigger(tg["id"], {"cron": "0 * * * *", "zone": "UTC"})
    due = api.store.timing.due_rows(2**62, 1)[0]
    fire = NewFire(a_id, t["id"], due.next_us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                   T0, "2026f", "node-test")
    api.store.timing.apply_decisions([Decision(Advance(t["id"], due.next_us, 1, due.next_us + 3600_000_000, 1),
                                        (fire,))])
    key = str(FireKey(a_id, t["id"], due.next_us, 0))
    assert a.get(f"/v1/fires/{key}").status_code == 200
    before = api.snapshot()

    tid = t["id"]
    for method, path, body in [
        ("GET", f"/v1/triggers/{tid}", None),
        ("PATCH", f"/v1/triggers/{tid}", {"name": "stolen"}),
        ("DELETE", f"/v1/triggers/{tid}", None),
        ("POST", f"/v1/triggers/{tid}/pause", None),
        ("POST", f"/v1/triggers/{tid}/resume", None),
        ("GET", f"/v1/triggers/{tid}/preview", None),
        ("GET", f"/v1/triggers/{tid}/fires", None),
        ("GET", f"/v1/fires/{key}", None),
        ("GET", f"/v1/targets/{tg['id']}", None),
        ("DELETE", f"/v1/targets/{tg['id']}", None),
    ]:
        r = b.request(method, path, json=body) if body is not None else b.request(method, path)
        problem = assert_problem(r, 404)
        assert tid not in problem["detail"] and tg["id"] not in problem["detail"]
    assert b.get("/v1/triggers").json() == {"items": [], "next": None}
    assert b.get("/v1/targets").json() == {"items": [], "next": None}
    # B cannot point a trigger at A's target.
    assert_problem(b.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1m"},
                                                "target_id": tg["id"]}), 422, "target_id")
    assert api.snapshot() == before
    # A still sees everything.
    assert a.get(f"/v1/triggers/{tid}").json()["name"] == t["name"]
    assert len(a.get(f"/v1/triggers/{tid}/fires").json()["items"]) == 1
