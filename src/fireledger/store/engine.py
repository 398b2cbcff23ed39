"""Engine adapters: how to connect, begin a write transaction and recognise errors.

Two real engines share one schema shape and one query set:

* SQLite (embedded default): WAL, ``BEGIN IMMEDIATE`` for every write transaction, a connection
  per thread, ``busy_timeout`` so concurrent processes (``serve`` and an operator command) queue.
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

import sqlite3
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from importlib import resources
from typing import Any
from urllib.parse import urlparse

from fireledger.errors import FireledgerError

from . import queries


class StoreError(FireledgerError, RuntimeError):
    """A store-level failure with a message an operator can act on."""


class SchemaError(StoreError):
    """The database schema is older (or newer) than this program's."""


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the store itself — a :class:`StoreError` or an error of either
    engine's driver — rather than of the data a caller handed it."""
    if isinstance(exc, StoreError | sqlite3.Error):
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


#: Idle connections kept for the next new thread (beyond this, a dead thread's connection is closed).
DEFAULT_MAX_IDLE = 4


class _Held:
    """A thread's claim on one connection; when the thread exits its thread-local dies with it and
    the finalizer hands the connection back to the pool."""

    __slots__ = ("__weakref__", "conn", "generation")

    def __init__(self, conn: Any, generation: int = 0) -> None:
        self.conn = conn
        self.generation = generation


class ConnectionPool:
    """Connections held by live threads, plus at most ``max_idle`` idle ones (module docstring).

    ``opener()`` opens a connection; ``reusable(conn)`` says whether a released one may serve
    another thread (not closed, not inside a transaction); ``closer(conn)`` closes one quietly."""

    def __init__(self, opener: Callable[[], Any], reusable: Callable[[Any], bool],
                 closer: Callable[[Any], None], max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self._opener = opener
        self._reusable = reusable
        self._closer = closer
        self.max_idle = max_idle
        self._local = threading.local()
        self._lock = threading.RLock()   # a finalizer may run on a thread already inside the pool
        self._open: dict[int, Any] = {}     # id → every open connection (held or idle)
        self._idle: list[Any] = []
        self.generation = 0   # bumped by invalidate(): connections opened before are suspect

    def get(self, valid: Callable[[Any], bool] = lambda c: True) -> Any:
        """This thread's connection (taken from the idle ones, or opened, on first use; replaced
        when ``valid(conn)`` is false, e.g. a PostgreSQL connection that was closed)."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is not None:
            stale = held.generation != self.generation and self._reusable(held.conn)   # never mid-transaction
            if valid(held.conn) and not stale:
                return held.conn
            self._discard(held.conn)
        conn = None
        with self._lock:
            while self._idle and conn is None:
                cand = self._idle.pop()
                if valid(cand):
                    conn = cand
                else:
                    self._open.pop(id(cand), None)
                    self._closer(cand)
        if conn is None:
            conn = self._opener()
            with self._lock:
                self._open[id(conn)] = conn
        held = _Held(conn, self.generation)
        fin = weakref.finalize(held, self._give_back, conn)
        fin.atexit = False
        self._local.held = held
        return conn

    def _discard(self, conn: Any) -> None:
        with self._lock:
            self._open.pop(id(conn), None)
        self._closer(conn)

    def _give_back(self, conn: Any) -> None:
        """A thread that held ``conn`` ended: keep it idle (up to ``max_idle``) or close it."""
        with self._lock:
            if self._open.get(id(conn)) is not conn:
                return                          # closed meanwhile by close_all()
            keep = len(self._idle) < self.max_idle and self._reusable(conn)
            if keep:
                self._idle.append(conn)
            else:
                del self._open[id(conn)]
        if not keep:
            self._closer(conn)

    def invalidate(self) -> None:
        """A connection was found broken (its server went away, e.g. a failover): close the idle
        connections now, and have every thread replace the one it holds at its next call (outside a
        transaction) instead of finding it dead with a failed statement."""
        with self._lock:
            self.generation += 1
            idle, self._idle = self._idle, []
            for c in idle:
                self._open.pop(id(c), None)
        for c in idle:
            self._closer(c)

    def open_connections(self) -> list[Any]:
        """Every open connection (held by a live thread or idle)."""
        with self._lock:
            return list(self._open.values())

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def close_all(self) -> None:
        """Close every connection; threads that held one open a new one on their next call."""
        with self._lock:
            conns = list(self._open.values())
            self._open.clear()
            self._idle.clear()
            old, self._local = self._local, threading.local()
        del old   # this thread's claim dies here: its finalizer finds the connection gone and ignores it
        for c in conns:
            self._closer(c)


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


def _env_number(name: str, default: float, *, minimum: float, whole: bool = False) -> float:
    """A numeric setting from the environment; ``StoreError`` naming the variable when bad."""
    from fireledger.settings import parse_store_number, process_env

    try:
        return parse_store_number(process_env(), name, default, minimum=minimum, whole=whole)
    except ValueError as exc:
        raise StoreError(str(exc)) from None


class Engine(ABC):
    """How to reach one database engine; subclasses: SQLite and PostgreSQL."""

    name: str

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

    def scrub_after_shred(self) -> bool:
        """After destroying keys or purging rows: push the old page images out of places the engine
        keeps them. True when done; the base (PostgreSQL) does nothing and returns False — dead tuples
        stay until VACUUM, and WAL archives and backups are out of reach (docs/operations.md)."""
        return False


class SqliteEngine(Engine):
    name = "sqlite"

    def __init__(self, path: str, *, busy_timeout_ms: int = 30_000, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.pool = ConnectionPool(self._open, lambda c: not c.in_transaction, _sqlite_close, max_idle)
        self._lock = threading.Lock()
        self._write_lock = threading.RLock()
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpointer = threading.Event()

    def start_checkpointer(self, interval_s: float = 0.2) -> None:
        """Move WAL checkpoints off the commit path: this engine's connections stop checkpointing
        when they commit (``wal_autocheckpoint = 0``) and one background thread, with its own
        connection, runs a ``PASSIVE`` checkpoint every ``interval_s`` (SQLite releases the GIL while
        it copies pages, so a commit no longer waits for tens of milliseconds of checkpoint work).
        Durability is unchanged: a commit is in the WAL either way. Idempotent; stopped by close()."""
        with self._lock:
            if self._checkpointer is not None:
                return
            for c in self.pool.open_connections():
                c.execute("PRAGMA wal_autocheckpoint = 0")
            self._stop_checkpointer.clear()
            t = threading.Thread(target=self._checkpoint_loop, args=(interval_s,), name="sqlite-checkpoint",
                                 daemon=True)
            self._checkpointer = t
        t.start()

    def _checkpoint_loop(self, interval_s: float) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
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
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=self.busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        # Deleted content (a destroyed tenant key, purged rows) is overwritten, not left in free
        # pages (crypto-shredding; docs/decisions/0081).
        conn.execute("PRAGMA secure_delete = ON")
        with self._lock:
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        return conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction. Writers of this process queue on a lock first: SQLite's own busy
        handler *sleeps* between retries (up to 100 ms a step), so two threads of one process —
        the timing loop committing fires, the dispatcher settling attempts — would otherwise delay
        each other by whole sleep steps; the lock hands over the moment the holder commits.
        Writers in other processes still meet at SQLite's lock and its busy timeout."""
        conn = self.connection()
        with self._write_lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        yield self.connection()

    def scrub_after_shred(self, attempts: int = 20) -> bool:
        """``PRAGMA wal_checkpoint(TRUNCATE)``: copy the WAL into the database (where
        ``secure_delete`` has zeroed the freed content) and truncate the WAL to zero bytes, so the old
        pages (a destroyed wrapped key) are in neither file. Readers of other processes can hold the
        checkpoint back: tried ``attempts`` times (SQLite's busy handler waits between tries); False
        when the WAL could not be truncated (the next checkpoint will)."""
        conn = self.connection()
        for _ in range(attempts):
            try:
                busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.OperationalError:
                busy = 1
            if not busy:
                return True
        return False

    def close(self) -> None:
        t, self._checkpointer = self._checkpointer, None
        if t is not None:
            self._stop_checkpointer.set()
            t.join()
        self.pool.close_all()


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

    def __init__(self, url: str, *, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        self.url = url
        self.connect_timeout_s = _env_number("FIRELEDGER_PG_CONNECT_TIMEOUT_S", 5, minimum=1, whole=True)
        self.statement_timeout_ms = int(_env_number("FIRELEDGER_PG_STATEMENT_TIMEOUT_MS", 30_000, minimum=0,
                                                    whole=True))
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

    def close(self) -> None:
        self.pool.close_all()


def engine_for_url(url: str) -> Engine:
    """``sqlite:///PATH`` (relative) / ``sqlite:////abs/path`` or ``postgresql://…``."""
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
        return PostgresEngine(url)
    raise StoreError(f"--db: {url!r} is not a sqlite:///PATH or postgresql:// URL")
