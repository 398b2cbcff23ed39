"""Backups you have restored (issue 16, decision 0126; the work is :mod:`fireledger.replication`):

    fireledger restore --from REPLICA|BACKUP [--to DB_PATH] [--force] [--json]
    fireledger restore --from PG_BACKUP --to-pgdata NEWDIR [--port N] [--wal-archive DIR]
                       [--recovery-target-time TIME] [--json]
    fireledger backup --to DIR [--db URL] [--format tar|plain] [--json]

``restore`` writes a fresh file next to the destination (from a Litestream replica directory — what
``serve`` writes with ``FIRELEDGER_REPLICA`` — or a ``fireledger backup`` file), checks it as
``fireledger audit verify`` and the shadow rebuilder do, and only then puts it in place; it never
replaces an existing database without ``--force``. A copy that fails a check is left beside the
destination (named in the message) and the command exits 1. ``backup`` copies a live SQLite store
with SQLite's online backup API. On PostgreSQL (decision 0190, :mod:`fireledger.pgbackup`) ``backup``
runs ``pg_basebackup -X stream`` and writes a manifest; ``restore --to-pgdata`` unpacks such a backup
into a new data directory, checks it with ``pg_verifybackup`` and configures recovery from a WAL
archive when one is given; the operator starts the server and checks the store (docs/operations.md,
"Backups and restore").

Bad input prints one line ``fireledger: <command>: <field>: <problem>`` and exits 2, changing nothing.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from fireledger.store.sqlitelib import sqlite3

from .common import DEFAULT_DB, Command, Db, fail

__all__ = ["COMMANDS"]

AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
PG_DOCS = "docs/operations.md, 'Backups and restore'"


def _sqlite_path(db: str, field: str) -> Path:
    """The file of a ``sqlite:///`` URL (a PostgreSQL URL is refused, naming ``field``)."""
    from fireledger.store import StoreError
    from fireledger.store.engine import SqliteEngine, engine_for_url

    if db.startswith(("postgresql://", "postgres://")):
        fail(f"{field}: a PostgreSQL store is restored from a `fireledger backup` directory with "
             f"--to-pgdata NEWDIR ({PG_DOCS})")
    try:
        engine = engine_for_url(db)
    except StoreError as exc:
        fail(str(exc))
    assert isinstance(engine, SqliteEngine)
    return Path(engine.path)


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def restore_cmd(
    source: Annotated[str, typer.Option("--from", help="A Litestream replica directory (or file:// URL) or a "
                                                       "`fireledger backup` file.")],
    to: Annotated[str | None, typer.Option("--to", help="The database file to restore (default: the "
                                                        "--db file).")] = None,
    db: Db = DEFAULT_DB,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing database (stop serve first).")] = False,
    as_json: AsJson = False,
    to_pgdata: Annotated[str | None, typer.Option("--to-pgdata", help="PostgreSQL: the new (empty) data "
                                                                      "directory for a base backup.")] = None,
    port: Annotated[int | None, typer.Option("--port", help="PostgreSQL: the restored server's port.")] = None,
    wal_archive: Annotated[str | None, typer.Option("--wal-archive", help="PostgreSQL: replay the WAL archive in "
                                                                          "DIR after the base backup.")] = None,
    target_time: Annotated[str | None, typer.Option("--recovery-target-time", help="PostgreSQL: stop the replay at "
                                                                                   "this ISO 8601 time.")] = None,
) -> None:
    """Restore the SQLite store from a replica or a backup, check it, then put it in place; or unpack a
    PostgreSQL base backup into a new data directory (--to-pgdata)."""
    from fireledger.pgbackup import read_manifest
    from fireledger.replication import ReplicationError, check_restored, install_restored, restore_into
    from fireledger.security.envelope import KekError

    src = Path(source.removeprefix("file://")) if source.startswith("file://") else Path(source)
    if not src.exists():
        fail(f"--from: no replica or backup at {src}")
    if to_pgdata is not None or read_manifest(src) is not None:
        if to is not None or force:
            fail(f"{'--to' if to is not None else '--force'}: a PostgreSQL base backup restores into a new "
                 "data directory (--to-pgdata NEWDIR), never over an existing one")
        _restore_pg(src, to_pgdata, port, wal_archive, target_time, as_json)
        return
    for name, value in (("--port", port), ("--wal-archive", wal_archive), ("--recovery-target-time", target_time)):
        if value is not None:
            fail(f"{name}: only for a PostgreSQL restore (--to-pgdata)")
    dest = Path(to) if to is not None else _sqlite_path(db, "--db")
    if dest.is_dir():
        fail(f"--to: {dest} is a directory; name the database file")
    if dest.exists() and not force:
        fail(f"--to: a database exists at {dest}; restore never replaces one without --force "
             "(stop serve first, and move the file aside if you may need it)")
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.restoring-{os.getpid()}")
    with _progress() as progress:
        task = progress.add_task(f"restoring from {src}", total=None)
        try:
            kind = restore_into(src, tmp)
        except ReplicationError as exc:
            tmp.unlink(missing_ok=True)
            fail(str(exc))

        def step(what: str, done: int, total: int) -> None:
            progress.update(task, description=f"checking the restored copy: {what}", completed=done, total=total)

        try:
            check = check_restored(tmp, step)
        except KekError as exc:
            fail(f"the audit chain is keyed by the key-encryption key; restore it first ({exc}); "
                 f"the restored copy is at {tmp}")
    summary = {"restored": str(dest), "from": str(src), "source": kind, "schema_version": check.schema_version,
               "audit_rows": check.audit_rows, "partitions": check.partitions, "triggers": check.triggers,
               "divergent": check.divergent, "problems": check.problems}
    if not check.ok:
        summary["restored"] = None
        print(f"fireledger: restore: the restored copy did not pass its checks ({'; '.join(check.problems)}); "
              f"nothing was replaced; the copy is at {tmp}", file=sys.stderr)
        if as_json:
            typer.echo(json.dumps({**summary, "copy": str(tmp)}))
        sys.exit(1)   # a failed check is a finding, not a usage error (2)
    install_restored(tmp, dest)
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(f"restored {dest} from the {kind} at {src}: schema {check.schema_version}, audit chain intact "
               f"({check.audit_rows} rows), due index matches the registry ({check.triggers} triggers in "
               f"{check.partitions} partitions); start serve on it")


def _restore_pg(src: Path, to_pgdata: str | None, port: int | None, wal_archive: str | None,
                target_time: str | None, as_json: bool) -> None:
    """``restore --to-pgdata``: unpack, verify and configure a PostgreSQL base backup."""
    from fireledger.pgbackup import PgBackupError, plan_restore, restore_postgres

    if to_pgdata is None:
        fail(f"--to-pgdata: {src} is a PostgreSQL base backup; name the new data directory to restore it into")
    try:
        plan = plan_restore(src, Path(to_pgdata), port, wal_archive, target_time)
    except PgBackupError as exc:
        fail(str(exc))
    error: PgBackupError | None = None
    with _progress() as progress:
        progress.add_task(f"restoring {src} into {plan.pgdata}", total=None)
        try:
            out = restore_postgres(plan)
        except PgBackupError as exc:
            error = exc
    if error is not None:
        print(f"fireledger: restore: {error}; nothing was left in {plan.pgdata}", file=sys.stderr)
        sys.exit(1)   # the backup failed its check (or a tool failed): a finding, not a usage error
    if as_json:
        typer.echo(json.dumps(out))
        return
    replay = f", replaying {out['wal_archive']}" if out["wal_archive"] else ""
    typer.echo(f"restored {src} into {plan.pgdata} (schema {out['schema_version']}, PostgreSQL "
               f"{out['server_version']}, checked with pg_verifybackup{replay}); start it as {out['owner']} with "
               f"`{out['start']}`, then run `fireledger audit verify` and `fireledger due-index rebuild` on it")


def _backup_pg(db: str, folder: Path, fmt: str, as_json: bool) -> None:
    """``backup --db postgresql://…``: ``pg_basebackup -X stream`` and a manifest."""
    from fireledger.pgbackup import PgBackupError, backup_postgres, server_facts

    try:
        facts = server_facts(db)   # before the progress display: a refusal is one line
    except PgBackupError as exc:
        fail(str(exc))
    error: PgBackupError | None = None
    with _progress() as progress:
        progress.add_task("pg_basebackup", total=None)
        try:
            out = backup_postgres(db, folder, fmt, facts=facts)
        except PgBackupError as exc:
            error = exc
    if error is not None:
        fail(str(error))
    if as_json:
        typer.echo(json.dumps({"backup": out["path"], **out}))
        return
    typer.echo(f"backed up PostgreSQL {out['server_version']} (schema {out['schema_version']}) to {out['path']} "
               f"({fmt}); restore it with `fireledger restore --from {out['path']} --to-pgdata NEWDIR`")


def backup_cmd(
    to: Annotated[str, typer.Option("--to", help="The directory to write the backup into.")],
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
    fmt: Annotated[str, typer.Option("--format", help="PostgreSQL: tar (gzip) or plain.")] = "tar",
) -> None:
    """Copy the live SQLite store into a new file in DIR (online backup API; serve may keep running);
    on PostgreSQL, a pg_basebackup with its WAL and a manifest in a new directory in DIR."""
    from fireledger.pgbackup import FORMATS
    from fireledger.replication import ReplicationError, backup_sqlite

    is_pg = db.startswith(("postgresql://", "postgres://"))
    if fmt not in FORMATS or (fmt != "tar" and not is_pg):
        fail(f"--format: {fmt!r} is not one of {', '.join(FORMATS)} (plain: PostgreSQL only)")
    if is_pg:
        folder = Path(to)
        if folder.exists() and not folder.is_dir():
            fail(f"--to: {folder} is not a directory")
        _backup_pg(db, folder, fmt, as_json)
        return
    path = _sqlite_path(db, "--db")
    if not path.is_file():
        fail(f"--db: no database at {path} (start the service once, or check the path)")
    folder = Path(to)
    if folder.exists() and not folder.is_dir():
        fail(f"--to: {folder} is not a directory")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--to: cannot create {folder}: {exc.strerror or exc}")
    out = folder / f"fireledger-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}.db"
    with _progress() as progress:
        progress.add_task(f"backing up {path}", total=None)
        try:
            pages = backup_sqlite(path, out)
        except ReplicationError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"--to: cannot write {out}: {exc.strerror or exc}")
        except sqlite3.Error as exc:
            fail(f"--db: the backup of {path} failed ({type(exc).__name__}: {exc}); run it again")
    size = out.stat().st_size
    if as_json:
        typer.echo(json.dumps({"backup": str(out), "pages": pages, "bytes": size}))
        return
    typer.echo(f"backed up {path} to {out} ({pages} pages, {size} bytes); restore it with "
               f"`fireledger restore --from {out}`")


COMMANDS = (
    Command("restore", restore_cmd),
    Command("backup", backup_cmd),
)
