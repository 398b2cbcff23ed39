"""The HTTP sender's ramp against a receiver that keeps up: N requests at once from a fresh
``HttpSender`` (one flow; ``limit=256``, ``limit_per_host=64`` as the dispatcher passes) to the bench
sink (``bench/sink.py``, its own process), R rounds each with a fresh sender. Per round: the time
until the first 1,000 and all N were answered, and the connects the sender opened. For A/B runs of
one source tree against another (``PYTHONPATH``), e.g. one connect in flight per address (decision
0241) against parallel connects.

    PYTHONPATH=src python bench/pool_ramp.py 4000 5      # N, rounds
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import SECRET, Sink
from fireledger.dispatch.http import HttpRequest, HttpSender
from fireledger.security.egress import EgressPolicy


async def one_round(url: str, n: int) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    async with HttpSender(limit=256, limit_per_host=64, egress=EgressPolicy(allow_private=True)) as sender:
        reqs = [HttpRequest(url=url, secret=SECRET, fire_key=f"k{i}", msg_id=f"k{i}.1", timestamp=int(time.time()),
                            body=b"{}", timeout_s=30.0) for i in range(n)]
        done: list[float] = []
        t0 = loop.time()

        async def send(r: HttpRequest) -> str:
            res = await sender.send(r)
            done.append(loop.time() - t0)
            return res.outcome

        outcomes = Counter(await asyncio.gather(*(send(r) for r in reqs)))
        pool = sender._pool   # read-only: how many connections the ramp opened
        opened = len(pool._all) if pool is not None else 0
    done.sort()
    return {"first_1000_s": round(done[min(999, n - 1)], 4), "all_s": round(done[-1], 4),
            "outcomes": dict(outcomes), "connections": opened}


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    load = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory(prefix="fireledger-ramp-") as d:
        sink = Sink(Path(d))
        try:
            out = [asyncio.run(one_round(sink.url, n)) for _ in range(rounds)]
        finally:
            sink.close()
    print(json.dumps({"load": load, "n": n, "rounds": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
