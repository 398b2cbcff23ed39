"""HttpSender against real local servers (no mocks): an aiohttp app for the contract, raw asyncio
servers (plain and TLS) that count connections for the HTTP/1.1 client underneath (dispatch/wire.py)."""

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


# --- the lean HTTP/1.1 client underneath (dispatch/wire.py): raw servers that count connections ---


@dataclass
class Raw:
    """A raw asyncio HTTP/1.x server: ``answer(n, head)`` gives the bytes to write for the n-th
    request (0-based, over all connections) and whether to close the connection after them; it may
    also be a coroutine function taking the writer (for slow or partial answers)."""

    port: int = 0
    opened: int = 0
    open_now: int = 0
    max_open: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    heads: list[bytes] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    closed_count: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.StreamReader | None = None   # of the request being answered

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


OK_200 = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@asynccontextmanager
async def raw_server(answer: Callable[..., Any], *, hold_s: float = 0.0, ssl: Any = None) -> AsyncIterator[Raw]:
    raw = Raw()
    tasks: set[asyncio.Task[None]] = set()

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        raw.opened += 1
        raw.open_now += 1
        raw.max_open = max(raw.max_open, raw.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                n = len(raw.heads)
                raw.heads.append(head)
                raw.reader = reader
                raw.in_flight += 1
                raw.max_in_flight = max(raw.max_in_flight, raw.in_flight)
                try:
                    if hold_s:
                        await asyncio.sleep(hold_s)  # the target's own work time, not a wait for a condition
                    out = answer(n, head, writer)
                    if asyncio.iscoroutine(out):
                        out = await out
                finally:
                    raw.in_flight -= 1
                if out is None:
                    return
                data, close = out
                writer.write(data)
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            raw.open_now -= 1
            raw.closed_count += 1
            raw.closed.set()
            writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", 0, ssl=ssl)
    raw.port = server.sockets[0].getsockname()[1]
    try:
        yield raw
    finally:
        raw.release.set()
        server.close()
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def keep_ok(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
    return OK_200, False


async def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)   # poll interval, bounded by the timeout above
    assert predicate(), what


def test_sequential_sends_reuse_one_connection_and_the_request_bytes_are_exact() -> None:
    async def main() -> None:
        async with raw_server(keep_ok) as raw, HttpSender(user_agent="fl-test") as sender:
            for i in range(20):
                res = await sender.send(request(raw.url("/hook?a=1&b=%20"), msg_id=f"fk1:{i}"))
                assert (res.outcome, res.http_status, res.sent) == ("delivered", 200, True)
            assert raw.opened == 1, "one keep-alive connection for 20 sequential sends"
            lines = raw.heads[0].decode().split("\r\n")
            assert lines[0] == "POST /hook?a=1&b=%20 HTTP/1.1"
            h = dict(line.split(": ", 1) for line in lines[1:] if line)
            assert h["host"] == f"127.0.0.1:{raw.port}"
            assert h["user-agent"] == "fl-test"
            assert h["content-type"] == "application/json"
            assert h["content-length"] == str(len(request("http://x/").body))
            assert h["webhook-id"] == "fk1:0" and h["fireledger-fire-key"] == "fk1"
            assert not {"cookie", "accept-encoding", "transfer-encoding"} & {k.lower() for k in h}

    run(main())


@pytest.mark.parametrize(("limit", "per_host", "expected"), [(3, 0, 3), (10, 2, 2)])
def test_pool_limits_hold_under_concurrency(limit: int, per_host: int, expected: int) -> None:
    async def main() -> None:
        async with raw_server(keep_ok, hold_s=0.02) as raw, \
                HttpSender(limit=limit, limit_per_host=per_host) as sender:
            results = await asyncio.gather(
                *(sender.send(request(raw.url(), msg_id=f"fk1:{i}")) for i in range(12)))
            assert {r.outcome for r in results} == {"delivered"}
            assert raw.max_in_flight == expected
            assert raw.max_open == expected and raw.opened == expected, "connections reused, never more"

    run(main())


def test_total_limit_counts_idle_connections_of_other_origins() -> None:
    async def main() -> None:
        async with raw_server(keep_ok) as a, raw_server(keep_ok) as b, HttpSender(limit=1) as sender:
            assert (await sender.send(request(a.url()))).outcome == "delivered"
            assert a.open_now == 1
            assert (await sender.send(request(b.url()))).outcome == "delivered"
            await wait_for(lambda: a.open_now == 0, "the idle connection to a is closed to make room")
            assert b.open_now == 1

    run(main())


def test_a_connection_the_peer_closed_while_idle_is_not_used() -> None:
    def once(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
        return OK_200, True   # keep-alive response, then the server closes the idle connection

    async def main() -> None:
        async with raw_server(once) as raw, HttpSender() as sender:
            for i in range(3):
                raw.closed.clear()
                res = await sender.send(request(raw.url(), msg_id=f"fk1:{i}"))
                assert (res.outcome, res.sent) == ("delivered", True), res
                async with asyncio.timeout(5):
                    await raw.closed.wait()   # closed by the server; the client may not have noticed yet
            assert raw.opened == 3 and len(raw.heads) == 3

    run(main())


def test_chunked_body_is_read_to_its_end_and_the_connection_reused() -> None:
    def chunked(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (b"a" * 100, b"b" * 5000, b"c")) + b"0\r\n\r\n"
        return b"HTTP/1.1 202 Accepted\r\ntransfer-encoding: chunked\r\n\r\n" + body, False

    async def main() -> None:
        async with raw_server(chunked) as raw, HttpSender() as sender:
            for i in range(3):
                res = await sender.send(request(raw.url(), msg_id=f"fk1:{i}"))
                assert (res.outcome, res.http_status) == ("delivered", 202)
            assert raw.opened == 1

    run(main())


@pytest.mark.parametrize(
    ("answer", "status", "server_closes"),
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", 200, False),
        (b"HTTP/1.0 201 Created\r\ncontent-length: 2\r\n\r\nok", 201, False),
        (b"HTTP/1.0 200 OK\r\n\r\nbody until the connection ends", 200, True),   # no length: to EOF
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nretry-after: 7\r\nconnection: close\r\n"
         b"content-length: 0\r\n\r\n", 503, False),
        (OK_200 + OK_200, 200, False),   # two answers to one request: the first counts, the connection goes
    ],
)
def test_responses_that_end_the_connection_are_not_pooled(answer: bytes, status: int, server_closes: bool) -> None:
    def closing(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
        return answer, server_closes

    async def main() -> None:
        async with raw_server(closing) as raw, HttpSender() as sender:
            for i in range(2):
                res = await sender.send(request(raw.url(), msg_id=f"fk1:{i}", timeout_s=3))
                assert res.http_status == status and res.outcome == classify_status(status), res
                assert res.duration_s < 2
                await wait_for(lambda: raw.open_now == 0, "the client closed the connection itself")
            assert raw.opened == 2
            if status == 503:
                assert res.retry_after_s == 7.0

    run(main())


def test_body_past_the_cap_closes_the_connection_and_keeps_the_status() -> None:
    big = b"x" * 200_000

    def huge(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
        return b"HTTP/1.1 503 Busy\r\ncontent-length: %d\r\n\r\n" % len(big) + big, False

    async def main() -> None:
        async with raw_server(huge) as raw, HttpSender(body_cap_bytes=1024) as sender:
            res = await sender.send(request(raw.url()))
            assert (res.outcome, res.http_status, res.error) == ("retry", 503, "HTTP 503")
            await wait_for(lambda: raw.open_now == 0, "the connection past the cap is closed")
            res = await sender.send(request(raw.url(), msg_id="fk1:2"))
            assert res.http_status == 503 and raw.opened == 2

    run(main())


def test_slow_body_after_the_status_keeps_the_outcome_within_the_timeout() -> None:
    async def stall(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"y" * 10)
        assert raw.reader is not None
        assert await raw.reader.read() == b"", "the rest of the body never comes: the client hangs up"
        return None

    async def main() -> None:
        nonlocal raw
        async with raw_server(stall) as r, HttpSender() as sender:
            raw = r
            res = await sender.send(request(r.url(), timeout_s=0.4))
            assert (res.outcome, res.http_status, res.sent) == ("delivered", 200, True)
            assert 0.3 < res.duration_s < 2, "the body is waited for only until the deadline"
            await wait_for(lambda: r.open_now == 0, "the half-read connection is closed, not pooled")

    raw: Raw
    run(main())


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "invalid HTTP response"),   # not HTTP
        (b"", "closed before the response"),                          # read the request, said nothing
    ],
)
def test_no_usable_response_after_the_write_is_retry_and_sent(answer: bytes, fragment: str) -> None:
    def bad(n: int, head: bytes, writer: Any) -> tuple[bytes, bool]:
        return answer, True

    async def main() -> None:
        async with raw_server(bad) as raw, HttpSender() as sender:
            res = await sender.send(request(raw.url(), timeout_s=3))
            assert (res.outcome, res.http_status, res.sent) == ("retry", None, True), res
            assert res.error and fragment in res.error
            assert len(raw.heads) == 1, "never resent within one attempt"

    run(main())


def test_cancellation_propagates_and_closes_the_connection() -> None:
    async def never(n: int, head: bytes, writer: Any) -> None:
        assert raw.reader is not None
        assert await raw.reader.read() == b""   # no answer; returns when the client hangs up

    async def main() -> None:
        nonlocal raw
        async with raw_server(never) as raw, HttpSender() as sender:
            task = asyncio.create_task(sender.send(request(raw.url(), timeout_s=10)))
            await wait_for(lambda: len(raw.heads) == 1, "the request arrived")
            raw.closed.clear()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with asyncio.timeout(5):
                await raw.closed.wait()

    raw: Raw
    run(main())


def test_close_closes_pooled_connections() -> None:
    async def main() -> None:
        async with raw_server(keep_ok) as raw:
            sender = HttpSender()
            assert (await sender.send(request(raw.url()))).outcome == "delivered"
            assert raw.open_now == 1
            await sender.close()
            await wait_for(lambda: raw.open_now == 0, "the pooled connection is closed")

    run(main())


def test_constructor_refuses_proxies_and_bad_user_agent() -> None:
    with pytest.raises(ValueError, match="proxy"):
        HttpSender(trust_env=True)
    with pytest.raises(ValueError, match="user_agent"):
        HttpSender(user_agent="a\r\nx-injected: 1")


def _self_signed(tmp: Any) -> tuple[str, str]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fireledger-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_https_verifies_the_certificate_and_sends_sni(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")   # localhost: the operator allows it
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: sni.append(name)  # type: ignore[assignment,return-value]

    async def main() -> None:
        async with raw_server(keep_ok, ssl=server_ctx) as raw:
            url = f"https://localhost:{raw.port}/hook"
            async with HttpSender() as untrusting:   # the default context does not know this CA
                res = await untrusting.send(request(url, timeout_s=3))
                assert (res.outcome, res.sent, res.http_status) == ("retry", False, None), res
                assert res.error and "certificate" in res.error.lower()
            assert raw.heads == []
            trusting = ssl.create_default_context(cafile=cert)
            async with HttpSender(ssl_context=trusting) as sender:
                for i in range(3):
                    res = await sender.send(request(url, msg_id=f"fk1:{i}", timeout_s=3))
                    assert (res.outcome, res.http_status) == ("delivered", 200), res
            assert len(raw.heads) == 3 and b"host: localhost:%d" % raw.port in raw.heads[0]
            assert raw.opened == 1, "the refused handshake never got to HTTP; then one kept-alive connection"
            assert sni and set(sni) == {"localhost"}

    run(main())


def test_a_slot_granted_to_a_waiter_cancelled_before_it_ran_is_given_back() -> None:
    from fireledger.dispatch.pool import Pool
    from fireledger.security.egress import EgressPolicy

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = Pool(loop, limit=1, limit_per_host=0, policy=EgressPolicy(allow_private=True), ssl_context=None)
        flow = ("tn_a", ("http", "127.0.0.1", 9), "/hook")   # slots are per flow (decision 0133)
        pool._take(flow)   # the one slot is in use
        waiter = asyncio.create_task(pool._wait_slot(flow, loop.time() + 5))
        await asyncio.sleep(0)   # the waiter queues
        pool._give_back(flow)   # hands the slot to the waiter...
        waiter.cancel()   # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool._in_use == 0 and pool._can_take(flow), "the granted slot is not leaked"
        await pool.close()

    run(main())
