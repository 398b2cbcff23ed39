"""Engine adapters: how to connect, begin a write transaction and recognise errors.

Two real engines share one schema shape and one query set:

* SQLite (embedded default): WAL, ``BEGIN IMMEDIATE`` for every write transaction, a connection
  per thread; writers of several processes queue on ``<db>-writer.lock`` (decision 0218), with
  ``busy_timeout`` as the backstop (writers that do not take that file).
* PostgreSQL (psycopg 3): a connection per thread, READ COMMITTED, ``FOR UPDATE SKIP LOCKED``
  claims; ``connect_timeout`` (``FIRELEDGER_PG_CONNECT_TIMEOUT_S``, default 5 s) and
  ``statement_timeout`` (``FIRELEDGER_PG_STATEMENT_TIMEOUT_MS``, default 30 000 ms; lock waits count
  towards it) on every connection. A statement cancelled by the timeout raises :class:`StoreError`.

**Connections are held per live thread** (decision 0086): a thread's first store call takes a
connection (an idle one if any, else a new one) and keeps it while the thread lives, so the fire
path pays no checkout per statement. When the thread exits its connection goes back to a small idle
pool (at most ``max_idle``, default 4), beyond which it is closed — so short-lived worker threads
(anyio's retire after 10 s idle) never accumulate connections: open connections ≤ live threads that
used the store + ``max_idle``. A connection left inside a transaction or broken is closed, not reused.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from fireledger.errors import FireledgerError
from fireledger.waker import Waker

from . import queries
from .firesbell import FiresBell
from .pool import DEFAULT_MAX_IDLE, ConnectionPool
from .sqlitelib import UnsafeSqliteError, connect, sqlite3
from .writerlock import WriterFileLock

if TYPE_CHECKING:
    from fireledger.settings import Settings


class StoreError(FireledgerError, RuntimeError):
    """A store-level failure with a message an operator can act on."""


class SchemaError(StoreError):
    """The database schema is older (or newer) than this program's."""


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the store itself — a :class:`StoreError` or an error of either
    engine's driver, or a SQLite library refused (decision 0260) — not of the data a caller handed it."""
    if isinstance(exc, StoreError | sqlite3.Error | UnsafeSqliteError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, psycopg.Error)


def migration_files(engine: str) -> list[tuple[int, str]]:
    """(version, sql) of every migration for ``engine``, in order."""
    root = resources.files("fireledger.store").joinpath("sql", engine)
    out = []
    for entry in root.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            out.append((int(name[:4]), entry.read_text(encoding="utf-8")))
    return sorted(out)


def _sqlite_close(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        pass


def _pg_close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


def _pg_reusable(conn: Any) -> bool:
    """Closed, broken, or left inside a transaction: not handed to another thread."""
    try:
        from psycopg.pq import TransactionStatus

        return not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
    except Exception:
        return False


@dataclass(frozen=True, slots=True)
class EngineCaps:
    """What an engine can do, named, so no area store branches on the engine's name.

    ``skip_locked``: concurrent claimers lock disjoint rows inside the claim transaction
    (``FOR UPDATE SKIP LOCKED``: the claim reads every tenant's batch in one locking statement,
    decision 0130); without it there is one writer at a time and the claim reads tenant by tenant.
    ``notify``: a committed change can wake other processes (``LISTEN``/``NOTIFY``); without it they
    poll. ``server_clock``: the database has a clock of its
    own, independent of this process's (used to cross-check the local clock). ``networked``: reached
    over the network by processes on several machines (timing leases are on by default there)."""

    skip_locked: bool
    notify: bool
    server_clock: bool
    networked: bool


class Engine(ABC):
    """How to reach one database engine; subclasses: SQLite and PostgreSQL."""

    name: str
    caps: EngineCaps

    @property
    def q(self) -> dict[str, str]:
        """Every registered named query, in this engine's placeholder style (built once)."""
        cached: dict[str, str] | None = getattr(self, "_q", None)
        if cached is None:
            cached = self._q = queries.for_engine(self.name)
        return cached

    @abstractmethod
    def connection(self) -> Any:
        """This thread's connection (opened on first use)."""

    @abstractmethod
    def write(self) -> AbstractContextManager[Any]:
        """A write transaction on this thread's connection; commits on exit, rolls back on error."""

    @abstractmethod
    def read(self) -> AbstractContextManager[Any]:
        """This thread's connection for reads (autocommit snapshot per statement)."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection this engine opened."""

    def sql(self, text: str) -> str:
        """A one-off statement (``:name`` placeholders) in this engine's placeholder style."""
        return queries.in_style(self.name, text)

    @abstractmethod
    def run_script(self, c: Any, script: str) -> None:
        """Run a migration script (several statements) inside the open write transaction ``c``."""

    @abstractmethod
    def tables_with_column(self, c: Any, column: str) -> list[str]:
        """The names of the tables that have a column named ``column``, sorted."""

    #: The wake-up between processes of an engine without notifications (SQLite: decision 0256).
    fires_bell: FiresBell | None = None

    def ring_fires_after_commit(self) -> None:
        """Inside a write transaction that inserted or released fires: wake other processes'
        dispatchers once it commits, never if it rolls back (SQLite: :attr:`fires_bell`). The base
        does nothing: PostgreSQL's ``NOTIFY`` is a statement of the transaction itself."""
        return

    def scrub_after_shred(self) -> bool:
        """After destroying keys or purging rows: push the old page images out of places the engine
        keeps them. True when done; the base (PostgreSQL) does nothing and returns False — dead tuples
        stay until VACUUM, and WAL archives and backups are out of reach (docs/operations.md)."""
        return False


#: Page size of a new SQLite database (decision 0211). A commit appends every page it changes to the
#: WAL, whole; the fire path's transactions change a few rows on each of several b-trees, so the WAL
#: per fire is nearly proportional to the page size: 1 KiB pages write ≈2.5 × fewer WAL bytes per fire
#: than SQLite's default 4 KiB at the same CPU (docs/performance.md, "Cost per fire"). An existing
#: database keeps its size (docs/operations.md: how to convert one offline).
NEW_DATABASE_PAGE_SIZE = 1024


class SqliteEngine(Engine):
    name = "sqlite"
    caps = EngineCaps(skip_locked=False, notify=False, server_clock=False, networked=False)

    def __init__(self, path: str, *, busy_timeout_ms: int = 30_000, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.pool = ConnectionPool(self._open, lambda c: not c.in_transaction, _sqlite_close, max_idle)
        self._lock = threading.Lock()
        self._write_lock = threading.RLock()
        #: The writer queue across processes (``<db>-writer.lock``, decision 0218).
        self.writer_queue = WriterFileLock(path)
        #: ``<db>-fires.bell``: rung after a commit that made fires due (decision 0256).
        self.fires_bell = FiresBell(path)
        self._txn = threading.local()   # per thread: ring the bell after this transaction commits
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpointer = Waker()   # returns under a faked clock (waker.py)
        self._external_checkpoints = False

    def start_checkpointer(self, interval_s: float = 0.2) -> None:
        """Move WAL checkpoints off the commit path: this engine's connections stop checkpointing
        when they commit (``wal_autocheckpoint = 0``) and one background thread, with its own
        connection, runs a ``PASSIVE`` checkpoint every ``interval_s`` (SQLite releases the GIL while
        it copies pages, so a commit no longer waits for tens of milliseconds of checkpoint work).
        Durability is unchanged: a commit is in the WAL either way. Idempotent; stopped by close()."""
        with self._lock:
            if self._checkpointer is not None or self._external_checkpoints:
                return
            for c in self.pool.open_connections():
                c.execute("PRAGMA wal_autocheckpoint = 0")
            self._stop_checkpointer.clear()
            t = threading.Thread(target=self._checkpoint_loop, args=(interval_s,), name="sqlite-checkpoint",
                                 daemon=True)
            self._checkpointer = t
        t.start()

    def leave_checkpoints_to_replicator(self) -> None:
        """Litestream (decision 0126) must be the only one to checkpoint the WAL it ships: this
        engine's connections stop checkpointing (``wal_autocheckpoint = 0``), no checkpointer thread
        is started, and :meth:`scrub_after_shred` does not checkpoint (its TRUNCATE would wait on the
        replicator's read lock; the replica keeps old pages until its retention anyway)."""
        with self._lock:
            self._external_checkpoints = True
            for c in self.pool.open_connections():
                c.execute("PRAGMA wal_autocheckpoint = 0")

    def _checkpoint_loop(self, interval_s: float) -> None:
        conn = connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.busy_timeout_ms / 1000)
        try:
            while not self._stop_checkpointer.wait(interval_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    pass   # busy or closing: the next round tries again
        finally:
            conn.close()

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = self.pool.get()
        return conn

    def open_connections(self) -> int:
        """Connections this engine holds open for threads (held or idle; the checkpointer's own
        connection is not counted)."""
        return len(self.pool.open_connections())

    def _open(self) -> sqlite3.Connection:
        conn = connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        # Before the file has its first page (a new database) this sets its page size; on an existing
        # database it does nothing (WAL mode keeps the size the file was created with).
        conn.execute(f"PRAGMA page_size = {NEW_DATABASE_PAGE_SIZE}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # Deleted content (a destroyed tenant key, purged rows) is overwritten, not left in free
        # pages (crypto-shredding; docs/decisions/0081).
        conn.execute("PRAGMA secure_delete = ON")
        with self._lock:
            if self._checkpointer is not None or self._external_checkpoints:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction. Writers of this process queue on a lock first: SQLite's own busy
        handler *sleeps* between retries (up to 100 ms a step), so two threads of one process —
        the timing loop committing fires, the dispatcher settling attempts — would otherwise delay
        each other by whole sleep steps; the lock hands over the moment the holder commits.
        Writers in other processes queue the same way on an ``flock`` of ``<db>-writer.lock``, taken
        after the thread lock (:mod:`fireledger.store.writerlock`, decision 0218); SQLite's lock and
        its busy timeout stay the guard (and the queue for writers that do not take the file lock)."""
        conn = self.connection()
        txn = self._txn
        with self._write_lock, self.writer_queue.held():
            conn.execute("BEGIN IMMEDIATE")
            txn.ring = False
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            ring, txn.ring = txn.ring, False
        if ring and self.fires_bell is not None:
            self.fires_bell.ring()   # after the commit, outside the writer lock (a hint: never raises)

    def ring_fires_after_commit(self) -> None:
        self._txn.ring = True

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        yield self.connection()

    def run_script(self, c: Any, script: str) -> None:
        for stmt in split_script(script):
            c.execute(stmt)

    def tables_with_column(self, c: Any, column: str) -> list[str]:
        names = [str(r[0]) for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
        return sorted(n for n in names
                      if any(col[1] == column for col in c.execute(f'PRAGMA table_info("{n}")').fetchall()))

    def scrub_after_shred(self, attempts: int = 20) -> bool:
        """``PRAGMA wal_checkpoint(TRUNCATE)``: copy the WAL into the database (where
        ``secure_delete`` has zeroed the freed content) and truncate the WAL to zero bytes, so the old
        pages (a destroyed wrapped key) are in neither file. Readers of other processes can hold the
        checkpoint back: tried ``attempts`` times, 50 ms apart, each without waiting (busy timeout 0:
        a TRUNCATE that waits for readers blocks every writer meanwhile, and a replicator's read lock
        — Litestream's, decision 0126 — never ends); False when the WAL could not be truncated (the
        next checkpoint will)."""
        if self._external_checkpoints:
            return False
        conn = self.connection()
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            for i in range(attempts):
                if i:
                    time.sleep(0.05)   # between tries, not a wait for a condition
                try:
                    busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                except sqlite3.OperationalError:
                    busy = 1
                if not busy:
                    return True
            return False
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")

    def close(self) -> None:
        t, self._checkpointer = self._checkpointer, None
        if t is not None:
            self._stop_checkpointer.set()
            t.join()
        self.pool.close_all()
        with self._write_lock:
            self.writer_queue.close()
            if self.fires_bell is not None:
                self.fires_bell.close()


#: libpq options that notice a server whose machine vanished (power loss, partition: no FIN, no RST)
#: within ~10 s instead of the kernel's ~15 min retransmission timeout: TCP keepalives on an idle
#: connection (5 s idle, then 5 probes 1 s apart) and ``tcp_user_timeout`` for data sent and never
#: acknowledged. The statement then fails, the pool replaces the connection, and the multi-host URL
#: reaches the promoted primary (issue 16; docs/decisions/0128). An option written in the URL wins.
DEAD_PEER_OPTIONS = {"keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "1",
                     "keepalives_count": "5", "tcp_user_timeout": "10000"}


def dead_peer_options(url: str) -> dict[str, Any]:
    """:data:`DEAD_PEER_OPTIONS` less those ``url`` sets itself (for connections opened outside the
    pool: the definition listener, the clock probe). An unparsable URL gets them all."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        given = conninfo_to_dict(url)
    except Exception:
        given = {}
    return {k: v for k, v in DEAD_PEER_OPTIONS.items() if k not in given}


class PostgresEngine(Engine):
    name = "postgres"
    caps = EngineCaps(skip_locked=True, notify=True, server_clock=True, networked=True)

    def __init__(self, url: str, *, max_idle: int = DEFAULT_MAX_IDLE, connect_timeout_s: int = 5,
                 statement_timeout_ms: int = 30_000) -> None:
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self.statement_timeout_ms = statement_timeout_ms
        self.pool = ConnectionPool(self._open, _pg_reusable, _pg_close, max_idle)

    def _open(self) -> Any:
        """A new autocommit connection with the connect and statement timeouts and
        :data:`DEAD_PEER_OPTIONS` (a ``connect_timeout`` or keepalive option written in the URL wins)."""
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = conninfo_to_dict(self.url)
        except psycopg.ProgrammingError as exc:
            raise StoreError(f"--db: not a PostgreSQL URL: {str(exc).strip()}") from None
        extra: dict[str, Any] = {} if "connect_timeout" in given else {"connect_timeout": int(self.connect_timeout_s)}
        extra.update(dead_peer_options(self.url))
        try:
            conn = psycopg.connect(self.url, autocommit=True, **extra)
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(self.statement_timeout_ms),))
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from None
        return conn

    def connection(self) -> Any:
        return self.pool.get(lambda c: not c.closed)

    def open_connections(self) -> int:
        """Connections this engine holds open for threads (held or idle)."""
        return len(self.pool.open_connections())

    def _timed_out(self, exc: BaseException) -> StoreError | None:
        """A cancelled statement as a clear :class:`StoreError` (None for any other error)."""
        from psycopg import errors

        if isinstance(exc, errors.QueryCanceled):
            return StoreError(
                f"PostgreSQL cancelled a statement after {self.statement_timeout_ms} ms "
                "(statement_timeout, FIRELEDGER_PG_STATEMENT_TIMEOUT_MS): the database is overloaded "
                "or a lock was held too long")
        return None

    def _failed(self, conn: Any, exc: Exception) -> StoreError | None:
        """After a failed statement: a broken connection invalidates the pool (the others reached
        the same server); returns the error to raise instead, if any (:meth:`_timed_out`)."""
        if getattr(conn, "closed", False):
            self.pool.invalidate()
        return self._timed_out(exc)

    @contextmanager
    def write(self) -> Iterator[Any]:
        conn = self.connection()
        try:
            with conn.transaction():
                yield conn
        except Exception as exc:
            mapped = self._failed(conn, exc)
            if mapped is not None:
                raise mapped from exc
            raise

    @contextmanager
    def read(self) -> Iterator[Any]:
        conn = self.connection()
        try:
            yield conn
        except Exception as exc:
            mapped = self._failed(conn, exc)
            if mapped is not None:
                raise mapped from exc
            raise

    def run_script(self, c: Any, script: str) -> None:
        c.execute("SET LOCAL statement_timeout = 0")   # a migration may rewrite a big table
        c.execute(script)

    def tables_with_column(self, c: Any, column: str) -> list[str]:
        rows = c.execute("SELECT table_name FROM information_schema.columns WHERE column_name = %(column)s "
                         "AND table_schema = current_schema() ORDER BY table_name", {"column": column}).fetchall()
        return sorted({str(r[0]) for r in rows})

    def close(self) -> None:
        self.pool.close_all()


def split_script(sql: str) -> list[str]:
    """Split a migration into statements (no ';' inside literals; a ``CREATE TRIGGER … BEGIN …; END``
    body stays one statement: pieces are joined until SQLite says the statement is complete)."""
    lines = [ln for ln in sql.splitlines() if not ln.strip().startswith("--")]
    out: list[str] = []
    buf = ""
    for piece in "\n".join(lines).split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n\t;"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" \n\t;"):
        out.append(buf.strip())
    return out


def engine_for_url(url: str, settings: Settings | None = None) -> Engine:
    """``sqlite:///PATH`` (relative) / ``sqlite:////abs/path`` or ``postgresql://…``. The PostgreSQL
    timeouts come from ``settings`` (``pg_connect_timeout_s``, ``pg_statement_timeout_ms``; read once
    from the environment by the entry point, decision 0106); without settings, the defaults."""
    if url.startswith("sqlite:"):
        parsed = urlparse(url)
        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else parsed.path
        if not path:
            raise StoreError("--db: a SQLite URL needs a path, e.g. sqlite:///./.fireledger/fireledger.db")
        from fireledger.statedir import StateDirError, ensure_state_dir, is_in_state_dir

        if is_in_state_dir(path):   # the default store: its directory is the state directory (0700)
            try:
                ensure_state_dir()
            except StateDirError as exc:
                raise StoreError(str(exc)) from None
        return SqliteEngine(path)
    if url.startswith(("postgresql://", "postgres://")):
        if settings is None:
            return PostgresEngine(url)
        return PostgresEngine(url, connect_timeout_s=settings.pg_connect_timeout_s,
                              statement_timeout_ms=settings.pg_statement_timeout_ms)
    raise StoreError(f"--db: {url!r} is not a sqlite:///PATH or postgresql:// URL")
