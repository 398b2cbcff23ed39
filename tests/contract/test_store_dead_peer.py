"""PostgreSQL connections after the server went away (issue 16, a failover): every connection
carries libpq's TCP keepalives and ``tcp_user_timeout`` (a primary whose machine vanished is noticed
in seconds, not after the kernel's ~15 min), an option written in the URL wins, and once one thread
finds its connection broken the pool has every other thread replace its own before a statement of
theirs fails on it. Real PostgreSQL; the server going away is ``pg_terminate_backend``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from fireledger.store import Store, is_database_error
from fireledger.store.engine import DEAD_PEER_OPTIONS, dead_peer_options

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(pg_server):
    url = pg_server.new_database()
    Store.open(url, migrate=True).close()
    return url


def _options(conn) -> dict[str, str]:
    return {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}


def test_connections_carry_keepalives_and_a_user_timeout(pg_url):
    store = Store.open(pg_url)
    try:
        with store.engine.read() as c:
            got = _options(c)
        assert {k: got[k] for k in DEAD_PEER_OPTIONS} == DEAD_PEER_OPTIONS
        assert DEAD_PEER_OPTIONS["keepalives"] == "1" and int(DEAD_PEER_OPTIONS["tcp_user_timeout"]) <= 10_000
    finally:
        store.close()


def test_an_option_written_in_the_url_wins(pg_url):
    url = f"{pg_url}?keepalives_idle=30&tcp_user_timeout=0"
    assert "keepalives_idle" not in dead_peer_options(url) and "keepalives_count" in dead_peer_options(url)
    store = Store.open(url)
    try:
        with store.engine.read() as c:
            got = _options(c)
        assert got["keepalives_idle"] == "30" and got["tcp_user_timeout"] == "0"
        assert got["keepalives_count"] == DEAD_PEER_OPTIONS["keepalives_count"]
    finally:
        store.close()


def _backend_pid(store: Store) -> int:
    with store.engine.read() as c:
        return int(c.execute("SELECT pg_backend_pid()").fetchone()[0])


def test_one_broken_connection_has_every_thread_replace_its_own(pg_url):
    store = Store.open(pg_url)
    one, two = ThreadPoolExecutor(1), ThreadPoolExecutor(1)   # two long-lived threads, a connection each
    try:
        pids = [one.submit(_backend_pid, store).result(), two.submit(_backend_pid, store).result()]
        assert pids[0] != pids[1]
        with psycopg.connect(pg_url, autocommit=True) as admin:   # the server drops both sessions
            for pid in pids:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(Exception) as failed:                  # the first thread finds out …
            one.submit(_backend_pid, store).result()
        assert is_database_error(failed.value)
        fresh = two.submit(_backend_pid, store).result()          # … the second does not fail on it
        assert fresh not in pids
        assert one.submit(_backend_pid, store).result() not in pids
    finally:
        one.shutdown()
        two.shutdown()
        store.close()
