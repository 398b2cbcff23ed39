"""Store contract of the dispatch plane (both engines): fair, shaped claims; settlement with queue
puts; queues with a visibility timeout; work outcomes with a replay guard; tenant quotas."""

from __future__ import annotations

import threading

import pytest

from fireledger.dispatch.lanes import DispatchConfig
from fireledger.dispatch.runner import _Shaper
from fireledger.dispatch.shaping import Capacity
from fireledger.domain.dispatch_records import ClaimSnapshot, Settlement, ShapedDecision
from fireledger.domain.keys import FireKey, new_id
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, Target
from fireledger.security.envelope import cipher_for, open_secret, sealed_target
from fireledger.store import OutcomeRejected
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
MARGIN = 5 * S
WIDE = Capacity(1000, {"on-time": 1000, "catch-up": 1000, "backfill": 1000}, 1000)


class Recorder:
    """A shaper that admits nothing and records what it was offered."""

    def __init__(self) -> None:
        self.snapshot: ClaimSnapshot | None = None

    def bucket_keys(self, candidates):
        return []

    def decide(self, snapshot):
        self.snapshot = snapshot
        return ShapedDecision([], {})


def put_fires(store, trig, instants, lane=Lane.ON_TIME, kind=FireKind.SCHEDULED):
    """Commit fires directly (as the timing plane, or a backfill, would) without moving the due row."""
    fires = tuple(NewFire(trig.tenant_id, trig.id, us, 0, 1, kind, lane, FireState.PENDING, us, "2026f", "t")
                  for us in instants)
    # A CAS against a row that does not match leaves the fires out; use an Advance that matches.
    row = store.registry.get_trigger(trig.tenant_id, trig.id)
    [o] = store.timing.apply_decisions([Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires)])
    assert len(o.inserted) == len(instants)


def shaper(cfg=None, capacity=WIDE):
    return _Shaper(cfg or DispatchConfig(), capacity)


def test_candidates_are_oldest_first_per_trigger_and_round_robin_across_triggers_and_tenants(store):
    a = add_tenant(store, "a")
    b = add_tenant(store, "b")
    a1, _, _ = add_trigger(store, a, add_target(store, a), {"every": "60s"})
    a2, _, _ = add_trigger(store, a, add_target(store, a), {"every": "60s"})
    b1, _, _ = add_trigger(store, b, add_target(store, b), {"every": "60s"})
    put_fires(store, a1, [T0 + i * S for i in range(4)])
    put_fires(store, a2, [T0 + 10 * S + i * S for i in range(4)])
    put_fires(store, b1, [T0 + 20 * S + i * S for i in range(4)])
    rec = Recorder()
    store.dispatch.claim_shaped(T0 + 100 * S, "d", {"on-time": 100}, rec, MARGIN)
    order = [(f.trigger_id, f.scheduled_us - T0) for f in rec.snapshot.candidates["on-time"]]
    assert order[:6] == [(a1.id, 0), (b1.id, 20 * S), (a2.id, 10 * S), (b1.id, 21 * S), (a1.id, S), (b1.id, 22 * S)]
    for trig in (a1, a2, b1):   # oldest first within each trigger
        mine = [us for t, us in order if t == trig.id]
        assert mine == sorted(mine) and len(mine) == 4
    # The window is the fair prefix: with 3 slots offered, every trigger is represented.
    store.dispatch.claim_shaped(T0 + 100 * S, "d", {"on-time": 3}, rec, MARGIN)
    assert {f.trigger_id for f in rec.snapshot.candidates["on-time"]} == {a1.id, a2.id, b1.id}
    assert rec.snapshot.quotas[a.id] == (100.0, 100, 0.1)


def test_claim_leases_records_attempts_and_charges_buckets(store):
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    put_fires(store, trig, [T0 + i for i in range(3)])
    now = T0 + 10 * S
    res = store.dispatch.claim_shaped(now, "d1", {"on-time": 50}, shaper(), MARGIN)
    assert [c.admission for c in res.jobs] == ["on-time"] * 3
    job = res.jobs[0].job
    assert job.attempt == 1 and job.lease_owner == "d1" and job.lease_expires_us == now + 30 * S + MARGIN
    f = store.history.get_fire(FireKey(t.id, trig.id, T0, 0))
    assert f.state == "dispatching" and f.attempts == 1 and f.dispatched_us == now
    assert [a.number for a in f.attempt_list] == [1]
    # Leased: not offered again, and counted in flight for the tenant.
    rec = Recorder()
    assert store.dispatch.claim_shaped(now + S, "d2", {"on-time": 50}, rec, MARGIN).jobs == []
    assert rec.snapshot is None
    # The tenant's quota bucket was charged (3 attempts of a 100/s quota).
    with store.engine.read() as c:
        tat = c.execute("SELECT tat_us FROM rate_buckets WHERE key = " + ("?" if store.engine_name == "sqlite"
                        else "%s"), (f"quota:{t.id}",)).fetchone()[0]
    assert tat == now + 3 * 10_000
    # An expired lease is offered again as a further attempt under the same key.
    later = now + 40 * S
    res2 = store.dispatch.claim_shaped(later, "d2", {"on-time": 50}, shaper(), MARGIN)
    assert sorted(c.job.attempt for c in res2.jobs) == [2, 2, 2]


def test_in_flight_counts_every_process_and_limits_the_tenant(store):
    t = add_tenant(store)
    assert store.dispatch.set_tenant_quota(t.id, inflight=2) == (100.0, 100, 0.1)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    put_fires(store, trig, [T0 + i for i in range(5)])
    now = T0 + S
    a = store.dispatch.claim_shaped(now, "d1", {"on-time": 50}, shaper(), MARGIN)
    assert len(a.jobs) == 2
    rec = Recorder()
    store.dispatch.claim_shaped(now, "d2", {"on-time": 50}, rec, MARGIN)
    assert rec.snapshot.inflight == {t.id: 2} and rec.snapshot.quotas[t.id] == (100.0, 2, 0.1)
    assert store.dispatch.claim_shaped(now, "d2", {"on-time": 50}, shaper(), MARGIN).jobs == []
    store.dispatch.settle_dispatch([Settlement(a.jobs[0].job, "delivered", 200, None, "delivered", None, None)], now)
    assert len(store.dispatch.claim_shaped(now, "d2", {"on-time": 50}, shaper(), MARGIN).jobs) == 1


def test_backfill_and_catch_up_lanes_are_claimed_separately_and_paced(store):
    t = add_tenant(store)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    put_fires(store, trig, [T0 + i * S for i in range(5)], Lane.BACKFILL, FireKind.BACKFILL)
    put_fires(store, trig, [T0 + 100 * S + i * S for i in range(5)], Lane.CATCH_UP, FireKind.CATCH_UP)
    now = T0 + 200 * S
    assert store.dispatch.claim_shaped(now, "d", {"on-time": 50}, shaper(), MARGIN).jobs == []
    res = store.dispatch.claim_shaped(now, "d", {"backfill": 50, "catch-up": 50}, shaper(), MARGIN)
    # 10 % of 100/s, no burst: one attempt per lane now, the oldest of each, and a wake time.
    got = sorted((c.admission, c.job.fire.scheduled_us - T0) for c in res.jobs)
    assert got == [("backfill", 0), ("catch-up", 100 * S)]
    assert res.wake_us == now + 100_000 and res.waiting == {"backfill": 4, "catch-up": 4}
    res = store.dispatch.claim_shaped(now + 100_000, "d", {"backfill": 50, "catch-up": 50}, shaper(), MARGIN)
    assert len(res.jobs) == 2


def test_concurrent_claims_never_double_claim(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    for _ in range(4):
        trig, _, _ = add_trigger(store, t, tg, {"every": "60s"})
        put_fires(store, trig, [T0 + i for i in range(25)])
    assert store.dispatch.set_tenant_quota(t.id, fires_per_s=1e6, inflight=10_000)
    now = T0 + S
    got: dict[str, list] = {}
    barrier = threading.Barrier(4)

    def claim(name):
        barrier.wait()
        jobs = []
        for _ in range(10):
            jobs += store.dispatch.claim_shaped(now, name, {"on-time": 7}, shaper(), MARGIN).jobs
        got[name] = [(c.job.fire.trigger_id, c.job.fire.scheduled_us) for c in jobs]

    threads = [threading.Thread(target=claim, args=(f"d{i}",)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    every = [k for v in got.values() for k in v]
    assert len(every) == 100 and len(set(every)) == 100


def queue_target(store, tenant):
    tg = Target(new_id("tg"), tenant.id, "queue", None, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "verified", "",
                T0)
    store.registry.create_target(sealed_target(store, tg))
    return tg


def deliver_to_queue(store, t, n):
    tg = queue_target(store, t)
    trig, _, _ = add_trigger(store, t, tg, {"every": "60s"}, payload={"job": "x"})
    put_fires(store, trig, [T0 + i * S for i in range(n)])
    res = store.dispatch.claim_shaped(T0 + 100 * S, "d", {"on-time": 50}, shaper(), MARGIN)
    oks = store.dispatch.settle_dispatch([Settlement(c.job, "delivered", None, None, "delivered", None, None)
                                 for c in res.jobs], T0 + 100 * S)
    assert oks == [True] * n
    return tg, trig


def test_queue_delivery_pull_visibility_and_ack(store):
    t = add_tenant(store)
    tg, trig = deliver_to_queue(store, t, 3)
    now = T0 + 200 * S
    assert store.dispatch.queue_stats(t.id, tg.id, now) == (3, 3, T0)
    got = store.dispatch.queue_pull(t.id, tg.id, now, 2, 30 * S)
    assert [m.fire.scheduled_us for m in got] == [T0, T0 + S]
    m0 = got[0].fire   # the message carries the payload as stored (sealed); it opens to the job's payload
    assert cipher_for(store).open(m0.tenant_id, m0.trigger_id, m0.version, got[0].payload) == b'{"job": "x"}'
    assert got[0].receives == 1 and got[0].visible_until_us == now + 30 * S
    assert [m.fire.scheduled_us for m in store.dispatch.queue_pull(t.id, tg.id, now, 10, 30 * S)] == [T0 + 2 * S]
    assert store.dispatch.queue_pull(t.id, tg.id, now + S, 10, 30 * S) == []          # all hidden
    assert store.dispatch.queue_ack(t.id, tg.id, [got[0].key]) == [True]
    assert store.dispatch.queue_ack(t.id, tg.id, [got[0].key]) == [False]              # already acked
    # Not acked within the visibility timeout: handed out again (at-least-once).
    again = store.dispatch.queue_pull(t.id, tg.id, now + 31 * S, 10, 30 * S)
    assert [(m.fire.scheduled_us, m.receives) for m in again] == [(T0 + S, 2), (T0 + 2 * S, 2)]
    assert store.dispatch.queue_stats(t.id, tg.id, now + 31 * S) == (2, 0, T0 + S)
    # Another tenant cannot pull or ack this queue.
    other = add_tenant(store, "other")
    assert store.dispatch.queue_pull(other.id, tg.id, now + 100 * S, 10, S) == []
    assert store.dispatch.queue_ack(other.id, tg.id, [again[0].key]) == [False]
    # A settlement that lost its lease puts nothing on the queue.
    f = store.history.get_fire(again[0].key)
    assert f.state == "delivered"


def test_queue_pulls_by_concurrent_consumers_do_not_overlap(store):
    t = add_tenant(store)
    tg, _ = deliver_to_queue(store, t, 30)
    now = T0 + 200 * S
    got: list = []
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def consume():
        barrier.wait()
        for _ in range(5):
            ms = store.dispatch.queue_pull(t.id, tg.id, now, 4, 60 * S)
            with lock:
                got.extend(m.key for m in ms)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(got) == 30 and len(set(got)) == 30


def test_outcomes_are_recorded_once_with_a_replay_guard(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, _ = add_trigger(store, t, tg, {"every": "60s"})
    put_fires(store, trig, [T0])
    key = FireKey(t.id, trig.id, T0, 0)
    fire, target = store.dispatch.outcome_context(key)
    assert target.id == tg.id and open_secret(store, target) == tg.secret and fire.scheduled_us == T0
    assert store.dispatch.get_outcome(key) is None                        # unknown
    win = 300 * S
    assert store.dispatch.record_outcome(key, "succeeded", T0 + S, target_id=tg.id, msg_id="m1", replay_window_us=win)
    assert store.dispatch.get_outcome(key) == ("succeeded", T0 + S)
    with pytest.raises(OutcomeRejected) as exc:
        store.dispatch.record_outcome(key, "succeeded", T0 + 2 * S, target_id=tg.id, msg_id="m1", replay_window_us=win)
    assert exc.value.reason == "replayed"
    assert store.dispatch.record_outcome(key, "succeeded", T0 + 3 * S, target_id=tg.id, msg_id="m2",
                                replay_window_us=win) is False
    with pytest.raises(OutcomeRejected) as exc:
        store.dispatch.record_outcome(key, "failed", T0 + 4 * S, target_id=tg.id, msg_id="m3", replay_window_us=win)
    assert exc.value.reason == "conflict" and exc.value.recorded == "succeeded"
    # The refused conflict left no receipt: the same id may be used once the report is fixed.
    assert store.dispatch.record_outcome(key, "succeeded", T0 + 5 * S, target_id=tg.id, msg_id="m3",
                                replay_window_us=win) is False
    assert store.dispatch.get_outcome(key) == ("succeeded", T0 + S)
    # Receipts older than twice the window are purged.
    store.dispatch.record_outcome(FireKey(t.id, trig.id, T0, 0), "succeeded", T0 + 10 * win, target_id=tg.id,
                         msg_id="m9", replay_window_us=win)
    with store.engine.read() as c:
        assert c.execute("SELECT COUNT(*) FROM callback_receipts").fetchone()[0] == 1
    other = add_tenant(store, "other")
    assert store.dispatch.outcome_context(FireKey(other.id, trig.id, T0, 0)) is None
    with pytest.raises(ValueError):
        store.dispatch.record_outcome(key, "maybe", T0, target_id=tg.id, msg_id="x", replay_window_us=win)


def test_tenant_quota_read_and_change(store):
    t = add_tenant(store)
    assert store.dispatch.tenant_quota(t.id) == (100.0, 100, 0.1)
    assert store.dispatch.set_tenant_quota(t.id, fires_per_s=50, catchup_fraction=0.2) == (100.0, 100, 0.1)
    assert store.dispatch.tenant_quota(t.id) == (50.0, 100, 0.2)
    for bad in ({"fires_per_s": 0}, {"inflight": 0}, {"catchup_fraction": 0}, {"catchup_fraction": 1.5}):
        with pytest.raises(ValueError):
            store.dispatch.set_tenant_quota(t.id, **bad)
    assert store.dispatch.tenant_quota(t.id) == (50.0, 100, 0.2)
    assert store.dispatch.set_tenant_quota("tn_nope", inflight=3) is None


def test_paced_tenants_do_not_crowd_the_window_of_a_recovery_lane(store):
    """A tenant whose catch-up pace has not conformed yet is offered after one that may go now, so a
    small window never holds only fires the shaper must refuse."""
    a = add_tenant(store, "a")
    b = add_tenant(store, "b")
    ta, _, _ = add_trigger(store, a, add_target(store, a), {"every": "60s"})
    tb, _, _ = add_trigger(store, b, add_target(store, b), {"every": "60s"})
    put_fires(store, ta, [T0 + i * S for i in range(5)], Lane.CATCH_UP, FireKind.CATCH_UP)
    put_fires(store, tb, [T0 + 50 * S + i * S for i in range(5)], Lane.CATCH_UP, FireKind.CATCH_UP)
    now = T0 + 100 * S
    [first] = store.dispatch.claim_shaped(now, "d", {"catch-up": 1}, shaper(), MARGIN).jobs
    assert first.job.fire.tenant_id == a.id                   # a's fire is the oldest at equal rank
    rec = Recorder()
    store.dispatch.claim_shaped(now, "d", {"catch-up": 1}, rec, MARGIN)
    assert [f.tenant_id for f in rec.snapshot.candidates["catch-up"]] == [b.id]   # a is paced: b first
    store.dispatch.claim_shaped(now + S, "d", {"catch-up": 1}, rec, MARGIN)
    assert [f.tenant_id for f in rec.snapshot.candidates["catch-up"]] == [a.id]   # both may go: fair order


def test_tenants_at_their_in_flight_quota_do_not_crowd_the_window(store):
    """A tenant whose attempts fill its in-flight quota (a silent target) is offered after tenants
    that can start something, however old its backlog: a small window still reaches the others."""
    stuck = add_tenant(store, "stuck")
    ok = add_tenant(store, "ok")
    store.dispatch.set_tenant_quota(stuck.id, inflight=1)
    ts, _, _ = add_trigger(store, stuck, add_target(store, stuck), {"every": "60s"})
    to, _, _ = add_trigger(store, ok, add_target(store, ok), {"every": "60s"})
    put_fires(store, ts, [T0 + i * S for i in range(5)])
    put_fires(store, to, [T0 + 50 * S])
    now = T0 + 100 * S
    [first] = store.dispatch.claim_shaped(now, "d", {"on-time": 1}, shaper(), MARGIN).jobs
    assert first.job.fire.tenant_id == stuck.id              # the oldest goes first …
    rec = Recorder()
    store.dispatch.claim_shaped(now, "d", {"on-time": 1}, rec, MARGIN)
    assert [f.tenant_id for f in rec.snapshot.candidates["on-time"]] == [ok.id]   # … then it is held


def test_successive_small_claims_lease_the_backlog_once_each_and_fairly(store):
    """Rounds that each offer a small window (the bounded read, decision 0130) lease every fire of
    a backlog exactly once, oldest first within each trigger, and every round serves both tenants
    (the fair order is computed afresh at each claim: no order is kept between claims)."""
    a = add_tenant(store, "a")
    b = add_tenant(store, "b")
    trigs: list = []
    for t in (a, a, b):
        trig = add_trigger(store, t, add_target(store, t), {"every": "60s"})[0]
        put_fires(store, trig, [T0 + k * S for k in range(20)])
        trigs.append(trig)
    now = T0 + 100 * S
    leased = []
    for i in range(12):
        res = store.dispatch.claim_shaped(now, "d", {"on-time": 5}, shaper(), MARGIN)
        got = [(j.job.fire.tenant_id, j.job.fire.trigger_id, j.job.fire.scheduled_us) for j in res.jobs]
        assert len(got) == 5
        if i < 7:   # round-robin across tenants while both have fires left (b, half the fires, drains first)
            assert {t for t, _, _ in got} == {a.id, b.id}
        leased += got
    assert len(leased) == len(set(leased)) == 60
    for trig in trigs:
        mine = [us for _, tr, us in leased if tr == trig.id]
        assert mine == [T0 + k * S for k in range(20)]
    assert store.dispatch.claim_shaped(now, "d", {"on-time": 5}, shaper(), MARGIN).jobs == []


def test_a_fire_committed_between_claims_is_offered_at_the_next_claim(store):
    """No order is kept between claims: the oldest fire, committed after a claim, is offered first
    by the next one."""
    a = add_tenant(store, "a")
    trig = add_trigger(store, a, add_target(store, a), {"every": "60s"})[0]
    put_fires(store, trig, [T0 + k * S for k in range(50)])
    now = T0 + 100 * S
    assert len(store.dispatch.claim_shaped(now, "d", {"on-time": 5}, shaper(), MARGIN).jobs) == 5
    late = add_trigger(store, a, add_target(store, a), {"every": "60s"})[0]
    put_fires(store, late, [T0])   # the oldest instant of all, committed after that claim
    got = store.dispatch.claim_shaped(now + 1, "d", {"on-time": 1}, shaper(), MARGIN)
    assert [(j.job.fire.trigger_id, j.job.fire.scheduled_us) for j in got.jobs] == [(late.id, T0)]


def test_with_more_tenants_than_a_claim_takes_every_tenant_is_reached_in_rotation(store, monkeypatch):
    """A claim takes at most ``claim_sql.TENANTS`` tenants with due work; the next claims start
    where it stopped, so every tenant is offered within a few claims, none twice before all once."""
    from fireledger.store import claim_sql

    monkeypatch.setattr(claim_sql, "TENANTS", 3)
    tenants = [add_tenant(store, f"t{i}") for i in range(7)]
    for t in tenants:
        put_fires(store, add_trigger(store, t, add_target(store, t), {"every": "60s"})[0], [T0, T0 + S])
    now = T0 + 100 * S
    rec = Recorder()
    seen = []
    for _ in range(3):
        store.dispatch.claim_shaped(now, "d", {"on-time": 100}, rec, MARGIN)
        offered = {f.tenant_id for f in rec.snapshot.candidates["on-time"]}
        assert len(offered) <= 3 and len(rec.snapshot.candidates["on-time"]) == 2 * len(offered)
        seen.append(offered)
    assert set().union(*seen) == {t.id for t in tenants} and not seen[0] & seen[1]
    # The third claim takes the one tenant not yet offered, then wraps round to the first ones.
    assert len(seen[2]) == 3 and len(seen[2] - seen[0] - seen[1]) == 1


def test_settling_a_batch_with_one_lost_lease_settles_the_others_and_refuses_that_one(store):
    """settle_dispatch settles a batch in bulk; one stale lease in it must come back False (and its
    fire stay with the new owner) while the rest settle — the bulk path may not hide the loss."""
    t = add_tenant(store)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"})
    put_fires(store, trig, [T0 + k * S for k in range(3)])
    now = T0 + 100 * S
    jobs = [j.job for j in store.dispatch.claim_shaped(now, "d1", {"on-time": 10}, shaper(), MARGIN).jobs]
    assert len(jobs) == 3
    # The leases lapse and another runner takes one fire (the oldest) as a further attempt.
    later = max(j.lease_expires_us for j in jobs) + 1
    again = [j.job for j in store.dispatch.claim_shaped(later, "d2", {"on-time": 1}, shaper(), MARGIN).jobs]
    assert [j.fire.scheduled_us for j in again] == [T0]
    items = [Settlement(j, "delivered", 200, None, "delivered", None, None) for j in jobs]
    assert store.dispatch.settle_dispatch(items, later + 1) == [False, True, True]
    states = {f.scheduled_us: f.state for f in store.history.list_fires(t.id, trig.id)}
    assert states == {T0: "dispatching", T0 + S: "delivered", T0 + 2 * S: "delivered"}
    for j in jobs:   # every attempt row of the batch is finished, the stale one too
        f = store.history.get_fire(FireKey(t.id, trig.id, j.fire.scheduled_us, 0))
        assert f.attempt_list[j.attempt - 1].finished_us == later + 1
