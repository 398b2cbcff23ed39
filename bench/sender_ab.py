"""The dispatch plane's HTTP client against aiohttp, same requests, same sink, same run (issue 15's
"How": keep the lean client of decision 0075 only if a measurement in the same run shows the library
cannot reach the budget; decision 0261).

One process on uvloop sends N signed POSTs (the runner's headers: ``HttpRequest.headers()``, the
Standard Webhooks signature computed per request in both) to the test sink in its own process, C in
flight, through

* ``lean``: :class:`fireledger.dispatch.http.HttpSender` — the dispatch plane's sender as it runs
  (adaptive per-flow limit, egress guard, one connect in flight per address, ``TCP_INFO`` evidence,
  body cap, outcome classified);
* ``aiohttp``: one ``aiohttp.ClientSession`` (``TCPConnector(limit=C)``, keep-alive), a per-request
  ``ClientTimeout``, no redirects, the body read up to the same cap, the status classified by the
  same ``classify_status``. It has none of the lean sender's guards (no egress check of the address
  connected to, no accept-queue evidence, no adaptive limit): a lower bound on what the library
  would cost in its place.

Rounds alternate (lean, aiohttp, lean, aiohttp, …) so a drift of the machine falls on both. Prints
one JSON object: per client the median over rounds of CPU-µs per request (this process: the client,
the request's build and signature; the sink is another process) and requests/s, and the ratio.

    .venv/bin/python bench/sender_ab.py [--n 20000] [--inflight 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The sink listens on loopback: a local benchmark, as tests and `make run` allow.
os.environ.setdefault("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")

import dispatch as bench
from fireledger.dispatch.http import BODY_CAP_BYTES, HttpRequest, HttpSender, classify_status

TIMEOUT_S = 10.0


def requests(url: str, n: int, tag: str) -> list[HttpRequest]:
    body = b'{"n":"' + b"x" * 64 + b'"}'
    now = int(time.time())
    return [HttpRequest(url=url, secret=bench.SECRET, fire_key=f"{tag}-{i}", msg_id=f"msg_{tag}_{i}",
                        timestamp=now, body=body, timeout_s=TIMEOUT_S, tenant_id="t1") for i in range(n)]


async def drive(reqs: list[HttpRequest], inflight: int,
                send: Callable[[HttpRequest], Awaitable[str]]) -> dict[str, Any]:
    it = iter(reqs)
    outcomes: dict[str, int] = {}

    async def worker() -> None:
        for req in it:
            outcome = await send(req)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    done = outcomes.get("delivered", 0)
    return {"delivered": done, "outcomes": outcomes, "cpu_us_per_request": round(cpu * 1e6 / max(1, done), 1),
            "requests_per_s": round(done / wall, 1)}


async def lean_round(reqs: list[HttpRequest], inflight: int) -> dict[str, Any]:
    async with HttpSender(limit=max(256, inflight)) as sender:
        async def send(req: HttpRequest) -> str:
            return (await sender.send(req)).outcome
        await send(reqs[0])   # the connection and the flow's limit made outside the figure
        return await drive(reqs[1:], inflight, send)


async def aiohttp_round(reqs: list[HttpRequest], inflight: int) -> dict[str, Any]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight), auto_decompress=False,
                                     cookie_jar=aiohttp.DummyCookieJar(), timeout=timeout) as session:
        async def send(req: HttpRequest) -> str:
            try:
                async with session.post(req.url, data=req.body, headers=req.headers(),
                                        allow_redirects=False) as r:
                    await r.content.read(BODY_CAP_BYTES)
                    return classify_status(r.status)
            except (TimeoutError, aiohttp.ClientError):
                return "retry"
        await send(reqs[0])
        return await drive(reqs[1:], inflight, send)


def main() -> int:
    import uvloop

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds: dict[str, list[dict[str, Any]]] = {"lean": [], "aiohttp": []}
    load = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory() as d:
        sink, base = bench.start_sink(Path(d))
        try:
            for r in range(args.rounds):
                for name, fn in (("lean", lean_round), ("aiohttp", aiohttp_round)):
                    reqs = requests(f"{base}/ok", args.n + 1, f"{name}{r}")
                    rounds[name].append(uvloop.run(fn(reqs, args.inflight)))
                    print(f"[sender-ab] round {r + 1} {name}: {rounds[name][-1]}", file=sys.stderr)
        finally:
            sink.terminate()
            sink.wait(timeout=10)
    out: dict[str, Any] = {"scenario": "sender-ab", "system": "fireledger-http-client", "n": args.n,
                           "inflight": args.inflight, "rounds": args.rounds}
    for name, rs in rounds.items():
        out[name] = {"cpu_us_per_request": statistics.median(x["cpu_us_per_request"] for x in rs),
                     "requests_per_s": statistics.median(x["requests_per_s"] for x in rs),
                     "delivered_all": all(x["delivered"] == args.n for x in rs),
                     "cpu_us_per_request_rounds": [x["cpu_us_per_request"] for x in rs]}
    out["aiohttp_cpu_over_lean"] = round(out["aiohttp"]["cpu_us_per_request"] / out["lean"]["cpu_us_per_request"], 2)
    out["cpus"] = os.cpu_count()
    out["python"] = sys.version.split()[0]
    out["load1"] = float(load)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
