"""Store contract for lane due ages, declared drains and delivery counts (decisions 0165–0167) — on
real SQLite and real PostgreSQL."""

from __future__ import annotations

import json

import pytest

from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.model import Advance, AttemptResult, Decision, FireKind, FireState, Lane, NewFire
from fireledger.observe.lanes import DuplicateRate
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000
M = 60 * S
LANES = ("on-time", "catch-up", "backfill")


def nf(trig, at, *, lane=Lane.ON_TIME, decided=None, seq=0):
    return NewFire(trig.tenant_id, trig.id, at, seq, 1, FireKind.SCHEDULED, lane, FireState.PENDING,
                   decided if decided is not None else at + 1000, "2026f", "node-a")


def decide(store, trig, fires, *, due_us, new_us):
    out = store.timing.apply_decisions([Decision(Advance(trig.id, due_us, 1, new_us, 1), tuple(fires))])
    assert out[0].advanced


def settle(store, jobs, result, *, at_us, status=200, state=None, retry_at=None):
    st = state or (FireState.DELIVERED if result == AttemptResult.DELIVERED else FireState.PENDING)
    return store.dispatch.settle_attempts([Settlement(j, result, status, None, st, None, retry_at) for j in jobs],
                                          at_us)


@pytest.fixture
def one(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, first = add_trigger(store, t, tg, {"every": "60s"})
    return t, trig, first


def test_lane_due_age_is_per_lane_from_the_dispatch_time_and_skips_attempted_fires(store, one):
    _, trig, f = one
    assert store.history.lane_due_since(LANES) == {}
    assert store.history.undecided_since() == f
    decide(store, trig, [nf(trig, f, decided=f + 2 * S),
                         nf(trig, f - 50 * M, lane=Lane.CATCH_UP, decided=f + 3 * S),
                         nf(trig, f - 40 * M, lane=Lane.CATCH_UP, decided=f + 4 * S),
                         nf(trig, f - 90 * M, lane=Lane.BACKFILL, decided=f + 5 * S, seq=2)],
           due_us=f, new_us=f + M)
    assert store.history.undecided_since() == f + M
    # Each lane waits from its oldest fire's dispatch time (the decision), not the scheduled instant.
    assert store.history.lane_due_since(LANES) == {"on-time": f + 2 * S, "catch-up": f + 3 * S,
                                                   "backfill": f + 5 * S}
    assert store.history.lane_due_since(("catch-up",)) == {"catch-up": f + 3 * S}
    # The on-time fire is attempted and will be retried: no longer waiting on the platform.
    jobs = store.dispatch.claim_dispatch("on-time", f + 6 * S, 10, "runner-1", 30 * S)
    assert len(jobs) == 1
    assert "on-time" not in store.history.lane_due_since(LANES)
    settle(store, jobs, AttemptResult.RETRY, at_us=f + 7 * S, status=503, retry_at=f + 8 * S)
    assert "on-time" not in store.history.lane_due_since(LANES)
    # Only the on-time lane feeds the per-partition page; the recovery lanes never do.
    assert store.history.due_waiting_by_partition(f + 30 * S) == {}
    # One catch-up fire attempted: the lane's age moves to the next one.
    jobs = store.dispatch.claim_dispatch("catch-up", f + 9 * S, 1, "runner-1", 30 * S)
    assert [j.fire.scheduled_us for j in jobs] == [f - 50 * M]
    assert store.history.lane_due_since(LANES)["catch-up"] == f + 4 * S


def test_lane_due_age_reads_are_index_ordered_probes(store, one):
    """No scan of the backlog per scrape: each read is an ordered probe of an index (on PostgreSQL,
    with sequential scans priced out: on a tiny table its planner would rightly prefer one)."""
    if store.engine_name == "postgres":
        with store.engine.read() as c:
            c.execute("SET LOCAL enable_seqscan = off")
            plan = " ".join(str(r[0]) for r in c.execute(
                "EXPLAIN " + store.q["ln_lane_oldest"], {"lane": "on-time"}).fetchall())
            due = " ".join(str(r[0]) for r in c.execute("EXPLAIN " + store.q["ln_undecided_oldest"]).fetchall())
        assert "fires_never_attempted" in plan and "Sort" not in plan, plan
        assert "due_by_instant" in due and "Sort" not in due, due
        return
    with store.engine.read() as c:
        plan = " ".join(str(r[-1]) for r in c.execute("EXPLAIN QUERY PLAN " + store.q["ln_lane_oldest"],
                                                      {"lane": "on-time"}).fetchall())
        due = " ".join(str(r[-1]) for r in c.execute("EXPLAIN QUERY PLAN " + store.q["ln_undecided_oldest"]))
    assert "fires_never_attempted" in plan and "TEMP B-TREE" not in plan, plan
    assert "due_by_instant" in due and "TEMP B-TREE" not in due, due


def test_a_drain_is_declared_superseded_stopped_and_expires_with_audit(store):
    t0 = 1_800_000_000 * S
    assert store.dispatch.drain_in_force(t0) is None and store.dispatch.drain_latest() is None
    d1 = store.dispatch.drain_start(t0 + 3600 * S, "planned maintenance", "operator", t0)
    assert store.dispatch.drain_in_force(t0 + S) == d1 and d1.in_force(t0 + S)
    assert store.dispatch.drain_in_force(t0 + 3600 * S) is None      # expired by itself
    d2 = store.dispatch.drain_start(t0 + 7200 * S, "longer", "operator", t0 + 10 * S)
    assert store.dispatch.drain_in_force(t0 + 4000 * S) == d2        # supersedes, extends
    assert store.dispatch.drain_latest() == d2
    stopped = store.dispatch.drain_stop("operator", t0 + 20 * S)
    assert stopped is not None and stopped.id == d2.id and stopped.ended_us == t0 + 20 * S
    assert store.dispatch.drain_in_force(t0 + 21 * S) is None
    assert store.dispatch.drain_stop("operator", t0 + 22 * S) is None
    latest = store.dispatch.drain_latest()
    assert latest is not None and latest.ended_by == "operator" and not latest.in_force(t0 + 21 * S)
    rows = [r for r in store.trust.audit_rows() if r.action.startswith("drain.")]
    assert [r.action for r in rows] == ["drain.start", "drain.start", "drain.stop"]
    assert rows[0].prior is None and json.loads(rows[1].prior)["id"] == d1.id
    assert json.loads(rows[2].new)["ended_us"] == t0 + 20 * S
    assert all(r.tenant_id is None and r.actor == "operator" for r in rows)
    with pytest.raises(ValueError):
        store.dispatch.drain_start(t0, "x", "operator", t0)
    with pytest.raises(ValueError):
        store.dispatch.drain_start(t0 + S, "  ", "operator", t0)


def test_delivery_counts_prove_and_suspect_duplicates_from_the_attempts(store, one):
    tenant, trig, f = one
    decide(store, trig, [nf(trig, f), nf(trig, f + 1), nf(trig, f + 2)], due_us=f, new_us=f + M)
    t = f + S
    # Fire 1: retried after a 503, then delivered: two attempts, no duplicate (the receiver said no).
    [j1] = [j for j in store.dispatch.claim_dispatch("on-time", t, 1, "r1", 30 * S)]
    settle(store, [j1], AttemptResult.RETRY, at_us=t, status=503, retry_at=t)
    # Fire 2: runner r1 vanishes mid-attempt; after its lease, r2 delivers it.
    [j2] = store.dispatch.claim_dispatch("on-time", t, 1, "r1", 1 * S)
    assert j2.fire.scheduled_us == f + 1
    later = t + 5 * S
    jobs = store.dispatch.claim_dispatch("on-time", later, 10, "r2", 30 * S)
    assert {j.fire.scheduled_us for j in jobs} == {f, f + 1, f + 2}
    assert settle(store, jobs, AttemptResult.DELIVERED, at_us=later) == [True, True, True]
    c = store.history.delivery_counts(tenant.id, f, f + M)
    assert (c.delivered_fires, c.duplicate_attempts, c.possible_duplicate_attempts) == (3, 0, 1)
    assert c.possible_per_million == pytest.approx(1e6 / 3)
    # r1 comes back: the receiver had answered it 2xx too. The ledger now proves the duplicate.
    assert settle(store, [j2], AttemptResult.DELIVERED, at_us=later + S) == [False]
    c = store.history.delivery_counts(tenant.id, f, f + M)
    assert (c.delivered_fires, c.duplicate_attempts, c.possible_duplicate_attempts) == (3, 1, 0)
    assert c.duplicates_per_million == pytest.approx(1e6 / 3)
    # The window is half-open on the scheduled instant, and per tenant.
    assert store.history.delivery_counts(tenant.id, f + 2, f + M).delivered_fires == 1
    assert store.history.delivery_counts(tenant.id, f, f + 1).duplicate_attempts == 0
    other = add_tenant(store, "other")
    empty = store.history.delivery_counts(other.id, f, f + M)
    assert empty.delivered_fires == 0 and empty.duplicates_per_million is None


def test_the_duplicate_rate_metric_sums_tenants_over_the_trailing_hour_and_rereads_once_per_ttl(store, one):
    tenant, trig, f = one
    decide(store, trig, [nf(trig, f), nf(trig, f + 1)], due_us=f, new_us=f + M)
    [j] = store.dispatch.claim_dispatch("on-time", f + S, 1, "r1", 1 * S)
    jobs = store.dispatch.claim_dispatch("on-time", f + 5 * S, 10, "r2", 30 * S)
    settle(store, jobs, AttemptResult.DELIVERED, at_us=f + 6 * S)
    t = [0.0]
    rate = DuplicateRate(ttl_s=60.0, monotonic=lambda: t[0])

    def read(now_us):
        fams = {m.name: m for m in rate.families(store, now_us)}
        kinds = {s.labels["kind"]: s.value for s in fams["fireledger_duplicate_deliveries_per_million"].samples}
        return kinds, fams["fireledger_delivered_fires_window"].samples[0].value

    assert read(f + 10 * S) == ({"proven": 0.0, "possible": 500_000.0}, 2.0)
    settle(store, [j], AttemptResult.DELIVERED, at_us=f + 7 * S)       # r1's late 2xx: a proven duplicate
    t[0] = 59.9
    assert read(f + 10 * S) == ({"proven": 0.0, "possible": 500_000.0}, 2.0)   # the reading is reused
    t[0] = 60.0
    assert read(f + 10 * S) == ({"proven": 500_000.0, "possible": 0.0}, 2.0)
    t[0] = 120.0
    assert read(f + 3600 * S + 2) == ({"proven": 0.0, "possible": 0.0}, 0.0)   # out of the trailing hour
