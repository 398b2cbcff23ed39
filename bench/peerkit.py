"""What the peer runners share (imported by ``peer_aps3.py`` in ``.venv`` and ``peer_aps4.py`` in
``.venv-bench4``; it must not import fireledger).

The job every peer runs is :func:`post`: one HTTP POST to the shared sink with the JSON body
``{"id": job id, "s": scheduled instant in µs}`` on one shared aiohttp session (a connection pool of
``limit`` connections, as fireledger's dispatcher keeps 64 to one host). The scheduled instant is a
job argument for date jobs; for interval jobs it is the run time the scheduler itself passes to
the run (``scheduled_of`` is set by the runner).

A runner prints JSON lines on stdout: ``{"event": "ready", ...}`` once its jobs are in the store and
the scheduler runs, and ``{"event": "done", ...}`` with the scheduler's own counts at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
URL = ""
SESSION: Any = None
scheduled_of: Callable[[], int] | None = None
outcomes: Counter[str] = Counter()


def to_us(dt: datetime) -> int:
    return (dt - EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


async def open_session(url: str, limit: int) -> None:
    import aiohttp

    global URL, SESSION
    URL = url
    SESSION = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit),
                                    timeout=aiohttp.ClientTimeout(total=30))


async def close_session() -> None:
    if SESSION is not None:
        await SESSION.close()


async def post(job_id: str, scheduled_us: int | None = None) -> None:
    """The job: one POST to the sink, raising unless it answered 200."""
    if scheduled_us is None:
        assert scheduled_of is not None, "interval jobs need the runner's scheduled_of hook"
        scheduled_us = scheduled_of()
    body = b'{"id":"%s","s":%d}' % (job_id.encode(), scheduled_us)
    async with SESSION.post(URL, data=body, headers={"content-type": "application/json"}) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"sink answered {r.status}")


def args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--sink", required=True, help="URL to POST to")
    ap.add_argument("--store", choices=("memory", "sqlite"), required=True)
    ap.add_argument("--db", help="SQLite file for --store sqlite")
    ap.add_argument("--mode", choices=("burst", "steady"), required=True)
    ap.add_argument("--n", type=int, default=0, help="burst: jobs due at --at-us")
    ap.add_argument("--at-us", type=int, default=0, help="burst: the instant, µs since the epoch")
    ap.add_argument("--rate", type=int, default=0, help="steady: jobs with a 1 s interval, spread over the second")
    ap.add_argument("--base-us", type=int, default=0, help="steady: the first instant")
    ap.add_argument("--duration-s", type=int, default=0, help="steady: seconds of fires")
    ap.add_argument("--grace", default="none", help="misfire grace time in seconds, or 'none' (no limit)")
    ap.add_argument("--concurrency", type=int, default=64, help="HTTP connections to the sink")
    ap.add_argument("--max-jobs", type=int, default=256, help="jobs running at once (where the scheduler caps it)")
    ap.add_argument("--end-at-us", type=int, required=True, help="stop at this wall time at the latest")
    return ap.parse_args()


def grace_of(a: argparse.Namespace) -> float | None:
    return None if a.grace == "none" else float(a.grace)


def expected(a: argparse.Namespace) -> int:
    return a.n if a.mode == "burst" else a.rate * a.duration_s


def steady_anchor_us(a: argparse.Namespace, i: int) -> int:
    """Job i of a steady run fires at base + i/rate s + k s: ``rate`` fires every second, evenly spread."""
    return a.base_us + i * 1_000_000 // a.rate


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def wait_done(a: argparse.Namespace, finished: Callable[[], int]) -> bool:
    """Until every expected run is finished (by the scheduler's count) or ``--end-at-us``."""
    want = expected(a)
    while finished() < want:
        if time.time_ns() // 1000 >= a.end_at_us:
            return False
        await asyncio.sleep(0.05)
    return True
