"""SQLite WAL checkpoints run in a background thread, off the commit path, once started."""

from __future__ import annotations

import os
import time

from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger


def test_checkpointer_moves_wal_pages_into_the_database_and_stops_on_close(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    conn = store.engine.connection()
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] > 0   # default: commits checkpoint
    store.engine.start_checkpointer(interval_s=0.05)
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # now: commits never do
    t = add_tenant(store)
    tg = add_target(store, t)
    size_before = os.path.getsize(tmp_path / "s.db")
    for _ in range(300):
        add_trigger(store, t, tg, {"every": "60s"}, now_us=T0)
    deadline = time.monotonic() + 10
    while os.path.getsize(tmp_path / "s.db") <= size_before:   # pages reach the main file
        assert time.monotonic() < deadline, "no checkpoint ran"
        time.sleep(0.02)   # poll interval, bounded by the deadline above
    thread = store.engine._checkpointer
    assert thread is not None and thread.is_alive()
    store.close()
    assert not thread.is_alive()
    reopened = Store.open(f"sqlite:///{tmp_path}/s.db")
    assert len(reopened.registry.list_triggers(t.id, limit=1000)) == 300   # every commit is there
    reopened.close()
