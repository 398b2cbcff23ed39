"""The HTTP sender against receivers that cannot take everything at once (issue 15): a receiver that
listens but never accepts, the standard library's server with its accept backlog of 5 under a burst,
and a slow one — real sockets and servers, no mocks. A connection that was never accepted is a known
non-delivery (``retry``, not sent), never ``unknown``; the per-origin limit adapts."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from fireledger.dispatch import signing
from fireledger.dispatch.http import HttpRequest, HttpSender
from fireledger.dispatch.wire import tcp_acked
from smallrx import SmallReceiver

T = TypeVar("T")
SECRET = signing.new_secret()


def run(coro: Awaitable[T], limit_s: float = 60) -> T:
    async def main() -> T:
        async with asyncio.timeout(limit_s):  # a hung test fails instead of hanging the run
            return await coro

    return asyncio.run(main())


def request(url: str, i: int = 0, *, timeout_s: float = 30.0) -> HttpRequest:
    body = json.dumps({"fire_key": f"fk{i}", "attempt": 1}).encode()
    return HttpRequest(url=url, secret=SECRET, fire_key=f"fk{i}", msg_id=f"fk{i}:1", timestamp=int(time.time()),
                       body=body, timeout_s=timeout_s)


@pytest.fixture
def never_accepts():
    """A socket with ``listen(1)`` that never accepts, its accept queue filled by connections of
    its own: further connection attempts get no answer (the kernel drops their SYN)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    fillers = []
    for _ in range(2):   # a backlog of 1 holds two established connections on Linux
        c = socket.create_connection(lsock.getsockname(), timeout=2)
        fillers.append(c)
    yield f"http://127.0.0.1:{lsock.getsockname()[1]}/hook"
    for c in fillers:
        c.close()
    lsock.close()


def test_a_receiver_that_never_accepts_is_a_retry_within_the_connect_timeout(never_accepts) -> None:
    async def main() -> list:
        async with HttpSender(connect_timeout_s=0.5) as sender:
            started = time.monotonic()
            results = await asyncio.gather(*(sender.send(request(never_accepts, i)) for i in range(6)))
            return [(r, time.monotonic() - started, sender.origin_limit(never_accepts)) for r in results]

    out = run(main())
    for res, elapsed, limit in out:
        assert (res.outcome, res.sent, res.http_status) == ("retry", False, None), res
        assert "not accepted within 0.5s (connect timeout)" in (res.error or ""), res.error
        assert elapsed < 10, "bounded by the connect timeout (per wave of the limit), not the 30 s attempt timeout"
        assert limit is not None and limit < 4, "the origin's limit backed off"


def test_the_connect_timeout_never_outlasts_the_attempt_timeout(never_accepts) -> None:
    async def main():
        async with HttpSender(connect_timeout_s=20) as sender:
            started = time.monotonic()
            res = await sender.send(request(never_accepts, timeout_s=0.5))
            return res, time.monotonic() - started

    res, elapsed = run(main())
    assert (res.outcome, res.sent) == ("retry", False) and elapsed < 3, (res, elapsed)


def test_the_kernel_shows_which_bytes_the_peer_acknowledged() -> None:
    """The evidence the ``unacked`` rule reads: Linux ``TCP_INFO`` counts the bytes the peer's TCP
    acknowledged (the SYN counts one); a connection the receiver's full queue never completed has
    none acknowledged."""
    if not hasattr(socket, "TCP_INFO"):
        pytest.skip("no TCP_INFO on this platform: the sender keeps the rule for written requests")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    try:
        ok = socket.create_connection(lsock.getsockname(), timeout=2)
        before = tcp_acked(ok)
        ok.sendall(b"x" * 100)
        deadline = time.monotonic() + 5
        while tcp_acked(ok) != (before or 0) + 100 and time.monotonic() < deadline:
            time.sleep(0.01)   # poll interval, bounded by the deadline
        assert before == 1 and tcp_acked(ok) == 101
        other = socket.create_connection(lsock.getsockname(), timeout=2)   # fills the queue (2 on Linux)
        stuck = socket.socket()
        stuck.setblocking(False)
        assert stuck.connect_ex(lsock.getsockname()) in (115, 36)   # EINPROGRESS: the SYN is dropped
        assert tcp_acked(stuck) == 0
        for s in (ok, other, stuck):
            s.close()
    finally:
        lsock.close()


def test_a_burst_against_a_backlog_of_5_is_delivered_and_never_unknown() -> None:
    rx = SmallReceiver().start()
    try:
        async def main():
            async with HttpSender(limit=256, limit_per_host=64) as sender:
                results = await asyncio.gather(*(sender.send(request(rx.base_url + "/hook", i, timeout_s=10))
                                                 for i in range(600)))
                return results, sender.origin_limit(rx.base_url + "/hook")

        results, limit = run(main())
    finally:
        rx.stop()
    outcomes = Counter(r.outcome for r in results)
    assert outcomes == {"delivered": 600}, (outcomes, {r.error for r in results if r.error})
    assert limit is not None and limit <= 64
    assert rx.max_open <= 64, rx.max_open


def test_a_slow_receiver_keeps_deliveries_going_and_the_limit_grows() -> None:
    rx = SmallReceiver(delay_s=0.5).start()
    try:
        async def main():
            async with HttpSender(limit=256, limit_per_host=64) as sender:
                started = time.monotonic()
                results = await asyncio.gather(*(sender.send(request(rx.base_url + "/hook", i, timeout_s=20))
                                                 for i in range(60)))
                return results, sender.origin_limit(rx.base_url + "/hook"), time.monotonic() - started

        results, limit, elapsed = run(main())
    finally:
        rx.stop()
    assert Counter(r.outcome for r in results) == {"delivered": 60}
    assert limit is not None and limit >= 16, "the limit grew (a slow answer is not congestion)"
    assert elapsed < 10, elapsed   # a limit stuck at 1 would take 30 s
