"""The SQLite and PostgreSQL migration trees stay in step (src/fireledger/store/sql/{sqlite,postgres}/).

Every store query is written once per engine against "the" schema, so the two trees must build the
same one: the same migration files (versions and names), and after applying all of them on a real
SQLite file and a real PostgreSQL database, the same tables, the same columns per table (types
compared by family through :data:`TYPE_FAMILY`: SQLite's ``INTEGER`` is PostgreSQL's ``bigint``),
the same primary keys and the same indexes (name, table, columns). A migration added to one tree
only, or a column one engine lacks, fails here with the difference named.

Not compared, on purpose: triggers, functions and notification channels (the append-only audit and
``LISTEN``/``NOTIFY`` are built differently per engine and have behaviour tests of their own), index
predicates and column defaults (engine syntax).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import pytest

from fireledger.store import Store
from storekit import ENGINES, open_store

#: A declared column type → its family. Widths are not compared (an engine's ``integer`` and
#: ``bigint`` are one family; SQLite stores every integer in 64 bits anyway). A type missing here
#: fails the test: add it deliberately, next to its counterpart on the other engine.
TYPE_FAMILY = {
    "integer": "integer", "bigint": "integer", "smallint": "integer",
    "text": "text",
    "real": "float", "double precision": "float",
    "blob": "bytes", "bytea": "bytes",
}


@dataclass(frozen=True)
class Schema:
    """What a migrated database looks like, engine-neutral."""

    #: table → column → type family
    tables: dict[str, dict[str, str]]
    #: table → its primary key's columns, in key order
    primary_keys: dict[str, tuple[str, ...]]
    #: index name → (table, indexed columns in order; ``None`` for an expression)
    indexes: dict[str, tuple[str, tuple[str | None, ...]]]


def migration_names(engine: str) -> list[str]:
    """The migration files of ``engine``'s tree, by name, in order."""
    tree = resources.files("fireledger.store").joinpath("sql", engine)
    return sorted(e.name for e in tree.iterdir() if e.name.endswith(".sql"))


def family(engine: str, table: str, column: str, declared: str) -> str:
    try:
        return TYPE_FAMILY[declared.strip().lower()]
    except KeyError:
        raise AssertionError(f"{engine}: {table}.{column} has type {declared!r}, which TYPE_FAMILY does not "
                             "know: add it (with its counterpart on the other engine)") from None


def sqlite_schema(store: Store) -> Schema:
    tables: dict[str, dict[str, str]] = {}
    keys: dict[str, tuple[str, ...]] = {}
    indexes: dict[str, tuple[str, tuple[str | None, ...]]] = {}
    with store.engine.read() as c:
        names = [r[0] for r in c.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        for t in names:
            cols = c.execute(f'PRAGMA table_info("{t}")').fetchall()   # (cid, name, type, notnull, default, pk)
            tables[t] = {r[1]: family("sqlite", t, r[1], r[2]) for r in cols}
            keys[t] = tuple(r[1] for r in sorted((r for r in cols if r[5]), key=lambda r: r[5]))
        for name, table in c.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index' "
                                     "AND name NOT LIKE 'sqlite_autoindex_%'"):
            info = c.execute(f'PRAGMA index_info("{name}")').fetchall()   # (seqno, cid, name)
            indexes[name] = (table, tuple(r[2] for r in sorted(info)))
    return Schema(tables, keys, indexes)


def postgres_schema(store: Store) -> Schema:
    tables: dict[str, dict[str, str]] = {}
    keys: dict[str, tuple[str, ...]] = {}
    indexes: dict[str, tuple[str, tuple[str | None, ...]]] = {}
    with store.engine.read() as c:
        for t, col, declared in c.execute(
                "SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c "
                "JOIN information_schema.tables t USING (table_schema, table_name) "
                "WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' "
                "ORDER BY c.table_name, c.ordinal_position"):
            tables.setdefault(t, {})[col] = family("postgres", t, col, declared)
        keys = {t: () for t in tables}
        for t, col in c.execute(
                "SELECT tc.table_name, k.column_name FROM information_schema.table_constraints tc "
                "JOIN information_schema.key_column_usage k USING (constraint_schema, constraint_name) "
                "WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = current_schema() "
                "ORDER BY tc.table_name, k.ordinal_position"):
            keys[t] = (*keys[t], col)
        # Indexes created by CREATE INDEX (those backing a primary key or unique constraint are the
        # constraint's, as SQLite's sqlite_autoindex_* are).
        for name, table, cols in c.execute(
                "SELECT i.relname, t.relname, ARRAY(SELECT a.attname FROM unnest(x.indkey::int2[]) "
                "  WITH ORDINALITY AS k(attnum, ord) LEFT JOIN pg_attribute a "
                "  ON a.attrelid = t.oid AND a.attnum = k.attnum ORDER BY k.ord) "
                "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
                "JOIN pg_namespace n ON n.oid = i.relnamespace WHERE n.nspname = current_schema() "
                "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)"):
            indexes[name] = (table, tuple(cols))
    return Schema(tables, keys, indexes)


def differences(sqlite: Schema, postgres: Schema) -> list[str]:
    """Every way the two schemas differ, one readable line each (empty when they agree)."""
    out: list[str] = []

    def one_side(what: str, a: Any, b: Any) -> None:
        for name in sorted(set(a) - set(b)):
            out.append(f"{what} {name}: SQLite only")
        for name in sorted(set(b) - set(a)):
            out.append(f"{what} {name}: PostgreSQL only")

    one_side("table", sqlite.tables, postgres.tables)
    for t in sorted(set(sqlite.tables) & set(postgres.tables)):
        a, b = sqlite.tables[t], postgres.tables[t]
        one_side("column", {f"{t}.{c}" for c in a}, {f"{t}.{c}" for c in b})
        out += [f"column {t}.{c}: {a[c]} on SQLite, {b[c]} on PostgreSQL"
                for c in sorted(set(a) & set(b)) if a[c] != b[c]]
        if sqlite.primary_keys.get(t) != postgres.primary_keys.get(t):
            out.append(f"primary key of {t}: {sqlite.primary_keys.get(t)} on SQLite, "
                       f"{postgres.primary_keys.get(t)} on PostgreSQL")
    one_side("index", sqlite.indexes, postgres.indexes)
    out += [f"index {i}: {sqlite.indexes[i]} on SQLite, {postgres.indexes[i]} on PostgreSQL"
            for i in sorted(set(sqlite.indexes) & set(postgres.indexes)) if sqlite.indexes[i] != postgres.indexes[i]]
    return out


def test_both_trees_hold_the_same_migration_files():
    names = {e: migration_names(e) for e in ENGINES}
    assert names["sqlite"], "no migration files found"
    assert names["sqlite"] == names["postgres"], names
    versions = [n[:4] for n in names["sqlite"]]
    assert all(v.isdigit() for v in versions) and len(set(versions)) == len(versions), versions


@pytest.mark.postgres
def test_both_engines_migrate_to_the_same_schema(tmp_path, pg_server):
    sqlite = open_store("sqlite", tmp_path, None)
    postgres = open_store("postgres", tmp_path, pg_server)
    try:
        versions = {int(n[:4]) for n in migration_names("sqlite")}
        assert sqlite.applied_migrations() == postgres.applied_migrations() == versions
        a, b = sqlite_schema(sqlite), postgres_schema(postgres)
    finally:
        sqlite.close()
        postgres.close()
    assert {"tenants", "triggers", "due", "fires", "attempts", "audit"} <= set(a.tables)   # introspection saw it
    assert a.indexes and any(a.primary_keys.values())
    found = differences(a, b)
    assert not found, "the migration trees have drifted apart:\n" + "\n".join(found)


def test_a_column_or_index_on_one_engine_only_is_named(tmp_path):
    """The comparison is not vacuous: each kind of drift is reported, naming what differs."""
    store = open_store("sqlite", tmp_path, None)
    try:
        base = sqlite_schema(store)
    finally:
        store.close()
    assert differences(base, base) == []
    extra = replace(base, tables={**base.tables, "fires": {**base.tables["fires"], "extra": "text"}})
    assert differences(base, extra) == ["column fires.extra: PostgreSQL only"]
    retyped = replace(base, tables={**base.tables, "fires": {**base.tables["fires"], "seq": "text"}})
    assert differences(base, retyped) == ["column fires.seq: integer on SQLite, text on PostgreSQL"]
    name = sorted(base.indexes)[0]
    fewer = replace(base, indexes={k: v for k, v in base.indexes.items() if k != name})
    assert differences(base, fewer) == [f"index {name}: SQLite only"]
    rekeyed = replace(base, primary_keys={**base.primary_keys, "due": ("tenant_id",)})
    assert differences(base, rekeyed) == [
        f"primary key of due: {base.primary_keys['due']} on SQLite, ('tenant_id',) on PostgreSQL"]
