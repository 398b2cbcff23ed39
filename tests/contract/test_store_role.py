"""The store's role reading (``fireledger.store.role``) on both engines, the failover count, and
the /metrics families built from them (issue 16)."""

from __future__ import annotations

from prometheus_client import generate_latest

from fireledger.clock import SystemClock
from fireledger.observe.metrics import StoreCollector
from fireledger.store.role import FailoverWatch, StoreRole, read_role


def test_role_of_each_engine(store):
    got = read_role(store)
    if store.engine_name == "sqlite":
        assert got == StoreRole("embedded", server="sqlite")
    else:
        # The test server is a lone primary: no standby, so commits do not wait for one.
        assert got.role == "primary"
        assert got.timeline >= 1
        assert got.sync_standbys == 0 and got.synchronous is False and got.sync_required is False
        assert got.promotions == got.timeline - 1 == got.as_dict()["promotions"]
        assert got.server.endswith(f":{store.engine.url.split(':')[-1].split('/')[0]}")


def test_failover_watch_counts_primary_changes_only():
    w = FailoverWatch()
    assert w.observe(StoreRole("primary", server="a:1", timeline=1)) == 0     # the first reading counts nothing
    assert w.observe(StoreRole("primary", server="a:1", timeline=1)) == 0
    assert w.observe(StoreRole("unreachable")) == 0                          # the outage itself is no change
    assert w.observe(StoreRole("primary", server="b:2", timeline=2)) == 1    # promoted standby
    assert w.observe(StoreRole("primary", server="b:2", timeline=3)) == 2    # promoted again in place
    assert w.observe(StoreRole("standby", server="a:1")) == 2


def test_metrics_expose_the_role(store):
    text = generate_latest(StoreCollector(store, SystemClock(), ttl_s=0).registry()).decode()
    want = "embedded" if store.engine_name == "sqlite" else "primary"
    assert f'fireledger_store_role{{role="{want}"}} 1.0' in text
    assert 'fireledger_store_role{role="unreachable"} 0.0' in text
    assert "fireledger_store_failovers_total 0.0" in text
    assert "fireledger_store_synchronous 0.0" in text
    assert "fireledger_store_sync_required 0.0" in text


def test_unreachable_store_reads_as_unreachable(pg_server):
    from fireledger.store import Store

    s = Store.open(pg_server.new_database(), migrate=True)
    s.engine.url = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=1"   # type: ignore[attr-defined]
    s.engine.close()
    try:
        assert read_role(s).role == "unreachable"
    finally:
        s.close()
