"""The sender's connection limits are kept per flow — (tenant, origin, path) — not per origin
(decision 0133): real HTTP to a real local sink that serves a silent endpoint (``/hang``) and a
healthy one (``/ok``) on one port.

* A flow at its limit makes its own further requests wait; another tenant's requests, and the same
  tenant's requests to another endpoint, on the same origin go at once.
* A request that waited for a slot until its deadline was never sent: ``retry``, ``sent=False``,
  its error naming the limit (and no path: a path may hold a secret); the requests that were
  written end ``unknown``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import TypeVar

from fireledger.dispatch import signing
from fireledger.dispatch.http import HttpRequest, HttpResult, HttpSender
from fireledger.dispatch.pool import INITIAL_ORIGIN_LIMIT
from sink import SinkServer

T = TypeVar("T")
SECRET = signing.new_secret()
HANG_S = 3.0       # the silent requests written hang until this timeout
WAIT_S = 1.0       # the ones queued behind them give up first: they never get a slot


def run(coro: Awaitable[T], limit_s: float = 30) -> T:
    async def main() -> T:
        async with asyncio.timeout(limit_s):  # a hung test fails instead of hanging the run
            return await coro

    return asyncio.run(main())


def request(url: str, tenant: str, i: int, timeout_s: float) -> HttpRequest:
    body = json.dumps({"fire_key": f"fk{i}", "attempt": 1}).encode()
    return HttpRequest(url=url, secret=SECRET, fire_key=f"fk{i}", msg_id=f"fk{i}.1", timestamp=int(time.time()),
                       body=body, timeout_s=timeout_s, tenant_id=tenant)


def test_a_flow_at_its_limit_holds_only_its_own_slots_and_a_request_that_never_got_one_is_a_retry() -> None:
    sink = SinkServer(secrets=[SECRET])
    sink.start_in_thread()
    hang, ok = f"{sink.base_url}/hang/secret-token", f"{sink.base_url}/ok"

    async def main() -> tuple[list[HttpResult], list[tuple[HttpResult, float]]]:
        async with HttpSender() as sender:
            async def timed(req: HttpRequest) -> tuple[HttpResult, float]:
                started = time.monotonic()
                res = await sender.send(req)
                return res, time.monotonic() - started

            timeouts = [HANG_S] * INITIAL_ORIGIN_LIMIT + [WAIT_S] * 2
            silent = [asyncio.ensure_future(sender.send(request(hang, "tn_a", i, t))) for i, t in enumerate(timeouts)]
            deadline = time.monotonic() + 10
            while sum(1 for r in sink.records() if r["path"].startswith("/hang")) < INITIAL_ORIGIN_LIMIT:
                assert time.monotonic() < deadline, "the silent requests were written"
                await asyncio.sleep(0.02)   # poll interval, bounded by the deadline
            others = await asyncio.gather(
                timed(request(ok, "tn_b", 100, 10)),     # another tenant, same origin
                timed(request(ok, "tn_a", 101, 10)))     # the same tenant, another endpoint
            return list(await asyncio.gather(*silent)), others

    try:
        silent, others = run(main())
    finally:
        sink.stop()
    for res, took in others:
        assert res.outcome == "delivered", res
        assert took < WAIT_S, f"waited {took:.2f}s behind the silent flow (its requests hang {HANG_S:g}s)"
    written = [r for r in silent if r.sent]
    waited = [r for r in silent if not r.sent]
    assert len(written) == INITIAL_ORIGIN_LIMIT and {r.outcome for r in written} == {"unknown"}, silent
    assert len(waited) == 2, silent
    for res in waited:
        assert res.outcome == "retry", res
        assert "no free connection to 127.0.0.1:" in (res.error or ""), res.error
        assert "adaptive connection limit for the endpoint (4) was in use" in (res.error or ""), res.error
        assert "secret-token" not in (res.error or "")
