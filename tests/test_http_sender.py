"""HttpSender against a real local aiohttp server (no mocks)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from aiohttp import web

from fireledger.dispatch import signing
from fireledger.dispatch.http import HttpRequest, HttpResult, HttpSender, classify_status, parse_retry_after

T = TypeVar("T")
SECRET = signing.new_secret()
TS = 1_900_000_000


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        async with asyncio.timeout(30):  # a hung test fails instead of hanging the run
            return await coro

    return asyncio.run(main())


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer_port: int


@dataclass
class Target:
    base: str
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hang_started: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str) -> str:
        return self.base + path


@asynccontextmanager
async def target() -> AsyncIterator[Target]:
    t = Target(base="")

    async def record(request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        t.seen.append(
            Seen(request.method, request.path, dict(request.headers), await request.read(), peer[1] if peer else 0)
        )

    def handler(fn: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        async def h(request: web.Request) -> web.StreamResponse:
            await record(request)
            return await fn(request)

        return h

    async def ok(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text="ok")

    async def status(request: web.Request) -> web.StreamResponse:
        code = int(request.match_info["code"])
        return web.Response(status=code, text="SECRET-RESPONSE-BODY")

    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": t.url("/ok")})

    async def too_many(request: web.Request) -> web.StreamResponse:
        return web.Response(status=429, headers={"Retry-After": "3"})

    async def unavailable_date(request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=503,
            headers={"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT", "Date": "Wed, 21 Oct 2015 07:28:00 GMT"},
        )

    async def hang(request: web.Request) -> web.StreamResponse:
        t.hang_started.set()
        await t.release.wait()  # never set while the client waits
        return web.Response(status=200)

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        await resp.prepare(request)
        chunk = b"x" * 65536
        try:
            while not t.release.is_set():
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    app = web.Application()
    app.router.add_post("/ok", handler(ok))
    app.router.add_post("/status/{code}", handler(status))
    app.router.add_post("/redirect", handler(redirect))
    app.router.add_post("/429", handler(too_many))
    app.router.add_post("/503date", handler(unavailable_date))
    app.router.add_post("/hang", handler(hang))
    app.router.add_post("/endless", handler(endless))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    t.base = f"http://{host}:{port}"
    try:
        yield t
    finally:
        t.release.set()
        await runner.cleanup()


def request(url: str, *, timeout_s: float = 5.0, msg_id: str = "fk1:1", **kw: Any) -> HttpRequest:
    body = json.dumps({"fire_key": "fk1", "attempt": 1}).encode()
    return HttpRequest(
        url=url,
        secret=SECRET,
        fire_key="fk1",
        msg_id=msg_id,
        timestamp=TS,
        body=body,
        timeout_s=timeout_s,
        **kw,
    )


async def send_one(path: str, **kw: Any) -> tuple[HttpResult, Target]:
    async with target() as t, HttpSender() as sender:
        res = await sender.send(request(t.url(path), **kw))
        return res, t


def test_200_delivered_with_signed_headers() -> None:
    async def main() -> None:
        async with target() as t, HttpSender() as sender:
            req = request(t.url("/ok"), extra_headers={"Authorization": "Bearer abc"})
            res = await sender.send(req)
            assert res.outcome == "delivered"
            assert res.http_status == 200
            assert res.error is None
            assert res.sent is True
            assert res.retry_after_s is None
            assert 0 < res.duration_s < 5
            [seen] = t.seen
            assert seen.method == "POST"
            assert seen.body == req.body
            h = {k.lower(): v for k, v in seen.headers.items()}
            assert h["content-type"] == "application/json"
            assert h["fireledger-fire-key"] == "fk1"
            assert h["webhook-id"] == "fk1:1"
            assert h["webhook-timestamp"] == str(TS)
            assert h["authorization"] == "Bearer abc"
            assert "cookie" not in h
            signing.verify(SECRET, seen.headers, seen.body, now=TS)
            with pytest.raises(signing.SignatureError):
                signing.verify(signing.new_secret(), seen.headers, seen.body, now=TS)

    run(main())


def test_connections_are_pooled() -> None:
    async def main() -> None:
        async with target() as t, HttpSender() as sender:
            for i in range(3):
                res = await sender.send(request(t.url("/ok"), msg_id=f"fk1:{i}"))
                assert res.outcome == "delivered"
            assert len({s.peer_port for s in t.seen}) == 1, "one keep-alive connection reused"

    run(main())


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (201, "delivered"),
        (204, "delivered"),
        (500, "retry"),
        (502, "retry"),
        (503, "retry"),
        (408, "retry"),
        (404, "failed"),
        (400, "failed"),
        (401, "failed"),
        (410, "failed"),
        (304, "failed"),
    ],
)
def test_status_classification(code: int, outcome: str) -> None:
    res, t = run(send_one(f"/status/{code}"))
    assert res.outcome == outcome
    assert res.http_status == code
    assert res.sent is True
    assert len(t.seen) == 1
    if outcome != "delivered":
        assert res.error == f"HTTP {code}"
    assert "SECRET-RESPONSE-BODY" not in (res.error or "")


def test_redirect_is_final_and_not_followed() -> None:
    res, t = run(send_one("/redirect"))
    assert res.outcome == "failed"
    assert res.http_status == 302
    assert [s.path for s in t.seen] == ["/redirect"]


def test_429_retry_after_seconds() -> None:
    res, _ = run(send_one("/429"))
    assert res.outcome == "retry"
    assert res.http_status == 429
    assert res.retry_after_s == 3.0


def test_503_retry_after_http_date_relative_to_date_header() -> None:
    res, _ = run(send_one("/503date"))
    assert res.outcome == "retry"
    assert res.retry_after_s == 10.0


def test_no_answer_within_timeout_is_unknown() -> None:
    res, t = run(send_one("/hang", timeout_s=0.3))
    assert res.outcome == "unknown"
    assert res.http_status is None
    assert res.sent is True
    assert 0.3 <= res.duration_s < 3
    assert t.hang_started.is_set()


def test_timeout_while_waiting_for_a_connection_is_retry_not_unknown() -> None:
    async def main() -> None:
        async with target() as t, HttpSender(limit=1) as sender:
            first = asyncio.create_task(sender.send(request(t.url("/hang"), timeout_s=10)))
            async with asyncio.timeout(5):
                await t.hang_started.wait()
            res = await sender.send(request(t.url("/ok"), timeout_s=0.2))
            assert res.outcome == "retry"
            assert res.sent is False
            assert [s.path for s in t.seen] == ["/hang"], "the second request never reached the target"
            t.release.set()
            assert (await first).outcome == "delivered"

    run(main())


def test_endless_body_is_capped_not_read_to_the_timeout() -> None:
    res, _ = run(send_one("/endless", timeout_s=5))
    assert res.outcome == "delivered"
    assert res.duration_s < 2.5


def test_closed_port_is_retry() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the socket is closed: nothing listens on the port

    async def main() -> HttpResult:
        async with HttpSender() as sender:
            return await sender.send(request(f"http://127.0.0.1:{port}/x", timeout_s=3))

    res = run(main())
    assert res.outcome == "retry"
    assert res.http_status is None
    assert res.sent is False
    assert res.error and "connect" in res.error.lower()


def test_dns_failure_is_retry() -> None:
    async def main() -> HttpResult:
        async with HttpSender() as sender:
            return await sender.send(request("http://no-such-host.invalid/x", timeout_s=3))

    res = run(main())
    assert res.outcome == "retry"
    assert res.sent is False


def test_request_validation() -> None:
    with pytest.raises(ValueError):
        request("ftp://example.com/")
    with pytest.raises(ValueError):
        request("/relative")
    with pytest.raises(ValueError):
        request("http://example.com/", timeout_s=0)
    with pytest.raises(ValueError, match="reserved"):
        request("http://example.com/", extra_headers={"Webhook-Signature": "v1,forged"})
    with pytest.raises(ValueError):
        request("http://example.com/", extra_headers={"x-a": "b\r\nInjected: 1"})
    with pytest.raises(ValueError):
        request("http://example.com/", msg_id="a\nb")
    r = request("http://example.com/")
    assert SECRET not in repr(r)
    assert "fire_key" in repr(r)


def test_closed_sender_refuses_and_loop_binding() -> None:
    sender = HttpSender()

    async def use() -> None:
        async with target() as t:
            assert (await sender.send(request(t.url("/ok")))).outcome == "delivered"

    run(use())
    with pytest.raises(RuntimeError, match="another event loop"):
        run(use())

    async def close() -> None:
        await sender.close()
        await sender.close()
        with pytest.raises(RuntimeError, match="closed"):
            await sender.send(request("http://127.0.0.1:1/"))

    run(close())


@pytest.mark.parametrize(
    ("value", "date", "now", "expected"),
    [
        (None, None, None, None),
        ("", None, None, None),
        ("3", None, None, 3.0),
        (" 120 ", None, None, 120.0),
        ("1.5", None, None, 1.5),
        ("-1", None, None, None),
        ("nan", None, None, None),
        ("soon", None, None, None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", "Wed, 21 Oct 2015 07:28:00 GMT", None, 10.0),
        ("Wed, 21 Oct 2015 07:28:10 GMT", None, 1445412480.0, 10.0),
        ("Wed, 21 Oct 2015 07:28:10 GMT", None, None, None),
        ("Wed, 21 Oct 2015 07:27:00 GMT", "Wed, 21 Oct 2015 07:28:00 GMT", None, 0.0),
    ],
)
def test_parse_retry_after(value: str | None, date: str | None, now: float | None, expected: float | None) -> None:
    assert parse_retry_after(value, date_header=date, now=now) == expected


def test_classify_status_table() -> None:
    assert [classify_status(c) for c in (200, 299, 300, 399, 408, 429, 499, 500, 599, 600, 101)] == [
        "delivered",
        "delivered",
        "failed",
        "failed",
        "retry",
        "retry",
        "failed",
        "retry",
        "retry",
        "failed",
        "failed",
    ]
