"""The throwaway PostgreSQL server used by the postgres-marked tests."""

from __future__ import annotations

import psycopg
import pytest

from pgserver import PgServer

pytestmark = pytest.mark.postgres

USER_RELATIONS = """
select count(*) from pg_catalog.pg_class c
join pg_catalog.pg_namespace n on n.oid = c.relnamespace
where n.nspname not in ('pg_catalog', 'information_schema') and n.nspname not like 'pg_toast%'
"""


def test_select_1(pg_server: PgServer) -> None:
    with psycopg.connect(pg_server.url) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert conn.execute("show max_connections").fetchone() == ("200",)


def test_new_databases_are_distinct_empty_and_isolated(pg_server: PgServer) -> None:
    a, b = pg_server.new_database(), pg_server.new_database()
    assert a != b
    names = []
    for url in (a, b):
        with psycopg.connect(url) as conn:
            names.append(conn.execute("select current_database()").fetchone())
            assert conn.execute(USER_RELATIONS).fetchone() == (0,)
    assert names[0] != names[1]
    with psycopg.connect(a) as conn:
        conn.execute("create table t (x int)")
    with psycopg.connect(b) as conn:
        assert conn.execute(USER_RELATIONS).fetchone() == (0,), "a table in one database leaks into another"


def test_a_new_database_can_be_a_copy_of_a_template(pg_server: PgServer) -> None:
    source = pg_server.new_database()
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("create table t (x int)")
        conn.execute("insert into t values (7)")
        name = conn.execute("select current_database()").fetchone()[0]   # type: ignore[index]
    copy = pg_server.new_database(template=name)
    with psycopg.connect(copy, autocommit=True) as conn:
        assert conn.execute("select x from t").fetchall() == [(7,)]
        conn.execute("insert into t values (8)")
    with psycopg.connect(source) as conn:
        assert conn.execute("select x from t").fetchall() == [(7,)], "a write to the copy reached its template"


def _databases(pg_server: PgServer) -> set[str]:
    with psycopg.connect(pg_server.url) as conn:
        return {r[0] for r in conn.execute("select datname from pg_database")}


def test_the_databases_made_after_a_mark_are_dropped(pg_server: PgServer) -> None:
    """What conftest's per-test clean-up relies on (decision 0223): only databases made after the
    mark are dropped, and an open connection does not stop it."""
    before = pg_server.new_database()
    mark = pg_server.created()
    later = [pg_server.new_database() for _ in range(2)]
    left_open = psycopg.connect(later[0])
    try:
        pg_server.drop_databases_since(mark)
    finally:
        left_open.close()
    names = _databases(pg_server)
    assert before.rsplit("/", 1)[1] in names
    assert not {u.rsplit("/", 1)[1] for u in later} & names
    assert pg_server.created() == mark
