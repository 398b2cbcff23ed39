"""Decision 0221: a timing commit that inserts fires sends ONE ``NOTIFY fireledger_fires`` inside its
transaction (payload: the count), so it is delivered at commit only — never for a rolled-back
transaction. SQLite has no notifications: the same commits ring its fires bell (``<db>-fires.bell``,
decision 0256) after the ``COMMIT``, and a rolled-back one never does."""

from __future__ import annotations

import pytest

from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.store.listen import FIRES_CHANNEL
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000


def _fires(trig, first: int, n: int) -> tuple[NewFire, ...]:
    return tuple(NewFire(trig.tenant_id, trig.id, first + i * S, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                         FireState.PENDING, first + i * S, "2026f", "t") for i in range(n))


def test_a_fire_commit_notifies_once_with_its_count_and_a_rollback_never(store, caps):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "1s"})
    decision = Decision(Advance(trig.id, first, 1, first + 3 * S, 1), _fires(trig, first, 3))
    if not caps.notifies:
        _sqlite_bell(store, t, trig, first, decision)
        return
    import psycopg

    with psycopg.connect(store.engine.url, autocommit=True) as conn:
        conn.execute(f"LISTEN {FIRES_CHANNEL}")
        # A transaction that queued the notification and then failed: rolled back, so never delivered.
        with pytest.raises(RuntimeError), store.engine.write() as c:
            c.execute(store.q["tm_notify_fires"], {"n": "99"})
            raise RuntimeError("rolled back")
        [o] = store.timing.apply_decisions([decision])
        assert o.advanced and len(o.inserted) == 3
        # Notifications arrive in commit order: had the rolled-back one been sent, it would come first.
        got = [(n.channel, n.payload) for n in conn.notifies(timeout=10, stop_after=1)]
        assert got == [(FIRES_CHANNEL, "3")]
        # A decision that inserts nothing (its fires decided elsewhere) announces nothing; the next
        # commit with a fire is the next notification.
        again = Decision(Advance(trig.id, first + 3 * S, 1, first + 3 * S, 1), _fires(trig, first, 1))
        [o2] = store.timing.apply_decisions([again])
        assert o2.inserted == ()
        manual = NewFire(t.id, trig.id, first + 10 * S, 0, 1, FireKind.MANUAL, Lane.ON_TIME, FireState.PENDING,
                         first, "2026f", "t")
        assert store.timing.insert_fires([manual]) == [manual]
        got = [n.payload for n in conn.notifies(timeout=10, stop_after=1)]
        assert got == ["1"]


def _sqlite_bell(store, t, trig, first: int, decision: Decision) -> None:
    """SQLite (decision 0256): the bell's bytes change after each commit that inserted fires, never
    for a rolled-back transaction or one that inserted none."""
    bell = store.engine.fires_bell
    assert bell is not None and bell.path == f"{store.engine.path}-fires.bell"

    def rung() -> bytes | None:
        return bell._read()

    before = rung()
    with pytest.raises(RuntimeError), store.engine.write():
        store.engine.ring_fires_after_commit()
        raise RuntimeError("rolled back")
    assert rung() == before
    with store.engine.write():   # a later commit of the same thread does not inherit the flag
        pass
    assert rung() == before
    [o] = store.timing.apply_decisions([decision])
    assert o.advanced and len(o.inserted) == 3
    after = rung()
    assert after is not None and after != before
    again = Decision(Advance(trig.id, first + 3 * S, 1, first + 3 * S, 1), _fires(trig, first, 1))
    [o2] = store.timing.apply_decisions([again])
    assert o2.inserted == () and rung() == after   # nothing inserted: nothing announced
    manual = NewFire(t.id, trig.id, first + 10 * S, 0, 1, FireKind.MANUAL, Lane.ON_TIME, FireState.PENDING,
                     first, "2026f", "t")
    assert store.timing.insert_fires([manual]) == [manual]
    assert rung() not in (after, None)
