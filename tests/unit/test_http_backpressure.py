"""The HTTP sender against receivers that cannot take everything at once (issue 15): a receiver that
listens but never accepts, the standard library's server with its accept backlog of 5 under a burst,
and a slow one — real sockets and servers, no mocks. A connection that was never accepted is a known
non-delivery (``retry``, not sent), never ``unknown``; the per-origin limit adapts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
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


def test_new_connections_to_an_address_are_opened_one_at_a_time_and_every_attempt_is_delivered() -> None:
    """Decision 0241: three tenants' flows to one receiver whose accept queue holds two connections
    and that pauses before each accept — each flow starts at 4 connections, so without the gate a
    dozen SYNs leave at once and most are dropped. The pool never has more than one connect in flight
    to the address, the waiting requests ride the keep-alive connections handed back meanwhile, and
    every attempt is delivered."""
    rx = SmallReceiver(backlog=1, accept_pause_s=0.005).start()
    url = rx.base_url + "/hook"
    try:
        async def main():
            async with HttpSender(limit=256, limit_per_host=64) as sender:
                reqs = [dataclasses.replace(request(url, i, timeout_s=20), tenant_id=f"tn_{i % 3}")
                        for i in range(300)]
                results = await asyncio.gather(*(sender.send(r) for r in reqs))
                return results, sender.connect_stats()

        results, stats = run(main())
    finally:
        rx.stop()
    outcomes = Counter(r.outcome for r in results)
    assert outcomes == {"delivered": 300}, (outcomes, {r.error for r in results if r.error})
    assert stats.most_in_flight == 1, stats
    assert stats.waiting == 0, stats   # (a connect may still be in flight: for the pool, not a request)
    assert rx.connections >= 2, "new connections were opened while others carried requests"


def _answer_200(conn: socket.socket) -> None:
    """Serve HTTP/1.1 keep-alive POSTs on ``conn`` with ``200`` until the peer closes it."""
    buf = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(buf) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            buf = buf[length:]
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")


def test_a_cancelled_connect_and_its_waiters_leave_the_address_to_the_next_connect() -> None:
    """Cancellation at stop (the dispatcher cancels its attempts): the request whose connect is in
    flight and the three waiting behind it (a receiver whose full accept queue drops SYNs) are
    cancelled; once the receiver accepts again, the next request to the address opens its own
    connection and is delivered — it is not left waiting behind a connect that no longer exists."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    fillers = [socket.create_connection(lsock.getsockname(), timeout=2) for _ in range(2)]   # queue full
    url = f"http://127.0.0.1:{lsock.getsockname()[1]}/hook"

    def serve() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return   # closed: the test is over
            threading.Thread(target=_answer_200, args=(conn,), daemon=True).start()

    async def main():
        async with HttpSender(connect_timeout_s=30) as sender:
            tasks = [asyncio.ensure_future(sender.send(request(url, i))) for i in range(4)]
            deadline = time.monotonic() + 10
            while sender.connect_stats()[:2] != (1, 3):   # one connect in flight, three behind it
                assert time.monotonic() < deadline, sender.connect_stats()
                await asyncio.sleep(0.01)   # poll interval, bounded by the deadline
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            after_cancel = sender.connect_stats()
            for c in fillers:   # the receiver accepts again
                c.close()
            threading.Thread(target=serve, daemon=True).start()
            res = await sender.send(request(url, 9, timeout_s=5))
            return after_cancel, res, sender.connect_stats()

    try:
        after_cancel, res, stats = run(main())
    finally:
        lsock.close()
    assert after_cancel[:2] == (0, 0), after_cancel
    assert res.outcome == "delivered", res
    assert stats.most_in_flight == 1 and stats[:2] == (0, 0), stats


def test_closing_the_sender_releases_the_requests_waiting_to_connect(never_accepts) -> None:
    """The requests waiting behind a stalled connect end at the close ("the sender was closed", not
    sent), not at their connect timeout."""
    async def main():
        sender = HttpSender(connect_timeout_s=30)
        tasks = [asyncio.ensure_future(sender.send(request(never_accepts, i))) for i in range(4)]
        deadline = time.monotonic() + 10
        while sender.connect_stats()[:2] != (1, 3):   # one connect in flight, three behind it
            assert time.monotonic() < deadline, sender.connect_stats()
            await asyncio.sleep(0.01)   # poll interval, bounded by the deadline
        await sender.close()
        deadline = time.monotonic() + 10
        while sum(t.done() for t in tasks) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)   # poll interval, bounded by the deadline (not the 30 s connect bound)
        done, pending = [t for t in tasks if t.done()], [t for t in tasks if not t.done()]
        for t in pending:   # the connect in flight ends at its own bound: not waited for here
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return [t.result() for t in done], len(pending)

    results, pending = run(main())
    assert len(results) >= 3 and pending <= 1, (results, pending)
    for res in results:
        assert (res.outcome, res.sent, res.error) == ("retry", False, "the sender was closed"), res


def test_a_request_whose_connect_stalls_takes_a_connection_handed_back_meanwhile() -> None:
    """Decision 0241: the receiver's accept queue is full (its SYNs are dropped) but one keep-alive
    connection it accepted earlier still serves. A request whose own connect stalls is delivered on
    that connection as soon as it is handed back — not after the SYN's retransmission or the connect
    timeout — and its connect goes on for the pool."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    url = f"http://127.0.0.1:{lsock.getsockname()[1]}/hook"
    first = threading.Event()

    def serve_one_slowly() -> None:
        conn, _ = lsock.accept()   # the one connection this receiver ever accepts
        first.set()
        _answer_200(conn)

    threading.Thread(target=serve_one_slowly, daemon=True).start()
    fillers: list[socket.socket] = []

    async def main():
        async with HttpSender(connect_timeout_s=5) as sender:
            assert (await sender.send(request(url, 0))).outcome == "delivered"   # the kept connection
            assert first.is_set()
            fillers.extend(socket.create_connection(lsock.getsockname(), timeout=2) for _ in range(2))
            # two at once: one takes the idle connection, the other must open one (its SYN is dropped)
            results = await asyncio.gather(*(sender.send(request(url, i)) for i in (1, 2)))
            return results, sender.connect_stats()

    try:
        results, stats = run(main())
    finally:
        for c in fillers:
            c.close()
        lsock.close()
    assert [r.outcome for r in results] == ["delivered", "delivered"], results
    assert stats.most_in_flight == 1, stats
