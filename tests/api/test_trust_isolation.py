"""Tenant isolation (invariant 15) over EVERY ``/v1`` endpoint the app serves, with tokens of every role:
tenant B cannot read, list, change or trigger tenant A's objects. Asking for A's object is answered
exactly as asking for one that does not exist (404 — or 403 when B's token lacks the endpoint's role:
the role check comes first and says nothing about the object), lists show only B's own objects, no
response names A's ids, and nothing of A changes.

Endpoints are enumerated from the app, so a new route is covered without editing this test — unless
it has a path parameter this test does not know (then the test fails and says which)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from apikit import T0, Api, Session
from fireledger.control.auth import _route_roles
from fireledger.control.tenants import ALL_ROLES
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire

ROLES = [*sorted(ALL_ROLES), "all"]
#: Path parameters and which of A's objects they name.
PARAMS = {"trigger_id": "trigger", "target_id": "target", "principal_id": "principal", "key": "fire",
          "name": "calendar"}
#: Creates of B's own objects (they reference nothing of A's, so they cannot reach A's objects).
OWN_CREATES = {("POST", "/v1/targets"), ("POST", "/v1/principals"), ("POST", "/v1/calendars")}


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.api = Api(tmp_path)
        a_id, self.a = self.api.tenant("tenant-a")
        _, self.b_owner = self.api.tenant("tenant-b")
        tg = self.a.target()
        t = self.a.trigger(tg["id"], {"cron": "0 * * * *", "zone": "UTC"})
        due = self.api.store.timing.due_rows(2**62, 1)[0]
        fire = NewFire(a_id, t["id"], due.next_us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                       T0, "2026f", "node-test")
        self.api.store.timing.apply_decisions([Decision(Advance(t["id"], due.next_us, 1, due.next_us + 3600_000_000, 1),
                                                 (fire,))])
        p = self.a.post("/v1/principals", json={"name": "a-reader", "roles": ["reader"]}).json()
        cal = self.a.post("/v1/calendars", json={"name": "a-holidays-0f3c",
                                                 "entries": [{"date": "2026-12-25", "zone": "Europe/London"}]})
        assert cal.status_code == 201, cal.text
        self.objects = {"trigger": t["id"], "target": tg["id"], "principal": p["id"],
                        "fire": str(FireKey(a_id, t["id"], due.next_us, 0)), "calendar": "a-holidays-0f3c"}
        # The same shapes, naming nothing that exists.
        self.absent = {"trigger": "tr_00000000deadbeef", "target": "tg_00000000deadbeef",
                       "principal": "pr_00000000deadbeef",
                       "fire": str(FireKey(a_id, "tr_00000000deadbeef", due.next_us, 0)),
                       "calendar": "no-such-calendar-0f3c"}
        self.b: dict[str, Session] = {"all": self.b_owner}
        for role in sorted(ALL_ROLES):
            r = self.b_owner.post("/v1/principals", json={"name": f"b-{role}", "roles": [role]})
            self.b[role] = Session(self.api, r.json()["token"])

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table but the audit (refusals are audited, as they must be)."""
        conn = self.api.store.engine.connection()
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
                 if r[0] not in ("audit", "audit_head") and not r[0].startswith("sqlite_")]
        return {n: sorted(map(tuple, conn.execute(f'SELECT * FROM "{n}"').fetchall()), key=repr) for n in names}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("isolation"))
    yield w
    w.api.assert_no_sentinel()
    w.api.close()


def _routes() -> list[tuple[str, str, frozenset[str]]]:
    api = Api(Path(__import__("tempfile").mkdtemp()))
    try:
        out = []
        for rc in iter_route_contexts(api.app.routes):
            route = rc.original_route
            if isinstance(route, APIRoute) and (rc.path or "").startswith("/v1"):
                for method in sorted(rc.methods or ()):
                    out.append((method, rc.path, frozenset(_route_roles(route.dependant))))
                    if any(getattr(d.call, "fireledger_any_roles", False) for d in route.dependant.dependencies):
                        ANY_OF.add((method, rc.path))
        return out
    finally:
        api.close()


#: Routes that accept any one of their roles (``require_any``: queue pull/ack, consumer or admin).
ANY_OF: set[tuple[str, str]] = set()
ROUTES = [r for r in _routes() if r[:2] not in OWN_CREATES]


def _body(method: str, path: str, names: dict[str, str]) -> Any:
    if method not in ("POST", "PATCH", "PUT"):
        return None
    bodies = {
        "/v1/triggers": {"name": "x", "schedule": {"every": "1m"}, "target_id": names["target"]},
        "/v1/triggers/{trigger_id}": {"name": "stolen", "target_id": names["target"]},
        "/v1/triggers/{trigger_id}/policy": {"catchup_horizon": "2h"},
        "/v1/triggers/{trigger_id}/backfill": {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z"},
        "/v1/queues/{target_id}/pull": {"max": 1},
        "/v1/queues/{target_id}/ack": {"fire_keys": [names["fire"]]},
        "/v1/calendars/{name}": {"entries": [{"date": "2027-01-01"}]},
        "/v1/tenant/quota": {"inflight": 100},   # B's own quota, set to what it is: nothing changes
        "/v1/fires/{key}/outcome": {"fire_key": names["fire"], "outcome": "succeeded"},
    }
    return bodies.get(path, {})


def _url(path: str, names: dict[str, str]) -> str:
    out = path
    for param, what in PARAMS.items():
        out = out.replace("{" + param + "}", names[what])
    assert "{" not in out, f"{path}: a path parameter this isolation test does not know — add it to PARAMS"
    return out


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("method", "path", "needs"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_tenant_b_cannot_reach_tenant_a(world: World, role: str, method: str, path: str, needs: frozenset[str]):
    s = world.b[role]
    # A route that accepts any one of its roles (queue pull/ack: consumer or admin, decision 0176).
    allowed = role == "all" or needs <= {role} or ((method, path) in ANY_OF and role in needs)
    before = world.snapshot()
    r = s.request(method, _url(path, world.objects), json=_body(method, path, world.objects))
    text = r.text
    if path == "/v1/audit" and r.status_code == 200:
        # B's own refused requests are in B's audit, with the ids B typed: not A's data.
        text = str([i for i in r.json()["items"] if i["action"] != "denied"])
    assert not any(i in text for i in world.objects.values()), (r.status_code, text[:300])
    assert world.snapshot() == before, "tenant B changed something"
    assert r.status_code >= 400 or "{" not in path, (r.status_code, r.text[:300])
    if "{" not in path:
        if allowed:
            assert r.status_code < 400 or method == "POST", r.text    # a create naming A's target is refused
        return
    # Exactly what a missing object gets: no existence oracle.
    ghost = s.request(method, _url(path, world.absent), json=_body(method, path, world.absent))
    if needs:                              # bearer-authenticated routes
        assert (r.status_code, r.json()) == (ghost.status_code, ghost.json())
        if allowed:
            assert r.status_code == 404, r.text
        else:
            assert r.status_code == 403, r.text
    else:
        # The signed outcome callback: B holds no secret of A's targets, so nothing is recorded.
        assert r.status_code in (401, 404), r.text


def test_creates_of_b_belong_to_b_alone(world: World) -> None:
    """The two creates that name nothing of A's (left out above): B's objects are B's, A sees none."""
    assert {r[:2] for r in _routes()} >= OWN_CREATES
    tg = world.b_owner.post("/v1/targets", json={"kind": "http", "url": "https://b.example.com/hook"}).json()
    p = world.b_owner.post("/v1/principals", json={"name": "b2", "roles": ["reader"]}).json()
    a_view = world.a.get("/v1/targets").text + world.a.get("/v1/principals").text
    assert tg["id"] not in a_view and p["id"] not in a_view
    assert world.a.get(f"/v1/targets/{tg['id']}").status_code == 404
    assert world.a.get(f"/v1/principals/{p['id']}").status_code == 404
