"""Peer runner: APScheduler 4.0 (alpha) on the benchmark workload, run by ``bench/peers.py`` with the
Python of ``.venv-bench4`` (APScheduler 4 cannot share a venv with 3.x: same distribution name).

Configuration (the fastest fair one found for a job that makes one HTTP POST):

* ``AsyncScheduler`` on uvloop, the ``async`` job executor, the job a coroutine
  (:func:`peerkit.post`, aiohttp, one session, 64 connections).
* Data store ``memory`` (``MemoryDataStore``, not durable) or ``sqlite`` (``SQLAlchemyDataStore``
  on ``sqlite+aiosqlite`` in WAL mode with ``synchronous=NORMAL``, as fireledger's store).
* ``max_concurrent_jobs=--max-jobs`` (256, fireledger's dispatch concurrency) and the task's
  ``max_running_jobs=None``: APScheduler 4's default of **1** running job per task would
  serialise the whole burst behind one HTTP round trip; ``coalesce=all`` (every instant runs),
  ``misfire_grace_time`` from ``--grace``.

The scheduled instant of an interval run is the job's ``scheduled_fire_time`` (``current_job``).
"""

from __future__ import annotations

import logging
import time

from apscheduler import AsyncScheduler, CoalescePolicy, JobOutcome, JobReleased, current_job
from apscheduler.datastores.memory import MemoryDataStore
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

import peerkit


def scheduled_us() -> int:
    job = current_job.get()
    assert job is not None and job.scheduled_fire_time is not None
    return peerkit.to_us(job.scheduled_fire_time)


def sqlite_store(path: str):  # type: ignore[no-untyped-def]
    from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(conn, _record):  # type: ignore[no-untyped-def]
        cur = conn.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    return SQLAlchemyDataStore(engine)


async def run(a) -> None:  # type: ignore[no-untyped-def]
    await peerkit.open_session(a.sink, a.concurrency)
    peerkit.scheduled_of = scheduled_us
    store = MemoryDataStore() if a.store == "memory" else sqlite_store(a.db)
    grace = peerkit.grace_of(a)
    counts = peerkit.outcomes

    def released(ev: JobReleased) -> None:
        counts[ev.outcome.name if isinstance(ev.outcome, JobOutcome) else str(ev.outcome)] += 1

    async with AsyncScheduler(store, max_concurrent_jobs=a.max_jobs, cleanup_interval=None) as sched:
        sched.subscribe(released, {JobReleased})
        # Schedules name the task by id: passing the callable again would re-configure the task
        # with the defaults (max_running_jobs=1) in 4.0.0a6.
        task = await sched.configure_task(peerkit.post, max_running_jobs=None, misfire_grace_time=grace)
        t0 = time.time()
        if a.mode == "burst":
            at = peerkit.from_us(a.at_us)
            for i in range(a.n):   # one trigger object each: a DateTrigger keeps state
                await sched.add_schedule(task.id, DateTrigger(at), id=f"j{i}", args=[f"j{i}", a.at_us],
                                         coalesce=CoalescePolicy.all, misfire_grace_time=grace)
        else:
            end = peerkit.from_us(a.base_us + a.duration_s * 1_000_000 - 1)
            for i in range(a.rate):
                start = peerkit.from_us(peerkit.steady_anchor_us(a, i))
                await sched.add_schedule(task.id, IntervalTrigger(seconds=1, start_time=start, end_time=end),
                                         id=f"j{i}", args=[f"j{i}"], coalesce=CoalescePolicy.all,
                                         misfire_grace_time=grace)
        await sched.start_in_background()
        setup_s = time.time() - t0
        first = a.at_us if a.mode == "burst" else a.base_us
        peerkit.say({"event": "ready", "setup_s": round(setup_s, 3),
                     "margin_s": round(first / 1e6 - time.time(), 3)})
        complete = await peerkit.wait_done(a, lambda: sum(counts.values()))
        await sched.stop()
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
