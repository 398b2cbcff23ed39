"""With a replicator (Litestream, decision 0126) the SQLite engine never checkpoints the WAL itself:
Litestream must see every frame before a checkpoint moves it (its read lock holds checkpoints back;
a TRUNCATE would wait on it)."""

from __future__ import annotations

import os
import threading

from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger


def test_leaving_checkpoints_to_the_replicator(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/s.db")
    try:
        held = store.engine.connection()
        assert held.execute("PRAGMA wal_autocheckpoint").fetchone()[0] > 0
        store.engine.leave_checkpoints_to_replicator()
        assert held.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0     # open connections too
        store.engine.start_checkpointer(interval_s=0.05)
        assert store.engine._checkpointer is None                               # no thread of ours
        t = add_tenant(store)
        tg = add_target(store, t)
        for _ in range(300):   # well over SQLite's default autocheckpoint of 1000 pages of WAL
            add_trigger(store, t, tg, {"every": "60s"}, now_us=T0)
        other: list[int] = []
        th = threading.Thread(target=lambda: other.append(
            store.engine.connection().execute("PRAGMA wal_autocheckpoint").fetchone()[0]))
        th.start()
        th.join()
        assert other == [0]                                                     # new connections too
        wal = os.path.getsize(tmp_path / "s.db-wal")
        assert store.engine.scrub_after_shred() is False                       # no TRUNCATE either
        assert os.path.getsize(tmp_path / "s.db-wal") == wal > 1000 * 4096
    finally:
        store.close()
