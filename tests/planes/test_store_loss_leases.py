"""A timing node that loses the store for longer than its lease stops claiming (issue 16: "a lease's
expiry and ε rules must hold across the failover").

Real PostgreSQL; node ``a`` reaches it through a TCP forwarder that is cut (tests/tcpcut.py: its
connections vanish and new ones are refused, as when the primary is lost), node ``b`` directly. Fake
clocks drive both (the manual scheduler). What must hold: while cut, ``a``'s lease cycles fail and
its ownership runs out on its own monotonic clock before ``b`` may take its partitions; ``b`` then
decides every instant; when the store is back ``a`` claims nothing before its next renewal, and that
renewal tells it which partitions it lost — every instant has exactly one record.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest

from fireledger.clock import FakeClock
from fireledger.store import Store, is_database_error
from fireledger.timing import LeaseManager, LeaseSettings, TimingLoop
from storekit import T0, add_target, add_tenant, add_trigger, open_store
from tcpcut import CutProxy

pytestmark = pytest.mark.postgres

S = 1_000_000
MS = 1_000
SET = LeaseSettings(rotate_after_s=0)


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.fixture
def stores(pg_server, tmp_path):
    """(store of ``b``: direct; store of ``a``: through the forwarder; the forwarder)."""
    direct = open_store("postgres", tmp_path, pg_server)
    direct.timing.ensure_partitions()
    parts = urlsplit(direct.engine.url)
    proxy = CutProxy(parts.hostname or "127.0.0.1", int(parts.port or 5432))
    cut = Store.open(_via(direct.engine.url, proxy.port))
    yield direct, cut, proxy
    cut.close()
    proxy.close()
    direct.close()


def test_a_node_that_lost_the_store_longer_than_its_lease_stops_claiming(stores):
    store_b, store_a, proxy = stores
    clock = FakeClock(T0 + 59 * S, eps_us=5 * MS)
    t = add_tenant(store_b)
    tg = add_target(store_b, t)
    trig = [add_trigger(store_b, t, tg, {"every": "60s"}, partition=p)[0] for p in range(8)]   # due at T0 + 60 s
    a, b = LeaseManager(store_a, clock, "a", SET), LeaseManager(store_b, clock, "b", SET)
    for _ in range(3):
        a.cycle()
        b.cycle()
    held_by_a = a.ownership().partitions
    assert len(held_by_a) == 128 and a.ownership().valid(clock.monotonic())
    loop_a, loop_b = TimingLoop(store_a, clock, "a", leases=a), TimingLoop(store_b, clock, "b", leases=b)

    proxy.cut()   # a's store is gone
    for _ in range(2):
        with pytest.raises(Exception) as failed:
            a.cycle()
        assert is_database_error(failed.value)
    # a stops claiming by its own clock before b may take over: session TTL − 2ε − guard.
    clock.advance(int(2.4 * S))
    assert a.ownership().valid(clock.monotonic())
    clock.advance(int(0.1 * S))
    assert not a.ownership().valid(clock.monotonic())
    b.cycle()
    assert {x.owner for x in store_b.timing.lease_table()} == {"a", "b"}   # a's session has not lapsed for b yet
    clock.advance(int(0.6 * S))
    b.cycle()
    assert {x.owner for x in store_b.timing.lease_table()} == {"b"}        # taken: a's session lapsed

    clock.set(T0 + 60 * S + 10 * MS)
    assert len(loop_b.tick().inserted) == 8                         # b decides every instant

    proxy.restore()   # the store is back: a claims nothing before its next renewal …
    res = loop_a.tick()
    assert res.inserted == [] and res.claimed_rows == 0
    rep = a.cycle()   # … which tells it what it lost
    assert set(rep.lost) == set(held_by_a) and rep.held == 0
    assert loop_a.tick().inserted == []
    fires = [f for tr in trig for f in store_b.history.list_fires(t.id, tr.id)]
    assert len(fires) == 8 and {f.decided_by for f in fires} == {"b"}
    assert len({(f.trigger_id, f.scheduled_us) for f in fires}) == 8
