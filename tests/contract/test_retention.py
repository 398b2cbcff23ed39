"""The retention job archives terminal fires past the window, then purges exactly those."""

from __future__ import annotations

import gzip
import json

from fireledger.clock import FakeClock
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.retention import DAY_US, run_once
from storekit import T0, add_target, add_tenant, add_trigger


def test_old_terminal_fires_are_archived_then_purged_and_live_ones_stay(store, tmp_path):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    now = T0 + 200 * DAY_US

    def fire(us, state):
        return NewFire(t.id, trig.id, us, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, state, us, "2026f", "n",
                       cause=None if state == FireState.PENDING else "expired: test")

    old = [T0 + i * 60_000_000 for i in range(5)]                 # ~200 days old
    recent = [now - DAY_US + i * 60_000_000 for i in range(3)]    # a day old
    live_old = T0 + 10 * 60_000_000
    fires = [fire(u, FireState.EXPIRED) for u in old + recent] + [fire(live_old, FireState.PENDING)]
    store.timing.apply_decisions([Decision(Advance(trig.id, first, 1, first, 1), tuple(fires))])

    done, live = run_once(store, FakeClock(now), 90, tmp_path / "archive")
    assert (done, live) == (5, 1)
    left = {f.scheduled_us for f in store.history.list_fires(t.id, trig.id, None, 100)}
    assert left == set(recent) | {live_old}
    [archive] = list((tmp_path / "archive").iterdir())
    with gzip.open(archive, "rt") as fh:
        items = [json.loads(line) for line in fh]
    assert len(items) == 5 and {i["state"] for i in items} == {"expired"}
    assert all("payload" not in i for i in items)
    # A second pass finds nothing more and writes no empty archive.
    assert run_once(store, FakeClock(now), 90, tmp_path / "archive") == (0, 1)
    assert len(list((tmp_path / "archive").iterdir())) == 1
