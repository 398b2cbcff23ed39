"""Hardening, class "an unauthenticated request body can exhaust memory" (issue 13, high #3).

One streaming body cap stands in front of every route (fireledger.control.bodylimit). Against a
real ``fireledger control`` process over real sockets:

* a chunked body far over the limit, to the console's sign-in and sign-out, to ``/v1/triggers`` and
  to a route that does not exist, is answered ``413`` problem+json *before the client has finished
  sending it* — the server stopped reading (on the old tree the console read all of it and answered
  303, and an unknown route answered 404 after reading it);
* a declared ``Content-Length`` over the limit is answered at once, without a byte of body sent;
* a body exactly at a route's limit passes the cap (the route answers it), one byte more does not.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bodykit import read_response, send_chunked
from e2e import Service, new_tenant
from fireledger.control.bodylimit import (
    API_BODY_BYTES,
    CALLBACK_BODY_BYTES,
    CONSOLE_BODY_BYTES,
    DEFAULT_BODY_BYTES,
    limit_for,
)

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024
#: What each chunked sender is ready to send; the server must answer long before.
PLANNED = 96 * MiB
#: The most the client may have sent when the 413 arrives: the limit plus what the kernel's socket
#: buffers and the server's read buffer (uvicorn pauses reading past 64 KiB) can hold in between.
SENT_BOUND = 24 * MiB


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work: Path = tmp_path_factory.mktemp("bodycap")
    db = f"sqlite:///{work}/cap.db"
    _, token = new_tenant(db)
    svc = Service(db, work, command="control").start()
    try:
        yield {"port": svc.port, "token": token, "svc": svc}
    finally:
        svc.stop()


def send_sized(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        try:
            conn.request(method, path, body=body, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server answered and closed before the whole body went: read that answer
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def assert_413(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 413, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/problem+json"), headers
    doc = json.loads(body)
    assert doc["status"] == 413 and doc["type"].endswith(":body-too-large") and "larger than" in doc["detail"]


ROUTES = [("POST", "/console/login", False), ("POST", "/console/logout", False),
          ("POST", "/v1/triggers", True), ("POST", "/no/such/route", False), ("PUT", "/console/", False)]


@pytest.mark.parametrize(("method", "path", "auth"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_a_chunked_body_over_the_limit_is_refused_before_it_is_read(control: dict[str, Any], method: str,
                                                                     path: str, auth: bool) -> None:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if auth:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {control['token']}"}
    out = send_chunked(control["port"], method, path, headers, PLANNED)
    assert_413(out["status"], out["headers"], out["body"])
    assert not out["finished"] and out["sent"] < SENT_BOUND, out["sent"]
    assert out["headers"].get("connection") == "close"
    # The process is still there and answering.
    assert send_sized(control["port"], "GET", "/healthz", b"", {})[0] == 200


@pytest.mark.parametrize(("method", "path", "auth"), ROUTES, ids=[p for _, p, _ in ROUTES])
def test_a_declared_length_over_the_limit_is_refused_without_reading(control: dict[str, Any], method: str,
                                                                     path: str, auth: bool) -> None:
    sock = socket.create_connection(("127.0.0.1", control["port"]), timeout=10)
    try:
        extra = f"Authorization: Bearer {control['token']}\r\n" if auth else ""
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
                     f"Content-Length: {200 * MiB}\r\n\r\n".encode())
        status, headers, body = read_response(sock, time.monotonic() + 10)   # not a byte of body sent
    finally:
        sock.close()
    assert_413(status, headers, body)


def test_a_body_at_the_limit_passes_and_one_byte_more_does_not(control: dict[str, Any]) -> None:
    port, token = control["port"], control["token"]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    api = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    cases = [("/console/login", CONSOLE_BODY_BYTES, form, 303), ("/console/logout", CONSOLE_BODY_BYTES, form, 303),
             ("/v1/triggers", API_BODY_BYTES, api, 400), ("/no/such/route", DEFAULT_BODY_BYTES, form, 404),
             ("/v1/fires/fk_nope/outcome", CALLBACK_BODY_BYTES, {"Content-Type": "application/json"}, 404)]
    for path, limit, headers, answer in cases:
        assert limit_for("POST", path) == limit
        at = b"x" * limit
        status, body = send_sized(port, "POST", path, at, headers)   # Content-Length, at the limit
        assert status == answer, (path, status, body[:200])           # the route itself answered
        over = at + b"x"
        status, body = send_sized(port, "POST", path, over, headers)
        assert status == 413, (path, status)
        # The same sizes streamed without a Content-Length.
        status, body = send_sized(port, "POST", path, iter([at[: limit // 2], at[limit // 2:]]),  # type: ignore[arg-type]
                                  headers)
        assert status == answer, (path, "chunked", status)
        status, body = send_sized(port, "POST", path, iter([at, b"x"]), headers)  # type: ignore[arg-type]
        assert status == 413, (path, "chunked", status)
