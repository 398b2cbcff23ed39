"""A target is a privilege (invariant 12): ownership proved by the HTTP challenge on a real sink,
unverified or lapsed targets refused at write time, a lapsed or failed verification stops delivery
at dispatch (recorded with a cause), and the egress guard refuses loopback/private/metadata
addresses unless the operator allows them — all over real sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from apikit import Api, Session, assert_problem
from fireledger.clock import FakeClock
from fireledger.dispatch.http import HttpRequest, HttpSender
from fireledger.dispatch.runner import Dispatcher
from fireledger.security.egress import EgressPolicy, EgressRefused, GuardedResolver, guarded_connector
from fireledger.security.targets import VERIFICATION_TTL_S, expected_response, fetch_challenge, forget_cached
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger, open_store

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer(secrets=[SECRET])
    s.start_in_thread()
    yield s
    s.stop()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path, allow_private_targets=True)   # the sink is on loopback: the operator allows it
    yield a
    a.assert_no_sentinel()
    a.close()


def _trigger_body(target_id: str) -> dict:
    return {"name": "t", "schedule": {"every": "1m"}, "target_id": target_id}


# --- the challenge, through the API --------------------------------------------------------------


def test_unverified_target_is_refused_at_write_time_until_the_challenge_is_served(api: Api, sink: SinkServer):
    _, s = api.tenant("acme")
    tg = s.target(f"{sink.base_url}/hook", verified=False)
    assert tg["verification"]["state"] == "unverified"
    before = api.snapshot()
    body = assert_problem(s.post("/v1/triggers", json=_trigger_body(tg["id"])), 422, "target_id")
    assert "not verified" in body["detail"] and "/verify" in body["detail"]
    assert api.snapshot() == before

    failed = s.post(f"/v1/targets/{tg['id']}/verify")          # nothing served yet
    assert failed.status_code == 200, failed.text
    v = failed.json()["verification"]
    assert v["state"] == "failed" and "HTTP 404" in v["error"] and v["expires_at"] is None
    assert_problem(s.post("/v1/triggers", json=_trigger_body(tg["id"])), 422, "target_id")

    sink.add_challenge(tg["verification"]["token"], tg["verification"]["response"])
    ok = s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]
    assert ok["state"] == "verified" and ok["error"] is None
    assert ok["verified_at"] == "2026-03-27T12:00:00Z" and ok["expires_at"] == "2026-04-26T12:00:00Z"
    assert s.get(f"/v1/targets/{tg['id']}").json()["verification"] == ok
    assert s.post("/v1/triggers", json=_trigger_body(tg["id"])).status_code == 201

    # The verification lapses after 30 days: a new trigger at it is refused again, with the instant.
    api.clock.advance(VERIFICATION_TTL_S * S)
    lapsed = assert_problem(s.post("/v1/triggers", json=_trigger_body(tg["id"])), 422, "target_id")
    assert "lapsed at 2026-04-26T12:00:00Z" in lapsed["detail"]
    actions = [i["action"] for i in s.get("/v1/audit").json()["items"]]
    assert actions.count("target.verify") == 2


def test_challenge_must_answer_exactly_the_response_without_redirects(sink: SinkServer):
    token = "tok-" + "x" * 20
    response = expected_response(b"k" * 32, token, "tg_1")
    policy = EgressPolicy(allow_private=True)

    async def run(app: web.Application) -> str | None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await fetch_challenge(f"http://127.0.0.1:{port}/hook", token, policy, expected=response,
                                         timeout_s=5)
        finally:
            await runner.cleanup()

    def app_answering(handler) -> web.Application:
        a = web.Application()
        a.router.add_get("/.well-known/fireledger-verification/{token}", handler)
        return a

    async def wrong(_r: web.Request) -> web.Response:
        return web.Response(text=token)   # the token alone (what an echoing origin can answer)

    async def redirect(_r: web.Request) -> web.Response:
        raise web.HTTPFound(f"{sink.base_url}/.well-known/fireledger-verification/{token}")

    async def huge(_r: web.Request) -> web.Response:
        return web.Response(text=response + " " * 5000)

    async def right(_r: web.Request) -> web.Response:
        return web.Response(text=response + "\n")

    sink.add_challenge(token, response)   # the redirect would land on a page that does answer: not followed
    assert "does not answer the verification response" in asyncio.run(run(app_answering(wrong)))
    assert "redirects are not followed" in asyncio.run(run(app_answering(redirect)))
    assert "more than 1024 bytes" in asyncio.run(run(app_answering(huge)))
    assert asyncio.run(run(app_answering(right))) is None
    # Loopback is refused by the guard unless the operator allows it (no connection is made).
    refused = asyncio.run(fetch_challenge(f"{sink.base_url}/hook", token, EgressPolicy(allow_private=False),
                                          expected=response))
    assert refused is not None and refused.startswith("egress refused: 127.0.0.1") and "loopback" in refused


def test_verify_is_admin_only_and_another_tenants_target_is_absent(api: Api, sink: SinkServer):
    from fireledger.control.auth import hash_token, new_token
    from fireledger.domain.keys import new_id
    from fireledger.domain.model import Principal

    tenant_id, s = api.tenant("acme")
    tg = s.target(f"{sink.base_url}/hook", verified=False)
    token = new_token()
    api.store.trust.create_principal(Principal(new_id("pr"), tenant_id, "r", frozenset({"reader", "author"}), 0),
                               hash_token(token))
    assert_problem(Session(api, token).post(f"/v1/targets/{tg['id']}/verify"), 403)
    _, b = api.tenant("other")
    assert_problem(b.post(f"/v1/targets/{tg['id']}/verify"), 404)
    assert api.store.trust.target_trust(tg["id"]).state == "unverified"


# --- dispatch-time re-check ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_lapsed_or_failed_verification_is_not_called_at_dispatch(engine, request, tmp_path, sink):
    pg = request.getfixturevalue("pg_server") if engine == "postgres" else None
    store = open_store(engine, tmp_path, pg)
    try:
        now = int(time.time()) * S   # a fake clock at real time: the sink checks signatures against its own
        clock = FakeClock(now)
        t = add_tenant(store, now_us=now)
        good = add_target(store, t, url=f"{sink.base_url}/good", secret=SECRET, now_us=now)
        lapsing = add_target(store, t, url=f"{sink.base_url}/lapsing", secret=SECRET, now_us=now)
        failing = add_target(store, t, url=f"{sink.base_url}/failing", secret=SECRET, now_us=now)
        spec = {"every": "1s"}
        tr_good, _, first = add_trigger(store, t, good, spec, now_us=now)
        tr_lapsing, _, _ = add_trigger(store, t, lapsing, spec, now_us=now)
        tr_failing, _, _ = add_trigger(store, t, failing, spec, now_us=now)
        assert first is not None
        # Verified at definition; then one lapses (its expiry passes) and one fails a re-verification.
        assert store.trust.set_target_verification(t.id, lapsing.id, "verified", now - 60 * S, now + 1, None, "t", now)
        assert store.trust.set_target_verification(t.id, failing.id, "failed", None, None, "HTTP 404", "t", now)
        forget_cached()
        timing = TimingLoop(store, clock, "t1")

        async def steps() -> list[tuple[int, int]]:
            rounds = []
            async with Dispatcher(store, clock, "d1") as d:
                for k in range(2):   # two instants of each trigger, each dispatched and recorded
                    clock.set(first + k * S)
                    assert len(timing.tick().inserted) == 3
                    rounds.append((await d.claim_once(), await d.flush()))
            return rounds

        assert asyncio.run(steps()) == [(3, 3), (3, 3)]
        assert [f.state for f in store.history.list_fires(t.id, tr_good.id)] == ["delivered", "delivered"]
        assert {r["trigger_id"] for r in sink.records()} == {tr_good.id}, "a refused target was called"
        for tr, why in ((tr_lapsing, "lapsed at"), (tr_failing, "not verified (state failed (HTTP 404))")):
            fires = [f for f in store.history.list_fires(t.id, tr.id) if f.state == "failed"]
            assert len(fires) == 2
            for f in fires:
                assert f.cause.startswith("failed: not sent: target ") and why in f.cause, f.cause
                assert f.attempt_list[-1].http_status is None
    finally:
        forget_cached()
        store.close()


# --- the egress guard ------------------------------------------------------------------------------


def _request(url: str) -> HttpRequest:
    return HttpRequest(url=url, secret=SECRET, fire_key="tn_a.tr_b.20260101T000000Z.0", msg_id="m1",
                       timestamp=int(time.time()), body=b"{}", timeout_s=5)


def test_dispatch_refuses_loopback_unless_the_operator_allows_it(sink: SinkServer, monkeypatch):
    port = sink.port

    async def send_all(urls: list[str]) -> list:
        async with HttpSender() as sender:
            return [await sender.send(_request(u)) for u in urls]

    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "0")
    urls = [f"http://127.0.0.1:{port}/a", f"http://localhost:{port}/b", f"http://[::ffff:127.0.0.1]:{port}/c",
            f"http://[::1]:{port}/d", "http://169.254.169.254/latest/meta-data/"]
    results = asyncio.run(send_all(urls))
    for url, res in zip(urls, results, strict=True):
        assert res.outcome == "failed" and not res.sent, (url, res)
        assert "egress refused" in res.error, (url, res.error)
    assert "metadata" in results[-1].error
    assert sink.records() == []
    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")
    allowed, metadata = asyncio.run(send_all([f"http://127.0.0.1:{port}/ok", "http://169.254.169.254/"]))
    assert allowed.outcome == "delivered" and len(sink.records()) == 1
    assert metadata.outcome == "failed" and "metadata" in metadata.error    # never, whatever is allowed


class _Answers(aiohttp.abc.AbstractResolver):
    """A DNS answer this machine cannot produce (no network): the guard's decision is what is tested."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.calls = 0

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        self.calls += 1
        return [{"hostname": host, "host": a, "port": port, "family": socket.AF_INET6 if ":" in a else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for a in self.answers[host]]

    async def close(self) -> None:
        return None


def test_a_name_is_resolved_once_and_refused_when_any_address_is_private(sink: SinkServer):
    answers = _Answers({"rebinding.test": ["93.184.215.14", "10.0.0.7"], "sink.test": ["127.0.0.1"]})

    async def go() -> tuple:
        with pytest.raises(EgressRefused, match=r"rebinding\.test \(10\.0\.0\.7\) is a private address"):
            await GuardedResolver(EgressPolicy(allow_private=False), answers).resolve("rebinding.test", 80)
        connector = guarded_connector(EgressPolicy(allow_private=True), resolver=answers)
        async with aiohttp.ClientSession(connector=connector) as session:
            r1 = await session.post(f"http://sink.test:{sink.port}/pinned", data=b"{}")
            r2 = await session.post(f"http://sink.test:{sink.port}/pinned", data=b"{}")
            return r1.status, r2.status

    calls_before = answers.calls
    assert asyncio.run(go()) == (200, 200)
    assert answers.calls - calls_before == 2    # one for the refused name, one for sink.test (then cached)
    assert [r["path"] for r in sink.records()] == ["/pinned", "/pinned"]
