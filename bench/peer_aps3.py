"""Peer runner: APScheduler 3.11 on the benchmark workload (run by ``bench/peers.py``).

Configuration (the fastest fair one found for a job that makes one HTTP POST):

* ``AsyncIOScheduler`` on a uvloop event loop, ``AsyncIOExecutor``: the job is a coroutine
  (:func:`peerkit.post`, aiohttp, one session, 64 connections) run on the scheduler's own loop —
  no thread hop per job. A ``BackgroundScheduler`` with a thread pool and a blocking HTTP client
  is slower on two cores (GIL-bound; see docs/performance.md).
* Job store ``memory`` (``MemoryJobStore``, not durable) or ``sqlite`` (``SQLAlchemyJobStore`` on
  a SQLite file in WAL mode with ``synchronous=NORMAL`` — the same durability setting as
  fireledger's embedded store).
* ``coalesce=False``, ``max_instances=16`` (a late interval job may overlap its next run rather
  than be dropped), ``misfire_grace_time`` from ``--grace`` (``none`` = no limit; APScheduler's
  default is 1 s).

Burst: ``--n`` date jobs at ``--at-us``. Steady: ``--rate`` interval jobs of 1 s spread evenly over
the second, for ``--duration-s`` seconds from ``--base-us``. The scheduled instant an interval run
reports is APScheduler's own ``run_time`` of that run (read from the executor's frame: the job
function has no other way to learn it in 3.x).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
)
from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

import peerkit

EVENT_NAMES = {EVENT_JOB_EXECUTED: "executed", EVENT_JOB_ERROR: "error", EVENT_JOB_MISSED: "missed",
               EVENT_JOB_MAX_INSTANCES: "max_instances"}


def run_time_us() -> int:
    """The ``run_time`` APScheduler's executor is running now (``run_coroutine_job``'s loop variable)."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name in ("run_coroutine_job", "run_job") and "run_time" in f.f_locals:
            return peerkit.to_us(f.f_locals["run_time"])
        f = f.f_back  # type: ignore[assignment]
    raise RuntimeError("not called from an APScheduler executor")


def sqlite_store(path: str):  # type: ignore[no-untyped-def]
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from sqlalchemy import create_engine, event

    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _pragmas(conn, _record):  # type: ignore[no-untyped-def]
        cur = conn.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    return SQLAlchemyJobStore(engine=engine)


async def run(a) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    await peerkit.open_session(a.sink, a.concurrency)
    peerkit.scheduled_of = run_time_us
    store = MemoryJobStore() if a.store == "memory" else sqlite_store(a.db)
    sched = AsyncIOScheduler(event_loop=loop, jobstores={"default": store},
                             executors={"default": AsyncIOExecutor()}, timezone="UTC",
                             job_defaults={"coalesce": False, "max_instances": 16,
                                           "misfire_grace_time": peerkit.grace_of(a)})
    counts = peerkit.outcomes

    def listener(ev) -> None:  # type: ignore[no-untyped-def]
        counts[EVENT_NAMES.get(ev.code, str(ev.code))] += 1

    sched.add_listener(listener, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
    t0 = time.time()
    if a.mode == "burst":
        at = peerkit.from_us(a.at_us)
        for i in range(a.n):
            sched.add_job(peerkit.post, DateTrigger(run_date=at), args=[f"j{i}", a.at_us], id=f"j{i}")
    else:
        end = peerkit.from_us(a.base_us + a.duration_s * 1_000_000 - 1)
        for i in range(a.rate):
            start = peerkit.from_us(peerkit.steady_anchor_us(a, i))
            sched.add_job(peerkit.post, IntervalTrigger(seconds=1, start_date=start, end_date=end, timezone="UTC"),
                          args=[f"j{i}"], id=f"j{i}")
    sched.start()   # jobs added before start are written to the store here
    setup_s = time.time() - t0
    first = a.at_us if a.mode == "burst" else a.base_us
    peerkit.say({"event": "ready", "setup_s": round(setup_s, 3),
                 "margin_s": round(first / 1e6 - time.time(), 3)})
    complete = await peerkit.wait_done(a, lambda: sum(counts.values()))
    sched.shutdown(wait=False)
    await asyncio.sleep(0.1)
    await peerkit.close_session()
    peerkit.say({"event": "done", "complete": complete, "outcomes": dict(counts)})


def main() -> int:
    import uvloop

    logging.basicConfig(level=logging.ERROR)
    a = peerkit.args(__doc__.split("\n\n")[0])
    uvloop.run(run(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
