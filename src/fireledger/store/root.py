"""The Store: five area stores over one engine, and the store's lifecycle.

``Store.open(url, settings=...)`` connects (SQLite or PostgreSQL), migrates or checks the schema,
and composes the areas; each is reached as an attribute:

* ``store.registry`` — tenants, targets, triggers, versions, the due index, pause/resume, backfill
  (:class:`~fireledger.store.protocols.RegistryStore`, :mod:`fireledger.store.registry`);
* ``store.timing`` — due reads, decisions, overlap facts, partitions, leases, node sessions, shadow
  (:class:`~fireledger.store.protocols.TimingStore`, :mod:`fireledger.store.timing`);
* ``store.dispatch`` — claims, shaping state, settlement, queues, outcomes, quotas
  (:class:`~fireledger.store.protocols.DispatchStore`, :mod:`fireledger.store.dispatch`);
* ``store.trust`` — principals, tenant keys, the audit chain, console sessions, target verification,
  tenant deletion and purge (:class:`~fireledger.store.protocols.TrustStore`, :mod:`fireledger.store.trust`);
* ``store.history`` — history reads, reports, console pages, ops views, retention
  (:class:`~fireledger.store.protocols.HistoryStore`, :mod:`fireledger.store.history`).

Composition is the one place areas meet: the registry, timing and dispatch areas are handed the
trust area's in-transaction audit append (:meth:`SqlTrust.append_in`), so an audited act and its
audit row commit together without any area reaching into another.

Every method that writes takes ``now_us`` from the caller: the store never reads a clock.
Compare-and-sets: zero rows is a normal outcome ("decided elsewhere"), more than one is a bug and
raises :class:`~fireledger.store.core.InvariantViolation` (rolling the transaction back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .core import InvariantViolation
from .dispatch import SqlDispatch
from .engine import Engine, SchemaError, SqliteEngine, engine_for_url, migration_files
from .history import SqlHistory
from .protocols import DispatchStore, HistoryStore, RegistryStore, TimingStore, TrustStore
from .registry import SqlRegistry
from .timing import SqlTiming
from .trust import AUDIT_KEYED_MIGRATION, SqlTrust

if TYPE_CHECKING:
    from fireledger.settings import Settings


class Store:
    """The state of record: five areas and the lifecycle. Thread-safe: each thread uses its own
    connection (:mod:`fireledger.store.engine`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.q = engine.q
        trust = SqlTrust(engine)
        # Callers see each area through its protocol (what it guarantees), not its implementation.
        self.trust: TrustStore = trust
        self.registry: RegistryStore = SqlRegistry(engine, trust.append_in)
        self.timing: TimingStore = SqlTiming(engine, trust.append_in)
        self.dispatch: DispatchStore = SqlDispatch(engine, trust.append_in)
        self.history: HistoryStore = SqlHistory(engine)

    @classmethod
    def open(cls, url: str, *, settings: Settings | None = None, migrate: bool | None = None) -> Store:
        """Open the store at ``url``. SQLite migrates on first use; PostgreSQL only checks the schema
        (``fireledger db upgrade`` migrates) unless ``migrate=True``. ``settings``: the PostgreSQL
        timeouts (read once from the environment by the entry point; without it, the defaults)."""
        store = cls(engine_for_url(url, settings))
        do_migrate = isinstance(store.engine, SqliteEngine) if migrate is None else migrate
        if do_migrate:
            store.migrate()
        else:
            store.check_schema()
        return store

    @property
    def engine_name(self) -> str:
        """``sqlite`` or ``postgres``."""
        return str(self.engine.name)

    def close(self) -> None:
        """Close every connection (threads that use the store again reopen one)."""
        self.engine.close()

    def server_time_us(self) -> int:
        """The database server's clock (PostgreSQL ``clock_timestamp()``), µs since the epoch."""
        with self.engine.read() as c:
            return int(c.execute(self.q["server_time_us"]).fetchone()[0])

    # --- schema ---------------------------------------------------------------------------------

    def applied_migrations(self) -> set[int]:
        """Versions recorded in ``schema_migrations`` (empty for a fresh database)."""
        with self.engine.read() as c:
            try:
                rows = c.execute("SELECT version FROM schema_migrations").fetchall()
            except Exception:
                return set()
        return {int(r[0]) for r in rows}

    def schema_version(self) -> int:
        """The highest applied migration (0 for a fresh database)."""
        return max(self.applied_migrations(), default=0)

    def migrate(self, now_us: int = 0) -> list[int]:
        """Apply every missing migration, each in its own transaction; returns those applied."""
        applied = []
        with self.engine.write() as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_us BIGINT)"
            )
        done = self.applied_migrations()
        for version, sql in migration_files(self.engine.name):
            if version in done:
                continue
            with self.engine.write() as c:
                self.engine.run_script(c, sql)
                if version == AUDIT_KEYED_MIGRATION:
                    self.trust.seal_legacy_audit(c, now_us)   # unkeyed rows sealed by a keyed row (0090)
                c.execute(self.engine.sql("INSERT INTO schema_migrations (version, applied_us) VALUES (:v, :n)"),
                          {"v": version, "n": now_us})
            applied.append(version)
        return applied

    def check_schema(self) -> None:
        """Raise :class:`SchemaError` unless the database is at this program's schema version."""
        files = [v for v, _ in migration_files(self.engine.name)]
        want = files[-1]
        have = self.schema_version()
        missing = sorted(set(files) - self.applied_migrations())
        if missing and have <= want:
            have = missing[0] - 1
        if have < want:
            raise SchemaError(
                f"the database schema is at version {have}, this program needs {want}: "
                "run `fireledger db upgrade --db URL` first"
            )
        if have > want:
            raise SchemaError(f"the database schema ({have}) is newer than this program ({want})")


__all__ = ["InvariantViolation", "SchemaError", "Store"]
