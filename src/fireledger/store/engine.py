"""Engine adapters: how to connect, begin a write transaction and recognise errors.

Two real engines share one schema shape and one query set:

* SQLite (embedded default): WAL, ``BEGIN IMMEDIATE`` for every write transaction, a connection
  per thread, ``busy_timeout`` so concurrent processes (``serve`` and an operator command) queue.
* PostgreSQL (psycopg 3): a connection per thread, READ COMMITTED, ``FOR UPDATE SKIP LOCKED``
  claims.
"""

from __future__ import annotations

import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from importlib import resources
from typing import Any
from urllib.parse import urlparse

from . import queries


class StoreError(RuntimeError):
    """A store-level failure with a message an operator can act on."""


class SchemaError(StoreError):
    """The database schema is older (or newer) than this program's."""


def migration_files(engine: str) -> list[tuple[int, str]]:
    """(version, sql) of every migration for ``engine``, in order."""
    root = resources.files("fireledger.store").joinpath("sql", engine)
    out = []
    for entry in root.iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            out.append((int(name[:4]), entry.read_text(encoding="utf-8")))
    return sorted(out)


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

    def __init__(self, path: str, *, busy_timeout_ms: int = 30_000) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
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
            for c in self._all:
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
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=self.busy_timeout_ms / 1000)
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Deleted content (a destroyed tenant key, purged rows) is overwritten, not left in free
            # pages (crypto-shredding; docs/decisions/0081).
            conn.execute("PRAGMA secure_delete = ON")
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
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
        with self._lock:
            for c in self._all:
                try:
                    c.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()


class PostgresEngine(Engine):
    name = "postgres"

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def connection(self) -> Any:
        import psycopg

        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            try:
                conn = psycopg.connect(self.url, autocommit=True)
            except psycopg.OperationalError as exc:
                raise StoreError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from None
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def write(self) -> Iterator[Any]:
        conn = self.connection()
        with conn.transaction():
            yield conn

    @contextmanager
    def read(self) -> Iterator[Any]:
        yield self.connection()

    def close(self) -> None:
        with self._lock:
            for c in self._all:
                try:
                    c.close()
                except Exception:
                    pass
            self._all.clear()
        self._local = threading.local()


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
