"""Sink capacity: how many requests/s the shared sink absorbs from a simple aiohttp client (uvloop, one
session, ``--connections`` keep-alive connections, ``--inflight`` requests in flight, 64 each), so a reader
knows the ceiling every other figure sits under. Prints one JSON object with the client's view.

    .venv/bin/python bench/sinkload.py --url http://127.0.0.1:PORT/hook --n 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def run(url: str, n: int, connections: int, inflight: int) -> dict[str, float]:
    import aiohttp

    lat: list[float] = []
    body = b'{"id":"load","s":0}'
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                    await r.read()
                lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"sent": len(lat), "wall_s": wall, "per_s": len(lat) / wall,
            "rtt_p50_s": lat[len(lat) // 2], "rtt_p99_s": lat[int(len(lat) * 0.99)], "rtt_max_s": lat[-1]}


def main() -> int:
    import uvloop

    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--inflight", type=int, default=64)
    a = ap.parse_args()
    print(json.dumps(uvloop.run(run(a.url, a.n, a.connections, a.inflight))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
