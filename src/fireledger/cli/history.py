"""History retention commands (they talk to the store directly):

    fireledger history export --db URL --before T --out FILE.jsonl.gz
    fireledger history purge  --db URL [--before T] --out FILE.jsonl.gz

Retention: history is queryable for ``FIRELEDGER_HISTORY_RETENTION_DAYS`` (default 90) days; after
that ``history purge`` writes each batch of terminal fires to a gzip-compressed JSON-lines archive
(flushed to disk first) and only then deletes that batch, in small transactions on its own
connection, so the fire path is never blocked for long. Live fires are never purged. Exported lines
are :func:`fireledger.observe.records.archive_record` (the history API's items plus ``tenant_id`` and
``work_outcome``): never a payload. The walk itself is :func:`fireledger.retention.archive_and_purge`,
the same code as the control plane's retention pass.

Bad input prints one line ``fireledger: <command>: <field>: <problem>`` and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant

from .common import DEFAULT_DB, Command, Db, fail
from .evidence import instant_us, now_us, when
from .operator import open_existing

__all__ = ["COMMANDS"]

Before = Annotated[str | None, typer.Option(
    "--before", help="RFC 3339: fires scheduled before it (default: now minus the retention, "
                     "FIRELEDGER_HISTORY_RETENTION_DAYS, 90 days).")]
Out = Annotated[Path, typer.Option("--out", help="Archive file to write (gzip-compressed JSON lines).")]
Batch = Annotated[int, typer.Option("--batch", help="Fires per transaction (1-5000).")]


def _cutoff(before: str | None) -> int:
    from fireledger.retention import DAY_US, retention_days

    if before is not None:
        return instant_us(before, "--before")
    try:
        return now_us() - retention_days() * DAY_US
    except ValueError as exc:
        fail(str(exc))


def export_cmd(db: Db = DEFAULT_DB, before: Before = None, out: Out = Path("fireledger-history.jsonl.gz"),
               batch: Batch = 500) -> None:
    """Write terminal fires scheduled before --before to a compressed JSON-lines archive (deletes nothing)."""
    cut = _cutoff(before)
    n = _retention(open_existing(db), cut, out, batch, purge=False)
    typer.echo(f"exported {n} fires scheduled before {when(cut)} to {out}")


def purge_cmd(db: Db = DEFAULT_DB, before: Before = None, out: Out = Path("fireledger-history.jsonl.gz"),
              batch: Batch = 500) -> None:
    """Export, then delete, terminal fires scheduled before --before, batch by batch (live fires stay)."""
    cut = _cutoff(before)
    n = _retention(open_existing(db), cut, out, batch, purge=True)
    typer.echo(f"purged {n} fires scheduled before {when(cut)} (archived in {out})")


def _retention(store: Any, before_us: int, out: Path, batch: int, *, purge: bool) -> int:
    """Walk every tenant's terminal fires scheduled before ``before_us`` in batches of ``batch``;
    append each batch to ``out`` (gzip JSON lines, flushed and fsynced) and, when ``purge``, delete
    exactly that batch afterwards. Returns the number of fires exported (and purged)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from fireledger.retention import archive_and_purge

    if not 1 <= batch <= 5000:
        store.close()
        fail(f"--batch: {batch} is out of range 1-5000")
    if out.exists():
        store.close()
        fail(f"--out: {out} exists; choose a new file (an archive is never overwritten)")
    if not out.parent.exists():
        store.close()
        fail(f"--out: the folder {out.parent} does not exist")
    try:
        verb = "purging" if purge else "exporting"
        with Progress(TextColumn(f"{verb} history before {format_instant(from_us(before_us))}"), BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), transient=False) as progress:
            task = progress.add_task(verb, total=None)

            def shown(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            done, live_left = archive_and_purge(store, before_us, out, batch, purge=purge, on_progress=shown)
    finally:
        store.close()
    if live_left:
        typer.echo(f"note: {live_left} live (pending/dispatching/held) fires before the cutoff were left in place",
                   err=True)
    return done


COMMANDS = (
    Command("export", export_cmd, group="history"),
    Command("purge", purge_cmd, group="history"),
)
