"""Hardening, class "the console and metrics surfaces" (issue 13, low #14).

* The console's cookie holds a random session id, never the bearer token; the store keeps only its
  hash. The session ends on sign-out and when its principal is revoked, in every control process
  (two apps over one PostgreSQL database, and over one SQLite file).
* Every console POST form carries a CSRF token: a sign-in or sign-out without it (or with another
  one, or sent cross-site) changes nothing.
* ``Secure`` follows ``FIRELEDGER_PUBLIC_URL``; a forwarded scheme is believed only from a proxy
  listed in ``FIRELEDGER_TRUSTED_PROXIES`` (a real ``fireledger control`` process).
* Each console page costs a fixed number of store queries whatever the number of triggers.
* ``/metrics`` reads the store once for scrapes within a second.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from apikit import T0, Api
from e2e import Service, new_tenant
from fireledger.clock import FakeClock
from fireledger.control import create_app
from fireledger.control.auth import create_tenant
from fireledger.store import Store
from storekit import QueryCounter, open_store

COOKIE = "fireledger_console"


# --- helpers ------------------------------------------------------------------------------------------


def login_form(http: TestClient) -> dict[str, str]:
    """The sign-in page's hidden fields (its CSRF token, where the page has one)."""
    page = http.get("/console/login")
    assert page.status_code == 200
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))


def sign_in(http: TestClient, token: str) -> str:
    """Sign in as a browser does; returns the value of the console cookie set."""
    r = http.post("/console/login", data={**login_form(http), "token": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/", r.text
    value = http.cookies.get(COOKIE)
    assert value
    return str(value)


def page_ok(http: TestClient, cookie: str, path: str = "/console/triggers") -> bool:
    """Whether ``cookie`` opens a console page (not a redirect to the sign-in)."""
    fresh = TestClient(http.app)
    r = fresh.get(path, headers={"cookie": f"{COOKIE}={cookie}"}, follow_redirects=False)
    assert r.status_code in (200, 303), r.status_code
    return r.status_code == 200


def csrf_of(page_html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page_html)
    assert m, page_html[:400]
    return m.group(1)


# --- sessions -------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def two_apps(request: Any, tmp_path: Path) -> Iterator[tuple[Store, TestClient, TestClient]]:
    """Two control planes (two apps, two stores) over one database, as two processes would be."""
    pg = request.getfixturevalue("pg_server") if request.param == "postgres" else None
    first = open_store(request.param, tmp_path, pg)
    url = f"sqlite:///{tmp_path}/store.db" if request.param == "sqlite" else None
    if url is None:
        conninfo = first.engine.url
        second = Store.open(conninfo)
    else:
        second = Store.open(url)
    clock = FakeClock(true_us=T0)
    a = TestClient(create_app(first, clock))
    b = TestClient(create_app(second, clock))
    a.__enter__()
    b.__enter__()
    yield first, a, b
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    second.close()
    first.close()


def test_the_cookie_is_a_session_id_stored_hashed_and_revocation_or_sign_out_end_it_everywhere(
        two_apps: tuple[Store, TestClient, TestClient]) -> None:
    store, a, b = two_apps
    _, admin = create_tenant(store, "console-sessions", T0)
    reader = b.post("/v1/principals", json={"name": "viewer", "roles": ["reader"]},
                    headers={"authorization": f"Bearer {admin}"}).json()
    cookie = sign_in(a, reader["token"])
    assert reader["token"] not in cookie and admin not in cookie
    with store.engine.read() as c:
        rows = [tuple(str(v) for v in r) for r in c.execute("SELECT * FROM console_sessions").fetchall()]
    assert len(rows) == 1 and not any(cookie in v or reader["token"] in v for v in rows[0]), rows
    assert page_ok(a, cookie) and page_ok(b, cookie)          # the other process knows the session
    # Revoking the principal (through the other process) ends the session at once, everywhere.
    assert b.delete(f"/v1/principals/{reader['id']}", headers={"authorization": f"Bearer {admin}"}).status_code == 204
    assert not page_ok(a, cookie) and not page_ok(b, cookie)
    # Signing out deletes the session: the old cookie is worthless in the other process too.
    cookie = sign_in(a, admin)
    assert page_ok(b, cookie)
    csrf = csrf_of(a.get("/console/triggers").text)
    r = a.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    assert not page_ok(a, cookie) and not page_ok(b, cookie)


# --- CSRF -------------------------------------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


def test_sign_in_and_sign_out_need_their_csrf_token(api: Api) -> None:
    _, s = api.tenant("csrf")
    http = api.http
    # Sign-in: no token, a made-up one, another browser's, or a cross-site post — no session.
    fields = login_form(http)
    assert fields.get("csrf"), "the sign-in form has no CSRF token"
    other = TestClient(api.app)
    others = login_form(other)
    for data, headers in (({"token": s.token}, {}),
                          ({"token": s.token, "csrf": "forged"}, {}),
                          ({"token": s.token, "csrf": others["csrf"]}, {}),
                          ({"token": s.token, "csrf": fields["csrf"]}, {"sec-fetch-site": "cross-site"})):
        r = http.post("/console/login", data=data, headers=headers, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/login?error=expired", (data, r.text)
        assert http.cookies.get(COOKIE) is None
    with api.store.engine.read() as c:
        assert c.execute("SELECT COUNT(*) FROM console_sessions").fetchone()[0] == 0
    cookie = sign_in(http, s.token)
    # Sign-out without the session's token (or with another session's) is refused; the session lives.
    token = csrf_of(http.get("/console/").text)
    other_cookie = sign_in(other, s.token)
    assert other_cookie != cookie
    other_token = csrf_of(other.get("/console/").text)
    assert other_token != token
    for data, headers in (({}, {}), ({"csrf": other_token}, {}), ({"csrf": token}, {"sec-fetch-site": "same-site"})):
        r = http.post("/console/logout", data=data, headers=headers, follow_redirects=False)
        assert r.status_code == 403, (data, r.status_code)
        assert page_ok(http, cookie)
    assert http.post("/console/logout", data={"csrf": token}, follow_redirects=False).status_code == 303
    assert not page_ok(http, cookie) and page_ok(other, other_cookie)


# --- Secure ------------------------------------------------------------------------------------------


def _set_cookie(r: Any, name: str) -> str:
    return next(c for c in r.headers.get_list("set-cookie") if c.startswith(f"{name}="))


@pytest.mark.parametrize(("public", "secure"), [("https://console.example.com", True),
                                                ("http://console.example.com", False)])
def test_secure_follows_the_public_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, public: str,
                                       secure: bool) -> None:
    monkeypatch.setenv("FIRELEDGER_PUBLIC_URL", public)
    api = Api(tmp_path)
    try:
        _, s = api.tenant("secure")
        page = api.http.get("/console/login")   # the request itself is plain http
        nonce = _set_cookie(page, "fireledger_console_login")
        assert ("; secure" in nonce.lower()) is secure
        browser = TestClient(api.app)   # behind the TLS proxy the browser sends the Secure cookie back
        r = browser.post("/console/login", data={"csrf": csrf_of(page.text), "token": s.token},
                         headers={"cookie": nonce.split(";")[0]}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/"
        assert ("; secure" in _set_cookie(r, COOKIE).lower()) is secure
    finally:
        api.close()


def test_a_malformed_public_url_stops_the_app_naming_the_variable(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIRELEDGER_PUBLIC_URL", "console.example.com")
    with pytest.raises(ValueError, match="FIRELEDGER_PUBLIC_URL"):
        Api(tmp_path)


@pytest.mark.e2e
def test_a_forwarded_scheme_counts_only_from_a_trusted_proxy(tmp_path: Path) -> None:
    import http.client

    db = f"sqlite:///{tmp_path}/fwd.db"
    _, token = new_tenant(db)

    def login_cookie(port: int) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/console/login", headers={"X-Forwarded-Proto": "https"})
            r = conn.getresponse()
            r.read()
            return next(v for k, v in r.getheaders() if k.lower() == "set-cookie")
        finally:
            conn.close()

    for env, secure in (({}, False), ({"FIRELEDGER_TRUSTED_PROXIES": "127.0.0.1"}, True)):
        svc = Service(db, tmp_path, command="control", env=env).start()
        try:
            assert ("; secure" in login_cookie(svc.port).lower()) is secure, env
        finally:
            svc.stop()
    bad = Service(db, tmp_path, command="control", env={"FIRELEDGER_TRUSTED_PROXIES": "proxy.local"})
    with pytest.raises(RuntimeError, match="FIRELEDGER_TRUSTED_PROXIES"):
        bad.start(timeout_s=20)
    bad.stop()


# --- queries per page ----------------------------------------------------------------------------------


def test_console_pages_cost_the_same_queries_for_2_and_40_triggers(api: Api) -> None:
    _, s = api.tenant("queries")
    target = s.target()["id"]
    counter = QueryCounter(api.store)
    sign_in(api.http, s.token)
    costs: dict[int, dict[str, int]] = {}
    made = 0
    for n in (2, 40):
        while made < n:
            s.trigger(target, {"every": "60s"}, name=f"t{made}")
            made += 1
        pages = {}
        for path in ("/console/", "/console/triggers"):
            def get(path: str = path, n: int = n) -> None:
                r = api.http.get(path)
                assert r.status_code == 200, r.status_code
                if path == "/console/triggers":   # every trigger is listed, each with its health
                    assert r.text.count('<a href="/console/triggers/tr_') == n
            pages[path] = counter.during(get)
        costs[n] = pages
    assert costs[2] == costs[40], costs


# --- /metrics -----------------------------------------------------------------------------------------


def test_metrics_read_the_store_once_a_second(api: Api) -> None:
    counter = QueryCounter(api.store)
    collector = api.app.state.store_metrics
    now = [1000.0]
    collector.monotonic = lambda: now[0]   # the cache's clock, stepped instead of waited for
    first = counter.during(lambda: api.http.get("/metrics"))
    now[0] += 0.999
    second = counter.during(lambda: api.http.get("/metrics"))
    assert first >= 4 and second == 0, (first, second)   # two scrapes inside the second: one reading
    now[0] += 0.001
    # A second later the store is read again (the smearing gauges keep their own one-minute cache).
    assert 4 <= counter.during(lambda: api.http.get("/metrics")) <= first

