"""Hardening (issue 13, finding 6) — the class: *ownership of a target is proved only by something the
requester cannot produce from the request, and stays bound to where it was proved*.

* An origin that echoes the challenge path (or anything else in the request) fails verification;
  an origin serving ``verification.response`` (token + HMAC under a deployment key) passes.
* A plain-http target with a host name is pinned to the addresses that answered its challenge: when
  the name later resolves elsewhere, nothing is sent there and the fire records why.
* Verifications made under the old (echoable) challenge are void after the upgrade migration.

Everything runs over real sockets against real local servers; only the DNS answer for a made-up
name is injected (a resolver under the egress guard), since this machine cannot publish one.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from apikit import Api, assert_problem
from fireledger.clock import FakeClock
from fireledger.dispatch.http import HttpSender
from fireledger.dispatch.runner import Dispatcher
from fireledger.security.egress import EgressPolicy
from fireledger.security.targets import forget_cached, prove_ownership, verification_response
from fireledger.store import Store
from fireledger.store.engine import migration_files
from fireledger.store.sqlitelib import sqlite3
from fireledger.timing import TimingLoop
from storekit import add_target, add_tenant, add_trigger, open_store

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KEK = base64.b64encode(b"\x07" * 32).decode()
WELL_KNOWN = "/.well-known/fireledger-verification/"


@pytest.fixture(autouse=True)
def _kek(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIRELEDGER_KEK", KEK)   # the deployment key the challenge response derives from


class Origin:
    """A real HTTP server on ``host``:``port`` (a thread with its own loop) that records every request
    (method, path and query, headers, body) and answers challenges through ``answer(token)``."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host, self.port = host, port
        self.requests: list[dict[str, Any]] = []
        self.challenges: dict[str, str] = {}
        self.echo = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    async def _challenge(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        self.requests.append({"method": request.method, "path": request.path_qs,
                              "headers": dict(request.headers), "body": await request.text()})
        if self.echo:   # the attack: answer whatever the path asks for
            return web.Response(text=token)
        answer = self.challenges.get(token)
        return web.Response(text=answer) if answer is not None else web.Response(status=404)

    async def _hook(self, request: web.Request) -> web.Response:
        self.requests.append({"method": request.method, "path": request.path_qs,
                              "headers": dict(request.headers), "body": await request.text()})
        return web.Response(status=204)

    def start(self) -> Origin:
        import threading

        ready = threading.Event()

        async def serve() -> None:
            app = web.Application()
            app.router.add_get(WELL_KNOWN + "{token}", self._challenge)
            app.router.add_post("/hook", self._hook)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            self.port = self._runner.addresses[0][1]
            ready.set()

        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop)
        assert ready.wait(10), "the origin did not start"
        return self

    def stop(self) -> None:
        assert self._loop is not None and self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def hooks(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "POST"]


class Answers(aiohttp.abc.AbstractResolver):
    """The DNS answer for made-up names (mutable: a name can be moved), under the egress guard."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        if host not in self.answers:
            raise OSError(f"{host}: no such name")
        return [{"hostname": host, "host": a, "port": port, "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for a in self.answers[host]]

    async def close(self) -> None:
        return None


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path, allow_private_targets=True)   # the origins are on loopback: the operator allows it
    yield a
    a.close()


@pytest.fixture
def echo() -> Iterator[Origin]:
    o = Origin("127.0.0.1").start()
    yield o
    o.stop()


def test_an_origin_that_echoes_the_path_fails_and_one_serving_the_response_passes(api: Api, echo: Origin):
    _, s = api.tenant("acme")
    tg = s.post("/v1/targets", json={"kind": "http", "url": f"http://127.0.0.1:{echo.port}/hook"}).json()
    v = tg["verification"]
    assert v["challenge_path"] == WELL_KNOWN + v["token"]
    assert v["response"].startswith(v["token"] + ".") and len(v["response"]) > len(v["token"]) + 40
    assert s.get(f"/v1/targets/{tg['id']}").json()["verification"]["response"] == v["response"]

    echo.echo = True
    failed = s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]
    assert failed["state"] == "failed", failed
    assert "does not answer the verification response" in failed["error"]
    assert echo.requests, "the challenge was fetched"
    # The expected body is nowhere in what the verifier sent: an echo cannot produce it.
    for r in echo.requests:
        assert v["response"] not in repr(r)
        mac = v["response"].split(".", 1)[1]
        assert mac not in repr(r)
    assert_problem(s.post("/v1/triggers", json={"name": "t", "schedule": {"every": "1m"}, "target_id": tg["id"]}),
                   422, "target_id")

    echo.echo = False
    echo.challenges[v["token"]] = v["response"] + "\n"
    ok = s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]
    assert ok["state"] == "verified" and ok["error"] is None, ok
    assert ok["addresses"] is None   # an IP-literal URL names its address: nothing to pin
    assert s.post("/v1/triggers", json={"name": "t", "schedule": {"every": "1m"},
                                        "target_id": tg["id"]}).status_code == 201


def test_the_response_is_bound_to_the_target_and_the_deployment_key(api: Api, echo: Origin, monkeypatch):
    """Serving another target's response (same origin, same tenant) does not verify this one, and a
    different deployment key gives a different response."""
    _, s = api.tenant("acme")
    a = s.post("/v1/targets", json={"kind": "http", "url": f"http://127.0.0.1:{echo.port}/a"}).json()
    b = s.post("/v1/targets", json={"kind": "http", "url": f"http://127.0.0.1:{echo.port}/b"}).json()
    assert a["verification"]["response"] != b["verification"]["response"]
    # b's challenge path answered with a's response body (re-labelled with b's token): refused.
    forged = b["verification"]["token"] + "." + a["verification"]["response"].split(".", 1)[1]
    echo.challenges[b["verification"]["token"]] = forged
    assert s.post(f"/v1/targets/{b['id']}/verify").json()["verification"]["state"] == "failed"
    other = verification_response(api.store, b["verification"]["token"], b["id"])
    assert other == b["verification"]["response"]
    from fireledger.security.derived import derive_from
    from fireledger.security.targets import expected_response

    assert expected_response(derive_from(b"\x08" * 32, "target-verification"), b["verification"]["token"],
                             b["id"]) != other


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_plain_http_name_that_resolves_elsewhere_at_dispatch_is_not_sent_to(engine, request, tmp_path, monkeypatch):
    pg = request.getfixturevalue("pg_server") if engine == "postgres" else None
    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")   # loopback origins: the operator allows them
    verified_at = Origin("127.0.0.1").start()
    # The same port on another loopback address: where the name is moved to after verification.
    elsewhere = Origin("127.0.0.2", verified_at.port).start()
    store = open_store(engine, tmp_path, pg)
    try:
        clock = FakeClock(int(time.time()) * 1_000_000)   # at real time: the origins and tokens are real
        t = add_tenant(store)
        url = f"http://owned.test:{verified_at.port}/hook"
        tg = add_target(store, t, url=url, secret=SECRET, verification="unverified")
        dns = Answers({"owned.test": ["127.0.0.1"]})
        response = verification_response(store, tg.verification_token, tg.id)
        verified_at.challenges[tg.verification_token] = response
        elsewhere.challenges[tg.verification_token] = response   # even a copy of it elsewhere is not proof

        cause, addresses = asyncio.run(prove_ownership(url, tg.verification_token, response,
                                                       EgressPolicy(allow_private=True), resolver=dns))
        assert cause is None and addresses == ("127.0.0.1",)
        now = clock.now().latest_us
        assert store.trust.set_target_verification(t.id, tg.id, "verified", now, now + 3_600_000_000, None, "test", now,
                                             addresses=addresses)
        assert store.trust.target_trust(tg.id).pinned == frozenset({"127.0.0.1"})
        forget_cached()

        def run() -> Any:
            """A new every-second trigger; what is due at its first instant committed, dispatched and recorded."""
            tr, _, first = add_trigger(store, t, tg, {"every": "1s"}, now_us=clock.now().latest_us)
            clock.set(first)
            due = TimingLoop(store, clock, "t1").tick().inserted   # earlier triggers' next fires too
            assert [f.trigger_id for f in due].count(tr.id) == 1

            async def step() -> tuple[int, int]:
                async with Dispatcher(store, clock, "d1", sender=HttpSender(resolver=dns)) as d:
                    return await d.claim_once(), await d.flush()

            assert asyncio.run(step()) == (len(due), len(due))   # every due fire attempted and recorded
            return tr

        # Control: while the name resolves where it was verified, fires are delivered there.
        run()
        assert len(verified_at.hooks()) == 1 and not elsewhere.hooks()

        # The name moves: nothing is sent to the new address, each fire says why.
        dns.answers["owned.test"] = ["127.0.0.2"]
        moved = run()
        assert elsewhere.hooks() == [], "a request reached the address the name was moved to"
        failed = [f for f in store.history.list_fires(t.id, moved.id) if f.state == "failed"]
        assert failed
        cause_text = failed[0].cause
        assert "owned.test now resolves to 127.0.0.2" in cause_text and "verify the target again" in cause_text
        assert failed[0].attempt_list[-1].http_status is None
    finally:
        forget_cached()
        store.close()
        verified_at.stop()
        elsewhere.stop()


def test_only_the_addresses_that_answered_are_pinned(echo: Origin):
    """A name with two addresses, only one serving the response: the pin holds that one only, and a
    name none of whose addresses answer is not verified."""
    silent = Origin("127.0.0.3", echo.port).start()
    try:
        echo.challenges["tok"] = "tok.mac"
        url = f"http://two.test:{echo.port}/hook"
        dns = Answers({"two.test": ["127.0.0.3", "127.0.0.1"]})
        policy = EgressPolicy(allow_private=True)
        assert asyncio.run(prove_ownership(url, "tok", "tok.mac", policy, resolver=dns)) == (None, ("127.0.0.1",))
        dns.answers["two.test"] = ["127.0.0.3"]
        cause, pinned = asyncio.run(prove_ownership(url, "tok", "tok.mac", policy, resolver=dns))
        assert pinned is None and cause is not None and "127.0.0.3" in cause and "HTTP 404" in cause
    finally:
        silent.stop()


def test_a_plain_http_name_verified_without_addresses_is_not_usable(api: Api):
    """A verification that recorded no pin (made before the pin existed, or set by hand) does not
    make a plain-http name usable: the write-time check says to verify again."""
    _, s = api.tenant("acme")
    tg = s.post("/v1/targets", json={"kind": "http", "url": "http://owned.test/hook"}).json()
    now = api.clock.now().latest_us
    assert api.store.trust.set_target_verification(api.store.trust.target_trust(tg["id"]).tenant_id, tg["id"],
                                                   "verified",
                                             now, now + 3_600_000_000, None, "test", now)
    body = assert_problem(s.post("/v1/triggers", json={"name": "t", "schedule": {"every": "1m"},
                                                       "target_id": tg["id"]}), 422, "target_id")
    assert "verify it again" in body["detail"]


def test_verifications_under_the_old_challenge_are_void_after_the_upgrade(tmp_path: Path):
    """A database migrated from before the keyed challenge: its verified http targets must be verified
    again (their proof could have come from an echoing origin); queues and internal targets stay."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_us BIGINT)")
    for version, sql in migration_files("sqlite"):
        if version >= 9:
            break
        conn.executescript(sql)
        conn.execute("INSERT INTO schema_migrations VALUES (?, 0)", (version,))
    conn.execute("INSERT INTO tenants (id, name, created_us) VALUES ('tn_a', 'a', 0)")
    for tid, kind, url in (("tg_http", "http", "https://hooks.example.com/x"), ("tg_q", "queue", None)):
        conn.execute("INSERT INTO targets (id, tenant_id, kind, url, secret, verification_state, "
                     "verification_token, created_us, verified_us, verification_expires_us) "
                     "VALUES (?, 'tn_a', ?, ?, 's', 'verified', 'tok', 0, 1, 9000000000000000)", (tid, kind, url))
    conn.commit()
    conn.close()
    store = Store.open(f"sqlite:///{db}")
    try:
        old = store.trust.target_trust("tg_http")
        assert old.state == "unverified" and old.expires_us is None and "verify again" in old.error
        assert store.trust.target_trust("tg_q").state == "verified"
    finally:
        store.close()


def test_api_context_resolver_is_used_for_the_challenge(api: Api, echo: Origin):
    """Through the API: a plain-http name verifies against the addresses its name resolves to, and
    the view lists the pinned addresses."""
    ctx = api.app.state.fireledger
    api.app.state.fireledger = replace(ctx, resolver=Answers({"owned.test": ["127.0.0.1"]}))
    _, s = api.tenant("acme")
    tg = s.post("/v1/targets", json={"kind": "http", "url": f"http://owned.test:{echo.port}/hook"}).json()
    echo.challenges[tg["verification"]["token"]] = tg["verification"]["response"]
    v = s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]
    assert v["state"] == "verified" and v["addresses"] == ["127.0.0.1"], v
