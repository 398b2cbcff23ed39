"""Store contract for history, evidence and retention queries — on real SQLite and real PostgreSQL."""

from __future__ import annotations

import pytest

from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
M = 60 * S


def nf(trig, at, state=FireState.PENDING, *, seq=0, lane=Lane.ON_TIME, cause=None, decided=None):
    return NewFire(trig.tenant_id, trig.id, at, seq, 1, FireKind.SCHEDULED, lane, state,
                   decided if decided is not None else at + 1000, "2026f", "node-a", cause=cause)


def decide(store, trig, fires, *, due_us, new_us):
    """Commit ``fires`` with the due row's advance, exactly as the timing plane does."""
    out = store.timing.apply_decisions([Decision(Advance(trig.id, due_us, 1, new_us, 1), tuple(fires))])
    assert out[0].advanced
    return new_us


def deliver(store, lane="on-time", *, now_us, status=200, state="delivered", took_us=2000, limit=100):
    jobs = store.dispatch.claim_dispatch(lane, now_us, limit, "runner-1", 30 * S)
    store.dispatch.settle_attempts([Settlement(j, state if state != "pending" else "retry", status, None, state,
                                      None if state in ("delivered", "pending") else f"{state}: test",
                                      None if state != "pending" else now_us + S) for j in jobs],
                          now_us + took_us)
    return jobs


@pytest.fixture
def ledger(store):
    """Two tenants; tenant A has two minutely triggers with 10 fires each (mixed states)."""
    a, b = add_tenant(store, "a"), add_tenant(store, "b")
    ta, tb = add_target(store, a), add_target(store, b)
    t1, _, first1 = add_trigger(store, a, ta, {"every": "60s"}, partition=3)
    t2, _, first2 = add_trigger(store, a, ta, {"every": "60s"}, partition=7)
    t3, _, first3 = add_trigger(store, b, tb, {"every": "60s"}, partition=3)
    # Distinct dispatch times make the claim order deterministic; tenant B's fires wait in the
    # catch-up lane so that only A's are delivered below.
    for n, (trig, first, lane) in enumerate(((t1, first1, Lane.ON_TIME), (t2, first2, Lane.ON_TIME),
                                             (t3, first3, Lane.CATCH_UP))):
        due = first
        for i in range(10):
            state = FireState.EXPIRED if i < 3 else FireState.PENDING
            cause = "expired: older than the catch-up horizon (1h)" if i < 3 else None
            fire = nf(trig, first + i * M, state, cause=cause, lane=lane, decided=first + i * M + 1000 * (n + 1))
            due = decide(store, trig, [fire], due_us=due, new_us=due + M)
    # Dispatch t1 fire 3 five seconds late; everything else of t1/t2 delivered 1 s late.
    deliver(store, now_us=first1 + 3 * M + 5 * S, limit=1)
    deliver(store, now_us=first1 + 20 * M)
    return {"a": a, "b": b, "t1": t1, "t2": t2, "t3": t3, "first": first1}


def test_trigger_history_range_state_and_paging_both_directions(store, ledger):
    a, t1, first = ledger["a"], ledger["t1"], ledger["first"]
    all_fires = store.history.history_fires(a.id, trigger_id=t1.id, limit=100)
    assert [f.scheduled_us for f in all_fires] == [first + i * M for i in range(10)]
    # Half-open range on the scheduled instant.
    got = store.history.history_fires(a.id, trigger_id=t1.id, from_us=first + 2 * M, to_us=first + 5 * M)
    assert [f.scheduled_us for f in got] == [first + 2 * M, first + 3 * M, first + 4 * M]
    # State filter, one or several states.
    assert {f.state for f in store.history.history_fires(a.id, trigger_id=t1.id, states=["expired"])} == {"expired"}
    assert len(store.history.history_fires(a.id, trigger_id=t1.id, states=["expired", "delivered"])) == 10
    # A filtered page still carries each fire's attempts (looked up by key, in one statement).
    filtered = store.history.history_fires(a.id, trigger_id=t1.id, states=["delivered"], from_us=first + 3 * M)
    assert len(filtered) == 7 and all(len(f.attempt_list) == 1 for f in filtered)
    assert filtered[0].attempt_list[0].finished_us - filtered[0].attempt_list[0].started_us == 2000
    from storekit import QueryCounter  # the statement count does not grow with the page

    counter = QueryCounter(store)
    costs = [counter.during(lambda lo=lo: store.history.history_fires(a.id, trigger_id=t1.id, states=["delivered"],
                                                                from_us=first + lo * M)) for lo in (8, 3)]
    assert costs[0] == costs[1], costs   # 2 and 7 attempted fires on the page
    with pytest.raises(ValueError, match="unknown fire state"):
        store.history.history_fires(a.id, trigger_id=t1.id, states=["exploded"])
    # Keyset pages, ascending and descending, cover everything exactly once.
    for desc in (False, True):
        seen, after = [], None
        while True:
            page = store.history.history_fires(a.id, trigger_id=t1.id, after=after, limit=3, descending=desc)
            if not page:
                break
            seen += [f.scheduled_us for f in page]
            after = (page[-1].scheduled_us, page[-1].seq)
        assert seen == sorted(seen, reverse=desc) and len(seen) == 10 == len(set(seen))
    # Attempts come with the page; the late one is recorded as such.
    late = next(f for f in all_fires if f.scheduled_us == first + 3 * M)
    assert late.state == "delivered" and late.dispatched_us - late.scheduled_us == 5 * S
    assert [(x.number, x.result, x.http_status) for x in late.attempt_list] == [(1, "delivered", 200)]
    assert late.attempt_list[0].finished_us - late.attempt_list[0].started_us == 2000


def test_tenant_history_spans_triggers_and_never_another_tenant(store, ledger):
    a, b, t1, t2, t3 = ledger["a"], ledger["b"], ledger["t1"], ledger["t2"], ledger["t3"]
    rows = store.history.history_fires(a.id, limit=1000)
    assert {f.trigger_id for f in rows} == {t1.id, t2.id} and len(rows) == 20
    keys = [(f.scheduled_us, f.trigger_id, f.seq) for f in rows]
    assert keys == sorted(keys)
    assert t3.id not in {f.trigger_id for f in rows}
    assert {f.trigger_id for f in store.history.history_fires(b.id)} == {t3.id}
    assert t3.id in {f.trigger_id for f in store.history.history_fires(b.id, states=["pending"])}
    # Another tenant's trigger id yields nothing, even when named explicitly.
    assert store.history.history_fires(a.id, trigger_id=t3.id) == []
    for desc in (False, True):
        seen, after = [], None
        while True:
            page = store.history.history_fires(a.id, after=after, limit=7, descending=desc)
            if not page:
                break
            seen += [(f.scheduled_us, f.trigger_id, f.seq) for f in page]
            last = page[-1]
            after = (last.scheduled_us, last.trigger_id, last.seq)
        assert seen == sorted(keys, reverse=desc)
    assert all(f.attempt_list for f in rows if f.state == "delivered")


def test_lateness_counts_and_recent_states(store, ledger):
    a, t1, first = ledger["a"], ledger["t1"], ledger["first"]
    lat = store.history.lateness_us(a.id, t1.id, first, first + 10 * M)
    assert len(lat) == 7 and 5 * S in lat
    assert len(store.history.lateness_us(a.id, t1.id, first, first + 10 * M, cap=2)) == 2
    assert store.history.state_counts(a.id, first, first + 10 * M, trigger_id=t1.id) == {"expired": 3, "delivered": 7}
    assert store.history.state_counts(a.id, first, first + 10 * M) == {"expired": 6, "delivered": 14}
    assert store.history.recent_states(a.id, t1.id, 4) == ["delivered"] * 4
    assert store.history.recent_states(a.id, t1.id, 2, before_us=first + 3 * M) == ["expired", "expired"]


def test_due_age_by_partition_sees_undecided_rows_and_unattempted_fires(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    t1, _, f1 = add_trigger(store, t, tg, {"every": "60s"}, partition=5)
    t2, _, f2 = add_trigger(store, t, tg, {"every": "60s"}, partition=9)
    # Nothing due yet.
    assert store.history.due_waiting_by_partition(f1 - 1) == {}
    # Timing stalled: the due rows themselves are waiting.
    assert store.history.due_waiting_by_partition(f1 + 30 * S) == {5: f1, 9: f2}
    # t1 decided (its row advances) but not dispatched: the fire waits from its dispatch time.
    decide(store, t1, [nf(t1, f1, decided=f1 + 2 * S)], due_us=f1, new_us=f1 + M)
    assert store.history.due_waiting_by_partition(f1 + 30 * S) == {5: f1 + 2 * S, 9: f2}
    # Attempted (even if it will be retried): no longer waiting on the platform.
    deliver(store, now_us=f1 + 3 * S, state="pending")
    assert store.history.due_waiting_by_partition(f1 + 30 * S) == {9: f2}
    # Backfill-lane fires drain slowly by design and never page.
    decide(store, t1, [nf(t1, f1 + M, lane=Lane.BACKFILL)], due_us=f1 + M, new_us=f1 + 10 * M)
    assert 5 not in store.history.due_waiting_by_partition(f1 + 2 * M)
    assert store.history.lane_depths() == {("on-time", "pending"): 1, ("backfill", "pending"): 1}


def test_operator_listing_and_read_only_cluster_tables(store, ledger):
    ids = {t.id for t in store.history.ops_triggers()}
    assert {ledger["t1"].id, ledger["t2"].id, ledger["t3"].id} <= ids
    assert {t.id for t in store.history.ops_triggers(ledger["b"].id)} == {ledger["t3"].id}
    assert store.history.trigger_by_id(ledger["t3"].id).tenant_id == ledger["b"].id
    assert store.history.trigger_by_id("tr_missing") is None
    c = store.engine
    with c.write() as conn:
        conn.execute("INSERT INTO leases (partition, owner, epoch, expires_us, eps_us) VALUES (3, 'timing-1', 2, "
                     f"{T0 + 10 * S}, 4000)")
        conn.execute("INSERT INTO nodes (id, role, started_us, heartbeat_us, eps_us, eps_source) VALUES "
                     f"('timing-1', 'timing', {T0}, {T0 + S}, 4000, 'declared')")
    (lease,) = store.history.lease_rows()
    assert (lease.partition, lease.owner, lease.epoch, lease.eps_us) == (3, "timing-1", 2, 4000)
    (node,) = store.history.node_rows()
    assert (node.id, node.role, node.eps_source) == ("timing-1", "timing", "declared")


def test_retention_batches_only_terminal_fires_before_the_cutoff(store, ledger):
    a, first = ledger["a"], ledger["first"]
    cutoff = first + 5 * M
    terminal, live = store.history.count_expiring(a.id, cutoff)
    assert (terminal, live) == (10, 0)
    # Make one old fire live again to prove live fires are never purged.
    old_pending = ledger["t3"]
    t3_terminal, t3_live = store.history.count_expiring(ledger["b"].id, cutoff)
    assert t3_live == 2   # t3 fires 3 and 4 were never dispatched
    batch = store.history.expiring_batch(a.id, cutoff, limit=4)
    assert len(batch) == 4 and all(x.fire.scheduled_us < cutoff for x in batch)
    nxt = store.history.expiring_batch(a.id, cutoff, after=(batch[-1].fire.scheduled_us, batch[-1].fire.trigger_id,
                                                    batch[-1].fire.seq), limit=100)
    assert len(nxt) == 6
    delivered = [x for x in batch + nxt if x.fire.state == "delivered"]
    assert delivered and all(x.fire.attempt_list for x in delivered)
    keys = [FireKey(x.fire.tenant_id, x.fire.trigger_id, x.fire.scheduled_us, x.fire.seq) for x in batch + nxt]
    assert store.history.purge_fires(keys) == 10
    assert store.history.count_expiring(a.id, cutoff) == (0, 0)
    assert len(store.history.history_fires(a.id, limit=100)) == 10
    # Attempts went with their fires.
    with store.engine.read() as c:
        n = c.execute(f"SELECT COUNT(*) FROM attempts WHERE tenant_id = '{a.id}' AND scheduled_us < {cutoff}"
                      ).fetchone()[0]
    assert n == 0
    # Live fires before the cutoff are never returned nor deleted.
    live_keys = [FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)
                 for f in store.history.history_fires(old_pending.tenant_id, states=["pending"], to_us=cutoff)]
    assert live_keys and store.history.purge_fires(live_keys) == 0
    assert all(x.fire.state != "pending" for x in store.history.expiring_batch(ledger["b"].id, cutoff))
    assert store.history.tenant_ids() == sorted([a.id, ledger["b"].id])
