"""Separate grants (invariant 13, seed ADR-15): each role can do exactly what it should, every refusal
is a 403 that is audited, policy changes are audited with prior and new values, admins manage
principals (token shown once, revocation at once), and the API surface shows the split."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from apikit import Api, Session, assert_problem
from fireledger.control.auth import _route_roles
from fireledger.control.tenants import ALL_ROLES

ROLES = sorted(ALL_ROLES)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Session, dict[str, Session]]]:
    """One tenant, its all-roles owner, and one principal per single role (plus one with none)."""
    api = Api(tmp_path_factory.mktemp("roles"))
    _, owner = api.tenant("acme")
    sessions = {}
    for role in ROLES:
        r = owner.post("/v1/principals", json={"name": f"only-{role}", "roles": [role]})
        assert r.status_code == 201, r.text
        sessions[role] = Session(api, r.json()["token"])
    # "none": a principal without any role (the API refuses to grant none: made in the store).
    from fireledger.control.auth import hash_token, new_token
    from fireledger.domain.keys import new_id
    from fireledger.domain.model import Principal

    tok = new_token()
    tenant_id = api.store.trust.principal_by_token_hash(hash_token(owner.token)).tenant_id
    api.store.trust.create_principal(Principal(new_id("pr"), tenant_id, "nothing", frozenset(), 0), hash_token(tok))
    sessions["none"] = Session(api, tok)
    yield api, owner, sessions
    api.assert_no_sentinel()
    api.close()


def _objects(owner: Session, path: str, method: str) -> dict[str, str]:
    """Fresh objects of the owner's tenant, only those ``path`` names (a DELETE may consume them)."""
    out: dict[str, str] = {}
    if "{target}" in path or "{trigger}" in path or "{fire}" in path or path == "/v1/triggers":
        out["target"] = owner.target()["id"]
    if "{trigger}" in path or "{fire}" in path:
        out["trigger"] = owner.trigger(out["target"], {"every": "1h"})["id"]
        if method == "DELETE" and "{target}" in path:
            out["target"] = owner.target("https://unused.example.com/hook")["id"]
        out["fire"] = f"tn_x.{out['trigger']}.20260101T000000Z.0"
    if "{principal}" in path:
        out["principal"] = owner.post("/v1/principals", json={"name": "spare", "roles": ["reader"]}).json()["id"]
    return out


#: (method, path, body) → the one role that allows it. Paths use {trigger}, {target}, {principal}, {fire}.
MATRIX: list[tuple[str, str, Any, str]] = [
    ("GET", "/v1/triggers", None, "reader"),
    ("POST", "/v1/triggers", "trigger-body", "author"),
    ("GET", "/v1/triggers/{trigger}", None, "reader"),
    ("PATCH", "/v1/triggers/{trigger}", {"name": "renamed"}, "author"),
    ("POST", "/v1/triggers/{trigger}/pause", None, "author"),
    ("POST", "/v1/triggers/{trigger}/resume", None, "author"),
    ("DELETE", "/v1/triggers/{trigger}", None, "author"),
    ("GET", "/v1/triggers/{trigger}/preview", None, "reader"),
    ("GET", "/v1/triggers/{trigger}/fires", None, "reader"),
    ("GET", "/v1/fires/{fire}", None, "reader"),
    ("PATCH", "/v1/triggers/{trigger}/policy", {"catchup_horizon": "2h"}, "policy"),
    ("GET", "/v1/targets", None, "reader"),
    ("GET", "/v1/targets/{target}", None, "reader"),
    ("POST", "/v1/targets", {"kind": "http", "url": "https://new.example.com/hook"}, "admin"),
    ("POST", "/v1/targets/{target}/verify", None, "admin"),
    ("DELETE", "/v1/targets/{target}", None, "admin"),
    ("GET", "/v1/principals", None, "admin"),
    ("POST", "/v1/principals", {"name": "n", "roles": ["reader"]}, "admin"),
    ("GET", "/v1/principals/{principal}", None, "admin"),
    ("DELETE", "/v1/principals/{principal}", None, "admin"),
    ("GET", "/v1/audit", None, "admin"),
]


#: Authenticated by the signature of the fire's target (no bearer token, so no role): the outcome callback.
SIGNED = {("POST", "/v1/fires/{key}/outcome")}
#: Public: the JSON Schema of a `fireledger apply` file describes no tenant's data (decision 0185).
PUBLIC = {("GET", "/v1/schemas/triggers.json")}


def _request(owner: Session, method: str, path: str, body: Any) -> tuple[str, Any]:
    objs = _objects(owner, path, method)
    if body == "trigger-body":
        body = {"name": "n", "schedule": {"every": "1h"}, "target_id": objs["target"]}
    return path.format(**objs), body


@pytest.mark.parametrize("role", [*ROLES, "none"])
@pytest.mark.parametrize(("method", "path", "body", "needs"), MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX])
def test_role_matrix(world, role: str, method: str, path: str, body: Any, needs: str) -> None:
    api, owner, sessions = world
    s = sessions[role]
    url, body = _request(owner, method, path, body)
    head, _ = api.store.trust.audit_head()
    r = s.request(method, url, json=body) if body is not None else s.request(method, url)
    denied = [a.as_json() for a in api.store.trust.audit_rows(head) if a.action == "denied"]
    if role == needs:
        assert r.status_code not in (401, 403), r.text
        assert not denied
    else:
        problem = assert_problem(r, 403)
        assert problem["detail"] == f"this token lacks the role {needs!r}"
        [row] = denied
        assert row["new"]["missing_role"] == needs and row["new"]["request"].startswith(f"{method} /v1/")
        assert row["actor"] == api.store.trust.principal_by_token_hash(_hash(s.token)).id


def _hash(token: str | None) -> str:
    from fireledger.control.auth import hash_token

    assert token is not None
    return hash_token(token)


def test_every_v1_route_requires_a_role_and_known_ones_the_matrix_role(world) -> None:
    api, _, _ = world
    expected = {(m, p.replace("{trigger}", "{trigger_id}").replace("{target}", "{target_id}")
                 .replace("{principal}", "{principal_id}").replace("{fire}", "{key}")): needs
                for m, p, _, needs in MATRIX}
    seen = set()
    for rc in iter_route_contexts(api.app.routes):
        route = rc.original_route
        if not isinstance(route, APIRoute) or not (rc.path or "").startswith("/v1"):
            continue
        roles = _route_roles(route.dependant)
        for method in rc.methods or ():
            if (method, rc.path) in SIGNED | PUBLIC:
                assert not roles
                continue
            assert roles, f"{method} {rc.path} has no role requirement"
            if (method, rc.path) in expected:
                seen.add((method, rc.path))
                assert roles == {expected[(method, rc.path)]}, (method, rc.path, roles)
    assert seen == set(expected)


def test_horizon_extension_by_an_author_is_refused_and_audited_and_the_policy_role_may(world) -> None:
    api, owner, sessions = world
    tg = owner.target()
    t = owner.trigger(tg["id"], {"every": "1h"})
    author = Session(api, owner.post("/v1/principals", json={"name": "a", "roles": ["author", "reader"]}
                                     ).json()["token"])
    before = api.snapshot()
    for call in (lambda: author.patch(f"/v1/triggers/{t['id']}", json={"catchup_horizon": "24h"}),
                 lambda: author.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1h"},
                                                           "target_id": tg["id"], "catchup_horizon": "24h"}),
                 lambda: author.patch(f"/v1/triggers/{t['id']}/policy", json={"catchup_horizon": "24h"})):
        assert_problem(call(), 403)
    assert api.snapshot() == before
    rows = owner.get("/v1/audit", params={"limit": 1000}).json()["items"][-3:]
    assert [r["action"] for r in rows] == ["denied"] * 3
    assert rows[0]["new"] == {"request": f"PATCH /v1/triggers/{t['id']}", "missing_role": "policy",
                              "fields": ["catchup_horizon"], "count": 1}
    assert rows[1]["new"]["fields"] == ["catchup_horizon"] and rows[2]["new"]["missing_role"] == "policy"

    r = sessions["policy"].patch(f"/v1/triggers/{t['id']}/policy", json={"catchup_horizon": "24h",
                                                                         "overlap_policy": "skip"})
    assert r.status_code == 200, r.text
    assert (r.json()["catchup_horizon"], r.json()["overlap_policy"], r.json()["version"]) == ("1d", "skip", 2)
    [row] = [a for a in owner.get("/v1/audit", params={"limit": 1000}).json()["items"]
             if a["action"] == "trigger.policy" and a["new"]["trigger_id"] == t["id"]]
    assert row["prior"]["catchup_horizon"] == "1h" and row["new"]["catchup_horizon"] == "1d"
    assert row["new"]["fields"] == ["catchup_horizon", "overlap_policy"]
    assert row["actor"] == api.store.trust.principal_by_token_hash(_hash(sessions["policy"].token)).id
    assert_problem(sessions["policy"].patch(f"/v1/triggers/{t['id']}/policy", json={}), 422, "body")
    assert_problem(sessions["policy"].patch(f"/v1/triggers/{t['id']}/policy", json={"name": "x"}), 422, "name")


def test_principals_token_shown_once_revocation_and_the_last_admin(tmp_path: Path) -> None:
    api = Api(tmp_path)
    try:
        _, owner = api.tenant("acme")
        r = owner.post("/v1/principals", json={"name": "ci bot", "roles": ["author", "reader"]})
        assert r.status_code == 201 and r.headers["location"] == f"/v1/principals/{r.json()['id']}"
        bot = r.json()
        assert bot["token"].startswith("fl_") and bot["roles"] == ["author", "reader"] and bot["revoked_at"] is None
        got = owner.get(f"/v1/principals/{bot['id']}").json()
        assert "token" not in got and bot["token"] not in owner.get("/v1/principals").text
        assert got == {k: v for k, v in bot.items() if k != "token"}
        bot_s = Session(api, bot["token"])
        assert bot_s.get("/v1/triggers").status_code == 200
        assert owner.delete(f"/v1/principals/{bot['id']}").status_code == 204
        assert_problem(bot_s.get("/v1/triggers"), 401)                         # revoked at once
        assert owner.get(f"/v1/principals/{bot['id']}").json()["revoked_at"] == "2026-03-27T12:00:00Z"
        assert_problem(owner.delete(f"/v1/principals/{bot['id']}"), 404)
        for body, field in (({"name": "x", "roles": ["root"]}, "roles.0"), ({"name": "x", "roles": []}, "roles"),
                            ({"name": "", "roles": ["reader"]}, "name"), ({"name": "x"}, "roles"),
                            ({"name": "x", "roles": ["reader", "reader"]}, "roles"),
                            ({"name": "x\u0007", "roles": ["reader"]}, "name"),
                            ({"name": "x", "roles": ["reader"], "token": "mine"}, "token")):
            assert_problem(owner.post("/v1/principals", json=body), 422, field)
        owner_id = api.store.trust.principal_by_token_hash(_hash(owner.token)).id
        body = assert_problem(owner.delete(f"/v1/principals/{owner_id}"), 409)
        assert "last admin" in body["detail"]
        admin2 = owner.post("/v1/principals", json={"name": "second admin", "roles": ["admin"]}).json()
        assert owner.delete(f"/v1/principals/{owner_id}").status_code == 204     # another admin exists now
        assert_problem(owner.get("/v1/principals"), 401)
        actions = [a["action"] for a in Session(api, admin2["token"]).get("/v1/audit").json()["items"]]
        assert actions == ["tenant.create", "principal.create", "principal.revoke", "principal.create",
                           "principal.revoke"]
    finally:
        api.close()


def test_openapi_shows_the_four_surfaces(world) -> None:
    api, _, _ = world
    doc = api.anon.get("/openapi.json").json()
    assert [t["name"] for t in doc["tags"]][:4] == ["management", "policy", "privileged", "history"]
    tag: Callable[[str, str], list[str]] = lambda p, m: doc["paths"][p][m]["tags"]  # noqa: E731
    assert tag("/v1/triggers", "post") == ["management"]
    assert tag("/v1/triggers/{trigger_id}/policy", "patch") == ["policy"]
    assert tag("/v1/principals", "post") == ["privileged"] and tag("/v1/audit", "get") == ["privileged"]
    assert tag("/v1/targets/{target_id}/verify", "post") == ["privileged"]
    assert tag("/v1/triggers/{trigger_id}/fires", "get") == ["history"] and tag("/v1/fires/{key}", "get") == [
        "history"]
    for path, ops in doc["paths"].items():
        if path.startswith("/v1"):
            for op in ops.values():
                assert op["tags"][0] in ("management", "policy", "privileged", "history"), (path, op["tags"])
