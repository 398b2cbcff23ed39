"""History retention: archive terminal fires past the window, then purge them — off the fire path.

``archive_and_purge`` walks each tenant's terminal fires scheduled before a cutoff in small batches,
appends each batch to a gzip JSON-lines archive (flushed and fsynced), and only then deletes exactly
that batch in one short transaction. Live fires (pending / dispatching / held) are never touched.
``retention_loop`` runs it in the control plane on its own thread and connection every hour with the
cutoff ``now − FIRELEDGER_HISTORY_RETENTION_DAYS`` (default 90), writing one archive file per pass
into ``FIRELEDGER_HISTORY_ARCHIVE_DIR`` (default: a folder beside the SQLite file, else
``archive`` in the state directory — never the working directory). The operator commands
``fireledger history export|purge`` use the same code. Each archive line is
:func:`fireledger.observe.records.archive_record` (the history API's item plus ``tenant_id`` and
``work_outcome``; never a payload).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fireledger.clock import Clock
from fireledger.domain.keys import FireKey, from_us
from fireledger.observe.records import archive_record
from fireledger.settings import Settings, parse_retention_days, process_env

log = logging.getLogger("fireledger.retention")

DAY_US = 86_400 * 1_000_000
DEFAULT_RETENTION_DAYS = 90
RETENTION_DAYS_ENV = "FIRELEDGER_HISTORY_RETENTION_DAYS"


def retention_days(settings: Settings | None = None) -> int:
    """``FIRELEDGER_HISTORY_RETENTION_DAYS`` (1-3650), default 90, from ``settings`` (else the
    environment). Raises ``ValueError`` (one line naming the variable) for anything else."""
    if settings is not None:
        return settings.history_retention_days
    return parse_retention_days(process_env())


def archive_and_purge(store: Any, before_us: int, out: Path, batch: int = 500, *, purge: bool = True,
                      on_progress: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """Archive (and with ``purge`` delete) terminal fires scheduled before ``before_us``.

    Returns ``(fires archived, live fires left in place)``. Never overwrites ``out`` (mode ``x``);
    the file is created 0600 (tenant history: readable by the service's user only).
    """
    tenants = store.history.tenant_ids()
    total = live_left = 0
    for tid in tenants:
        terminal, live = store.history.count_expiring(tid, before_us)
        total += terminal
        live_left += live
    done = 0
    if total == 0:
        return 0, live_left
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as sink, gzip.open(sink, "wt", encoding="utf-8") as raw:
        for tid in tenants:
            cursor = None
            while True:
                rows = store.history.expiring_batch(tid, before_us, after=cursor, limit=batch)
                if not rows:
                    break
                for r in rows:
                    raw.write(json.dumps(archive_record(r.fire, r.outcome), separators=(",", ":")) + "\n")
                raw.flush()               # a sync flush of the gzip stream, then to disk:
                os.fsync(raw.fileno())    # a batch is deleted only once its archive is durable
                last = rows[-1].fire
                if purge:
                    store.history.purge_fires([FireKey(x.fire.tenant_id, x.fire.trigger_id, x.fire.scheduled_us,
                                               x.fire.seq) for x in rows])
                cursor = (last.scheduled_us, last.trigger_id, last.seq)
                done += len(rows)
                if on_progress is not None:
                    on_progress(done, total)
    return done, live_left


def archive_dir_for(store: Any, settings: Settings | None = None) -> Path:
    """``FIRELEDGER_HISTORY_ARCHIVE_DIR``, else ``fireledger-archive`` beside a SQLite store, else
    ``archive`` in the state directory."""
    explicit = (settings.history_archive_dir if settings is not None
                else process_env().get("FIRELEDGER_HISTORY_ARCHIVE_DIR"))
    if explicit:
        return Path(explicit)
    path = getattr(store.engine, "path", None)
    if path:
        return Path(path).with_name("fireledger-archive")
    from fireledger.statedir import StateDirError, ensure_state_dir, state_dir

    try:
        return ensure_state_dir() / "archive"   # the directory is made 0700 first, not by mkdir(parents)
    except StateDirError:
        return state_dir() / "archive"


def run_once(store: Any, clock: Clock, days: int, archive_dir: Path) -> tuple[int, int]:
    """One retention pass with cutoff ``now − days``; the archive file is named after the cutoff."""
    now = clock.now().earliest_us
    cut = now - days * DAY_US
    archive_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = from_us(cut).strftime("%Y%m%dT%H%M%SZ")
    out = archive_dir / f"fireledger-history-before-{stamp}-{now}.jsonl.gz"
    done, live = archive_and_purge(store, cut, out, purge=True)
    if done:
        log.info("retention: archived and purged %d fires scheduled before %s into %s", done, stamp, out)
    return done, live


async def retention_loop(store: Any, clock: Clock, *, every_s: float = 3600.0,
                         settings: Settings | None = None) -> None:
    """Run :func:`run_once` every ``every_s`` on its own thread (its own store connection), with the
    retention window and archive directory of ``settings`` (else the environment)."""
    days = retention_days(settings)
    archive_dir = archive_dir_for(store, settings)
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="retention") as pool:
        while True:
            try:
                await loop.run_in_executor(pool, run_once, store, clock, days, archive_dir)
            except Exception:
                log.exception("retention pass failed; will try again")
            await asyncio.sleep(every_s)
