"""Targets over HTTP: create (secret shown once), read, list, delete; URL checks (invariant 12)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import Api, Session, assert_problem
from fireledger.security.envelope import open_secret


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Session]]:
    """One store for the refusal tables: each test compares its own before/after snapshot."""
    a = Api(tmp_path_factory.mktemp("targets"))
    yield a, a.tenant("acme")[1]
    a.assert_no_sentinel()
    a.close()


def test_create_shows_secret_once(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    r = s.post("/v1/targets", json={"kind": "http", "url": "https://hooks.example.com/fire?x=1"})
    assert r.status_code == 201, r.text
    t = r.json()
    assert set(t) == {"id", "kind", "url", "secret", "verification", "created_at"}
    assert t["id"].startswith("tg_") and r.headers["location"] == f"/v1/targets/{t['id']}"
    assert (t["kind"], t["url"], t["created_at"]) == ("http", "https://hooks.example.com/fire?x=1",
                                                      "2026-03-27T12:00:00Z")
    assert t["secret"].startswith("whsec_") and len(base64.b64decode(t["secret"][6:])) == 32
    assert t["verification"]["state"] == "unverified" and len(t["verification"]["token"]) >= 20
    got = s.get(f"/v1/targets/{t['id']}").json()
    assert "secret" not in got and t["secret"] not in s.get(f"/v1/targets/{t['id']}").text
    assert got == {k: v for k, v in t.items() if k != "secret"}
    listed = s.get("/v1/targets").json()
    assert listed["items"] == [got] and t["secret"] not in str(listed)
    stored = api.store.registry.get_target(tenant_id, t["id"])
    assert stored is not None and t["secret"] not in stored.secret            # stored sealed (finding 9)
    assert open_secret(api.store, stored) == t["secret"]


def test_list_pages_with_cursor(api: Api) -> None:
    _, s = api.tenant("acme")
    ids = sorted(s.target(f"https://h{i}.example.com/")["id"] for i in range(5))
    r = s.get("/v1/targets", params={"limit": 3}).json()
    assert [i["id"] for i in r["items"]] == ids[:3] and r["next"]
    r2 = s.get("/v1/targets", params={"limit": 3, "cursor": r["next"]}).json()
    assert [i["id"] for i in r2["items"]] == ids[3:] and r2["next"] is None


def test_delete_refused_while_a_live_trigger_uses_it(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"])
    s.post(f"/v1/triggers/{t['id']}/pause")
    before = api.snapshot()
    body = assert_problem(s.delete(f"/v1/targets/{tg['id']}"), 409)
    assert t["id"] in body["detail"]
    assert api.snapshot() == before
    assert s.delete(f"/v1/triggers/{t['id']}").status_code == 204
    assert s.delete(f"/v1/targets/{tg['id']}").status_code == 204
    assert_problem(s.get(f"/v1/targets/{tg['id']}"), 404)
    assert_problem(s.delete(f"/v1/targets/{tg['id']}"), 404)
    assert s.get("/v1/targets").json()["items"] == []
    # A deleted target can no longer be used.
    r = s.post("/v1/triggers", json={"name": "x", "schedule": {"every": "1m"}, "target_id": tg["id"]})
    assert_problem(r, 422, "target_id")


PRIVATE = [
    "http://localhost/hook",
    "http://LOCALHOST.:8080/hook",
    "https://api.localhost/hook",
    "http://127.0.0.1/hook",
    "http://127.1/hook",
    "http://2130706433/hook",
    "http://0x7f000001/hook",
    "http://0.0.0.0/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.10:8443/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
]


@pytest.mark.parametrize("url", PRIVATE)
def test_private_targets_refused_by_default(shared: tuple[Api, Session], url: str) -> None:
    api, s = shared
    before = api.snapshot()
    body = assert_problem(s.post("/v1/targets", json={"kind": "http", "url": url}), 422, "url")
    assert "private" in body["errors"][0]["problem"]
    assert api.snapshot() == before


@pytest.mark.parametrize("url", ["http://127.0.0.1:9000/hook", "http://localhost:8080/x", "http://10.0.0.5/"])
def test_private_targets_allowed_when_the_operator_says_so(tmp_path: Path, url: str) -> None:
    api = Api(tmp_path, allow_private_targets=True)
    try:
        _, s = api.tenant("acme")
        assert s.post("/v1/targets", json={"kind": "http", "url": url}).status_code == 201
    finally:
        api.close()


def test_private_targets_default_follows_the_environment(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from fireledger.clock import FakeClock
    from fireledger.control import create_app
    from fireledger.control.context import ApiContext

    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")
    api = Api(tmp_path)
    try:
        ctx: ApiContext = create_app(api.store, FakeClock(0)).state.fireledger
        assert ctx.allow_private_targets is True
        monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "0")
        assert create_app(api.store, FakeClock(0)).state.fireledger.allow_private_targets is False
        monkeypatch.delenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS")
        assert create_app(api.store, FakeClock(0)).state.fireledger.allow_private_targets is False
    finally:
        api.close()


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "http", "url": "ftp://files.example.com/x"}, "url"),
    ({"kind": "http", "url": "https://"}, "url"),
    ({"kind": "http", "url": "not a url"}, "url"),
    ({"kind": "http", "url": "https://example.com/" + "a" * 2048}, "url"),
    ({"kind": "http", "url": "https://user:pw@example.com/"}, "url"),
    ({"kind": "http", "url": "https://example.com:99999/"}, "url"),
    ({"kind": "http"}, "url"),
    ({"kind": "http", "url": 5}, "url"),
    ({"kind": "smtp", "url": "https://example.com/"}, "kind"),   # queue/internal exist since issue 5
    ({"url": "https://example.com/"}, "kind"),
    ({"kind": "http", "url": "https://example.com/", "secret": "mine"}, "secret"),
])
def test_bad_target_bodies(shared: tuple[Api, Session], body: dict[str, object], field: str) -> None:
    api, s = shared
    before = api.snapshot()
    problem = assert_problem(s.post("/v1/targets", json=body), 422, field)
    if field == "kind" and "kind" in body:
        assert problem["errors"][0]["problem"] == "must be one of http, queue, internal"
    assert api.snapshot() == before
