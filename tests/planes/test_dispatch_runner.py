"""The attempt runner with real parts in one process: real SQLite/PostgreSQL, the real timing loop,
real HTTP to local servers. Queue and internal targets, retries kept in their lane, backfill fires,
and per-attempt tokens that the receiver helper rejects when tampered with."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from typing import Any

import pytest
from aiohttp import web

from fireledger.clock import FakeClock, SystemClock
from fireledger.dispatch.credentials import KeyRingFile
from fireledger.dispatch.internal import InternalFailure, InternalRegistry
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import FireKey, from_us, new_id
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Policies, Target
from fireledger.receiver import Receiver, ReceiverError
from fireledger.recurrence import format_instant
from fireledger.security.envelope import cipher_for, sealed_target
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger, open_store, run_planes_until

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000


@pytest.fixture
def sqlite_store(tmp_path):
    s = open_store("sqlite", tmp_path, None)
    yield s
    s.close()


@pytest.fixture
def sink():
    s = SinkServer(secrets=[SECRET])
    s.start_in_thread()
    yield s
    s.stop()


def run_until(planes, predicate, timeout_s: float) -> None:
    asyncio.run(run_planes_until(planes, predicate, timeout_s))


def at_spec(clock, ahead_s: int = 1) -> dict[str, str]:
    now = clock.now().latest_us
    return {"at": format_instant(from_us((now // S + ahead_s) * S))}


def put_fires(store, trig, instants, lane: Lane, kind: FireKind) -> None:
    """Commit fires directly, as a backfill (another issue) will."""
    fires = tuple(NewFire(trig.tenant_id, trig.id, us, 0, 1, kind, lane, FireState.PENDING, us, "2026f", "t")
                  for us in instants)
    row = store.registry.get_trigger(trig.tenant_id, trig.id)
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
    assert len(o.inserted) == len(instants)


def test_queue_target_end_to_end(store):
    clock = SystemClock(declared_eps_us=2_000)
    t = add_tenant(store)
    q = Target(new_id("tg"), t.id, "queue", None, SECRET, "verified", "", clock.now().latest_us)
    store.registry.create_target(sealed_target(store, q))
    trig, _, _ = add_trigger(store, t, q, at_spec(clock), now_us=clock.now().latest_us, payload={"n": 7})
    d = Dispatcher(store, clock, "d1")
    timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: d.wake())
    run_until([d, timing], lambda: store.dispatch.queue_stats(t.id, q.id, clock.now().latest_us)[0] == 1, 20)
    [f] = store.history.list_fires(t.id, trig.id)
    assert f.state == "delivered" and f.lane == "on-time" and f.attempt_list[0].result == "delivered"
    [m] = store.dispatch.queue_pull(t.id, q.id, clock.now().latest_us, 10, 30 * S)
    assert m.key == FireKey(t.id, trig.id, f.scheduled_us, 0)
    assert json.loads(cipher_for(store).open(t.id, trig.id, f.version, m.payload)) == {"n": 7}   # stored sealed


def test_internal_targets_outcomes(sqlite_store):
    store = sqlite_store
    clock = SystemClock(declared_eps_us=2_000)
    reg = InternalRegistry()
    calls: list[Any] = []
    flaky_seen: dict[str, int] = {}
    released = threading.Event()

    def ok(call):
        calls.append(call)

    async def async_ok(call):
        calls.append(call)

    def refuse(call):
        raise InternalFailure("no")

    def flaky(call):
        flaky_seen[call.fire_key] = flaky_seen.get(call.fire_key, 0) + 1
        if flaky_seen[call.fire_key] == 1:
            raise RuntimeError("transient, with payload text that must not be recorded")

    def slow(call):
        # A target that overruns its timeout: it blocks (bounded) until the test releases it.
        released.wait(2.5)

    t = add_tenant(store)
    other = add_tenant(store, "other")
    reg.register("ok", ok, tenants={t.id})
    reg.register("async.ok", async_ok, public=True)
    reg.register("refuse", refuse, tenants={t.id})
    reg.register("flaky", flaky, tenants={t.id, other.id})
    reg.register("slow", slow, tenants={t.id})
    reg.register("private", ok, tenants={other.id})
    now = clock.now().latest_us
    triggers = {}
    for name in ("ok", "async.ok", "refuse", "flaky", "slow", "private", "missing"):
        tg = Target(new_id("tg"), t.id, "internal", f"internal:{name}", SECRET, "verified", "", now)
        store.registry.create_target(sealed_target(store, tg))
        pol = Policies(timeout_s=1.0, max_attempts=2)
        triggers[name], _, _ = add_trigger(store, t, tg, at_spec(clock), now_us=now, payload={"p": name},
                                           policies=pol)
    d = Dispatcher(store, clock, "d1", internal=reg)
    timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: d.wake())

    def state(name):
        fs = store.history.list_fires(t.id, triggers[name].id)
        return fs[0] if fs else None

    def settled():
        return all(state(n) is not None and state(n).state not in ("pending", "dispatching") for n in triggers)

    try:
        run_until([d, timing], settled, 30)
    finally:
        released.set()
    assert state("ok").state == "delivered" and state("async.ok").state == "delivered"
    assert {c.payload["p"] for c in calls} == {"ok", "async.ok", "private"} - {"private"}
    c0 = next(c for c in calls if c.payload["p"] == "ok")
    assert c0.fire_key == str(FireKey(t.id, triggers["ok"].id, state("ok").scheduled_us, 0))
    assert c0.lane == "on-time" and c0.attempt == 1 and c0.scheduled_instant.tzinfo is not None
    refused = state("refuse")
    assert refused.state == "failed" and refused.cause == "failed: internal callable raised InternalFailure"
    fl = state("flaky")
    assert fl.state == "delivered" and [a.result for a in fl.attempt_list] == ["retry", "delivered"]
    assert "payload" not in (fl.attempt_list[0].error or "") and fl.attempt_list[0].error.endswith("RuntimeError")
    sl = state("slow")
    assert sl.state == "unknown" and [a.result for a in sl.attempt_list] == ["unknown", "unknown"]
    for a in sl.attempt_list:   # each attempt ended at its deadline (1 s), not before
        assert 0.9 * S <= a.finished_us - a.started_us <= 2.5 * S
    assert state("private").state == "failed" and "not open to this tenant" in state("private").cause
    assert state("missing").state == "failed" and "no internal callable 'missing'" in state("missing").cause


def test_retries_stay_in_their_lane_and_backfill_is_delivered(store, sink):
    start = int(time.time()) * S
    clock = FakeClock(start)
    t = add_tenant(store, now_us=start)
    flaky = add_target(store, t, url=f"{sink.base_url}/fail-first/1", secret=SECRET, now_us=start)
    trig, _, _ = add_trigger(store, t, flaky, {"every": "3600s"}, now_us=start, policies=Policies(max_attempts=3))
    now = clock.now().latest_us
    put_fires(store, trig, [now - 120 * S, now - 100 * S], Lane.CATCH_UP, FireKind.CATCH_UP)
    put_fires(store, trig, [now - 7200 * S], Lane.BACKFILL, FireKind.BACKFILL)
    done = lambda: all(f.state == "delivered" for f in store.history.list_fires(t.id, trig.id))  # noqa: E731

    async def steps() -> Dispatcher:
        # Step the runner a second of fake time at a time: recovery lanes are paced and retries wait.
        async with Dispatcher(store, clock, "d1") as d:
            for _ in range(120):
                await d.claim_once()
                await d.flush()
                if done():
                    break
                clock.advance(S)
        return d

    d = asyncio.run(steps())
    assert done(), [(f.lane, f.state) for f in store.history.list_fires(t.id, trig.id)]
    recs = sink.records()
    by_key: dict[str, list[dict]] = {}
    for r in recs:
        by_key.setdefault(r["fire_key"], []).append(r)
    assert len(by_key) == 3
    for key, rs in by_key.items():
        f = store.history.get_fire(FireKey.parse(key))
        assert [r["attempt"] for r in rs] == [1, 2] and {r["lane"] for r in rs} == {f.lane}
        assert {r["kind"] for r in rs} == {f.kind}
    assert {f.lane for f in store.history.list_fires(t.id, trig.id)} == {"catch-up", "backfill"}
    # Six attempts in all, each charged to the tenant's quota and paced in its recovery lane.
    assert d.admitted["catch-up"] == 4 and d.admitted["backfill"] == 2


class Capture:
    """A local endpoint that keeps the exact headers and body of every request (answers 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.base_url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def handle(request: web.Request) -> web.Response:
            self.requests.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
            return web.json_response({"ok": True})

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.base_url = f"http://{host}:{port}"
            return runner

        runner = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> Capture:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _b64(d: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()


def test_dispatched_tokens_verify_and_tampering_is_rejected(sqlite_store, tmp_path):
    store = sqlite_store
    clock = SystemClock(declared_eps_us=2_000)
    keys = KeyRingFile(tmp_path / "keys.json")
    issuer = "http://127.0.0.1:9"
    with Capture() as cap:
        t = add_tenant(store)
        url = f"{cap.base_url}/hook"
        tg = add_target(store, t, url=url, secret=SECRET)
        add_trigger(store, t, tg, at_spec(clock), now_us=clock.now().latest_us,
                    policies=Policies(timeout_s=5.0))
        d = Dispatcher(store, clock, "d1", keys=keys, issuer=issuer)
        timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: d.wake())
        run_until([d, timing], lambda: len(cap.requests) >= 1, 20)
    headers, body = cap.requests[0]
    jwks = keys.ring().jwks()
    good = Receiver(SECRET, audience=url, issuer=issuer, jwks=jwks)
    delivery = good.verify(headers, body)
    assert delivery.attempt == 1 and not delivery.duplicate

    def rejected(receiver: Receiver, h: dict[str, str], b: bytes, now: float | None = None) -> str:
        with pytest.raises(ReceiverError) as exc:
            receiver.verify(h, b, now=now)
        return exc.value.reason

    fresh = lambda: Receiver(SECRET, audience=url, issuer=issuer, jwks=jwks)  # noqa: E731
    # Wrong audience: a token minted for another target.
    assert rejected(Receiver(SECRET, audience=f"{cap.base_url}/other", issuer=issuer, jwks=jwks),
                    headers, body) == "token audience mismatch"
    # Expired: the token lives until the attempt's deadline (timeout + 1 s), plus at most 5 s leeway.
    token = headers["authorization"].removeprefix("Bearer ")
    exp = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "==="))["exp"]
    assert exp - int(headers["webhook-timestamp"]) == 6
    assert rejected(fresh(), headers, body, now=exp + 6) == "token expired"
    # alg=none: the same claims, unsigned.
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "==="))
    kid = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "==="))["kid"]
    none = f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': kid})}.{_b64(claims)}."
    assert rejected(fresh(), {**headers, "authorization": f"Bearer {none}"}, body) == "token algorithm not allowed"
    # Swapped body: the signature no longer matches; re-signed with the secret, the token's body hash
    # still catches it.
    doc = json.loads(body)
    doc["payload"] = {"swapped": True}
    swapped = json.dumps(doc, separators=(",", ":")).encode()
    assert rejected(fresh(), headers, swapped) == "signature mismatch"
    from fireledger.dispatch.signing import build_headers

    resigned = {**headers, **build_headers(SECRET, headers["webhook-id"], int(headers["webhook-timestamp"]), swapped)}
    assert rejected(fresh(), resigned, swapped) == "body does not match token"


def _docstring_example(marker: str) -> str:
    """The indented code block after ``marker`` in ``fireledger.receiver``'s docstring, dedented."""
    import textwrap

    import fireledger.receiver as mod

    doc = mod.__doc__ or ""
    block = doc.split(marker, 1)[1].split("::", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip() and not line.startswith("    "):
            break
        lines.append(line)
    return textwrap.dedent("\n".join(lines))


def test_the_receiver_docs_fastapi_example_accepts_a_real_dispatch(sqlite_store, tmp_path, monkeypatch):
    """The FastAPI example in ``fireledger.receiver``'s docstring, run as written (placeholders filled
    in) against a request the attempt runner really sent: accepted once, then a duplicate, and a
    tampered body refused with 401."""
    from fastapi.testclient import TestClient

    import fireledger.receiver as receiver_mod

    store = sqlite_store
    clock = SystemClock(declared_eps_us=2_000)
    keys = KeyRingFile(tmp_path / "keys.json")
    issuer = "https://fireledger.example.com"
    url = "https://hooks.example.com/fire"
    with Capture() as cap:
        t = add_tenant(store)
        tg = add_target(store, t, url=f"{cap.base_url}/fire", secret=SECRET)
        add_trigger(store, t, tg, at_spec(clock), now_us=clock.now().latest_us)
        d = Dispatcher(store, clock, "d1", keys=keys, issuer=issuer)
        timing = TimingLoop(store, clock, "t1", on_committed=lambda fires: d.wake())
        run_until([d, timing], lambda: len(cap.requests) >= 1, 20)
    headers, body = cap.requests[0]
    # The example registers the target URL as audience; our sink had a loopback URL: re-mint for the
    # documented URL so the token is exactly what that target would receive.
    from fireledger.dispatch.credentials import authorization_header, body_sha256, mint

    ts = int(headers["webhook-timestamp"])
    doc = json.loads(body)
    token = mint(keys.ring(), issuer=issuer, audience=url, subject=doc["trigger_id"], fire_key=doc["fire_key"],
                 attempt=doc["attempt"], body_sha256=body_sha256(body), now_s=ts, expires_s=ts + 31)
    headers = {**headers, **{k.lower(): v for k, v in authorization_header(token).items()}}
    monkeypatch.setattr(receiver_mod, "jwks_from_url", lambda u: (lambda: keys.ring().jwks()))
    code = _docstring_example("FastAPI (this module itself needs neither FastAPI nor Flask)")
    assert "app = FastAPI()" in code and '"whsec_..."' in code
    code = code.replace('"whsec_..."', repr(SECRET))
    done: list[Any] = []

    async def do_the_work(trigger_id, scheduled_instant, payload):
        done.append((trigger_id, scheduled_instant, payload))

    ns: dict[str, Any] = {"do_the_work": do_the_work}
    exec(compile(code, "receiver-docs-example", "exec"), ns)
    client = TestClient(ns["app"])
    send = {k: v for k, v in headers.items() if k not in ("host", "content-length")}
    r1 = client.post("/fire", content=body, headers=send)
    assert r1.status_code == 200 and r1.json() == {"ok": True}, r1.text
    r2 = client.post("/fire", content=body, headers=send)
    assert r2.json() == {"ok": True, "duplicate": True} and len(done) == 1
    r3 = client.post("/fire", content=body.replace(b'"payload"', b'"payload" '), headers=send)
    assert r3.status_code == 401
