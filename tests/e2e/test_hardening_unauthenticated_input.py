"""Hardening (issue 13, high #3), class: **no unauthenticated input may hold unbounded memory, time
or connections** — the members beyond the request body (decision 0092).

Found by the red team against the merged tree, on a real ``fireledger control`` process over real
sockets:

* a request head (one endless header, thousands of headers, an endless URL) was read into memory
  without limit — 218 MiB of one header value grew the process by 276 MiB and was never answered;
* a connection that sends nothing, or a head trickling in a header every half second, was held
  open forever (slowloris);
* nothing capped the number of open connections (each one a file descriptor the store and the
  dispatcher need too);
* a body arriving a byte at a time held its connection for as long as the client liked, and any
  number of connections could each hold a body just under the route's cap.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from bodykit import read_response
from e2e import Service, free_port, wait_until
from fireledger.control.bodylimit import BodyLimitMiddleware
from fireledger.control.httpproto import HEAD_MAX_BYTES, HEAD_TIMEOUT_S, BoundedHttpToolsProtocol

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work: Path = tmp_path_factory.mktemp("unauth")
    svc = Service(f"sqlite:///{work}/u.db", work, command="control",
                  env={"FIRELEDGER_MAX_CONNECTIONS": "12"}).start()
    try:
        yield svc
    finally:
        svc.stop()


def healthy(port: int) -> bool:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_response(sock, time.monotonic() + 10)[0] == 200
    finally:
        sock.close()


def stream_head(port: int, start: bytes, chunk: bytes, planned: int, timeout_s: float = 60) -> dict[str, Any]:
    """Send ``start`` then ``chunk`` repeatedly (up to ``planned`` bytes) until the server answers."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    sock.sendall(start)
    sent = 0
    try:
        while sent < planned and time.monotonic() < deadline:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        status, headers, body = read_response(sock, deadline)
    finally:
        sock.close()
    return {"status": status, "headers": headers, "body": body, "sent": sent}


HEADS = {
    "one-endless-header": (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ", b"a" * 65536),
    "many-headers": (b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
                     b"".join(b"X-%d: v\r\n" % i for i in range(4000))),
    "endless-url": (b"GET /healthz?", b"a=b&" * 16384),
    "endless-header-to-v1": (b"POST /v1/triggers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ",
                             b"A" * 65536),
}


@pytest.mark.parametrize("kind", list(HEADS))
def test_unauthenticated_input_a_head_over_the_limit_is_refused_before_it_is_read(control: Service,
                                                                                  kind: str) -> None:
    start, chunk = HEADS[kind]
    out = stream_head(control.port, start, chunk, 256 * MiB)   # type: ignore[arg-type]
    assert out["status"] == 431, (out["status"], out["body"][:200])
    assert out["headers"]["content-type"].startswith("application/problem+json")
    assert out["headers"]["connection"] == "close"
    doc = json.loads(out["body"])
    assert doc["status"] == 431 and str(HEAD_MAX_BYTES) in doc["detail"]
    assert out["sent"] < 16 * MiB, out["sent"]   # the server stopped reading long before
    assert healthy(control.port)  # type: ignore[arg-type]


def test_unauthenticated_input_a_head_at_the_limit_still_passes(control: Service) -> None:
    pad = b"X-Pad: " + b"p" * (HEAD_MAX_BYTES - 200) + b"\r\n"
    sock = socket.create_connection(("127.0.0.1", control.port), timeout=10)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n")
        assert read_response(sock, time.monotonic() + 10)[0] == 200
    finally:
        sock.close()


def test_unauthenticated_input_idle_and_trickling_connections_are_closed_at_the_head_timeout(
        control: Service) -> None:
    t0 = time.monotonic()
    idle = socket.create_connection(("127.0.0.1", control.port), timeout=HEAD_TIMEOUT_S * 3)
    slow = socket.create_connection(("127.0.0.1", control.port), timeout=HEAD_TIMEOUT_S * 3)
    try:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        n = 0
        while not select.select([slow], [], [], 0.5)[0]:   # one header every half second, never the end
            assert time.monotonic() - t0 < HEAD_TIMEOUT_S * 3, "the trickling head was never cut"
            try:
                slow.sendall(b"X-%d: v\r\n" % n)
            except (BrokenPipeError, ConnectionResetError):
                break
            n += 1
        status, _, body = read_response(slow, time.monotonic() + 10)
        assert status == 408 and json.loads(body)["status"] == 408
        assert HEAD_TIMEOUT_S - 1 <= time.monotonic() - t0 < HEAD_TIMEOUT_S * 2
        status, _, _ = read_response(idle, time.monotonic() + HEAD_TIMEOUT_S * 2)
        assert status == 408   # a connection that never sent a byte is closed as well
    finally:
        idle.close()
        slow.close()
    assert healthy(control.port)  # type: ignore[arg-type]


def test_unauthenticated_input_connections_past_the_cap_are_answered_503_and_closed(control: Service) -> None:
    held: list[socket.socket] = []
    try:
        refused = None
        for _ in range(40):   # the fixture's cap is 12
            sock = socket.create_connection(("127.0.0.1", control.port), timeout=10)
            held.append(sock)
            if select.select([sock], [], [], 0.3)[0]:
                refused = sock
                break
        assert refused is not None, "no connection was refused"
        assert len(held) <= 13, len(held)
        status, headers, body = read_response(refused, time.monotonic() + 10)
        assert status == 503 and headers["retry-after"] == "1" and json.loads(body)["status"] == 503
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: healthy(control.port), 10, "a connection to be accepted again")  # type: ignore[arg-type]


# --- bodies: time and the process-wide budget (BodyLimitMiddleware over a real uvicorn) ----------


async def _echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


class _Uvicorn:
    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", http=BoundedHttpToolsProtocol))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> _Uvicorn:
        self.thread.start()
        wait_until(lambda: self.server.started, 10, "uvicorn to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def test_unauthenticated_input_a_body_that_trickles_is_cut_at_the_body_timeout() -> None:
    app = BodyLimitMiddleware(Starlette(routes=[Route("/v1/x", _echo, methods=["POST"])]), timeout_s=1.0)
    with _Uvicorn(app) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        try:
            t0 = time.monotonic()
            sock.sendall(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            while not select.select([sock], [], [], 0.2)[0]:
                assert time.monotonic() - t0 < 10, "the trickling body was never cut"
                sock.sendall(b"a")
            status, headers, body = read_response(sock, time.monotonic() + 10)
            assert status == 408 and headers["connection"] == "close"
            assert json.loads(body)["type"].endswith(":body-timeout")
            assert time.monotonic() - t0 < 5
        finally:
            sock.close()


def test_unauthenticated_input_bodies_in_progress_share_one_budget() -> None:
    inner = BodyLimitMiddleware(Starlette(routes=[Route("/v1/x", _echo, methods=["POST"])]),
                                budget=300_000, timeout_s=30)
    with _Uvicorn(inner) as srv:
        held: list[socket.socket] = []
        try:
            for _ in range(2):   # two bodies of 100,000 of their declared 120,000 bytes, held open
                sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                sock.sendall(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 120000\r\n\r\n" + b"a" * 100_000)
                held.append(sock)
            wait_until(lambda: inner.held == 200_000, 10, "both bodies to be held")
            third = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            held.append(third)
            third.sendall(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 120000\r\n\r\n" + b"a" * 120_000)
            status, headers, body = read_response(third, time.monotonic() + 10)
            assert status == 503 and headers["retry-after"] == "1", (status, body)
            held[0].sendall(b"a" * 20_000)   # the first body completes and is answered
            status, _, body = read_response(held[0], time.monotonic() + 10)
            assert (status, body) == (200, b"120000")
            wait_until(lambda: inner.held == 100_000, 10, "the finished body's bytes to be given back")
        finally:
            for sock in held:
                sock.close()
