"""The DST label of a fire (migration 0016, decision 0160) is stored and read back on both engines.

Every write path of a decided fire keeps ``NewFire.dst``: the batched commit (one statement per kind
of write), the row-by-row path it falls back to when a batch meets a fire decided elsewhere, and
``insert_fires`` (fires that advance no due row); every read of a fire's evidence returns it (one
fire, a trigger's fires, the tenant's history). A fire without a label reads back None.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000
GAP = "gap 2027-03-28T01:30"
FOLD = "fold 2027-10-31T01:30"


def _fire(trig: Any, at: int, dst: str | None, seq: int = 0) -> NewFire:
    return NewFire(trig.tenant_id, trig.id, at, seq, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                   at + 5, "2026f", "n1", eps_us=1000, eps_source="declared", dst=dst)


def _key(f: NewFire) -> FireKey:
    return FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)


def test_the_batched_commit_stores_each_label(store: Any) -> None:
    t = add_tenant(store)
    tg = add_target(store, t)
    made = [add_trigger(store, t, tg, {"every": "60s"}) for _ in range(3)]
    labels = [GAP, None, FOLD]
    decisions = [Decision(Advance(trig.id, first, 1, first + 60 * S, 1), (_fire(trig, first, lab),))
                 for (trig, _, first), lab in zip(made, labels, strict=True)]
    out = store.timing.apply_decisions(decisions)
    assert all(o.advanced for o in out)
    for d, lab in zip(decisions, labels, strict=True):
        got = store.history.get_fire(_key(d.fires[0]))
        assert got is not None and got.dst == lab
    listed = store.history.history_fires(t.id)
    assert sorted((f.dst or "") for f in listed) == sorted((lab or "") for lab in labels)


def test_the_row_by_row_path_and_manual_inserts_store_the_label(store: Any) -> None:
    t = add_tenant(store)
    tg = add_target(store, t)
    (a, _, fa), (b, _, fb) = (add_trigger(store, t, tg, {"every": "60s"}) for _ in range(2))
    # One fire of the batch exists already (decided elsewhere): the batch falls back to the row path.
    store.timing.insert_fires([_fire(a, fa, None)])
    batch = [Decision(Advance(a.id, fa, 1, fa + 60 * S, 1), (_fire(a, fa, GAP),)),
             Decision(Advance(b.id, fb, 1, fb + 60 * S, 1), (_fire(b, fb, FOLD),))]
    store.timing.apply_decisions(batch)
    first = store.history.get_fire(_key(batch[0].fires[0]))
    assert first is not None and first.dst is None          # the existing record is kept as it was
    second = store.history.get_fire(_key(batch[1].fires[0]))
    assert second is not None and second.dst == FOLD
    manual = replace(_fire(b, fb + 7 * S, GAP), kind=FireKind.MANUAL, seq=1)
    assert store.timing.insert_fires([manual]) == [manual]
    got = store.history.get_fire(_key(manual))
    assert got is not None and got.dst == GAP
