"""Store contract of the timing plane across nodes (store/leases.py), on real SQLite and PostgreSQL:
sessions and partition leases (compare-and-set grants), the partition count, claims restricted to
partitions, the shadow rebuilder's snapshot and report, and the per-partition rebuild."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire, TriggerState
from fireledger.domain.timing_records import Divergence, Grant, ShadowReport
from fireledger.store import StoreError
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000


def beat(store, node, now, *, shedding=False, ttl=15 * S):
    return store.timing.heartbeat(node, "timing", now_us=now, started_us=T0, eps_us=5000, eps_source="declared",
                           shedding=shedding, lease_expires_us=now + ttl)


def lease(store, p):
    return next(x for x in store.timing.lease_table() if x.partition == p)


def test_the_keyspace_starts_at_256_partitions_with_a_lease_row_each(store):
    assert store.timing.partition_count() == 256
    assert store.timing.ensure_partitions() == 256
    store.timing.ensure_partitions()                      # idempotent
    rows = store.timing.lease_table()
    assert [r.partition for r in rows] == list(range(256))
    assert all(r.owner is None and r.epoch == 0 for r in rows)
    assert len(store.timing.shadow_reports()) == 256


def test_grant_is_compare_and_set_on_the_revision_read(store):
    store.timing.ensure_partitions()
    seen = lease(store, 7)
    g = Grant(7, seen.rev, T0 + 15 * S, 5000)
    assert store.timing.grant_leases("a", [g], T0) == [7]
    # A second granter that read the same revision loses: the lease moved meanwhile.
    assert store.timing.grant_leases("b", [g], T0) == []
    got = lease(store, 7)
    assert got.owner == "a" and got.epoch == 1 and got.eps_us == 5000 and got.granted_us == T0
    # A renewal bumps the revision, so a takeover decided on what was read before it fails.
    beat(store, "a", T0 + S)
    assert store.timing.grant_leases("b", [Grant(7, got.rev, T0 + 20 * S, 5000, 3 * S, "session-lost")],
                                     T0 + 2 * S) == []
    renewed = lease(store, 7)
    assert renewed.owner == "a" and renewed.expires_us == T0 + 16 * S and renewed.renewed_us == T0 + S
    assert store.timing.grant_leases("b", [Grant(7, renewed.rev, T0 + 20 * S, 7000, 3 * S, "session-lost")],
                              T0 + 5 * S) == [7]
    taken = lease(store, 7)
    assert (taken.owner, taken.epoch, taken.prev_owner, taken.takeover_us, taken.takeover_cause) == \
        ("b", 2, "a", 3 * S, "session-lost")


def test_heartbeat_renews_every_lease_held_and_shedding_releases_them(store):
    store.timing.ensure_partitions()
    rows = store.timing.lease_table()
    store.timing.grant_leases("a", [Grant(p, rows[p].rev, T0 + 15 * S, 5000) for p in (1, 2, 3)], T0)
    store.timing.grant_leases("b", [Grant(9, rows[9].rev, T0 + 15 * S, 5000)], T0)
    assert beat(store, "a", T0 + S) == [(1, 1), (2, 1), (3, 1)]
    assert all(lease(store, p).expires_us == T0 + 16 * S for p in (1, 2, 3))
    assert lease(store, 9).expires_us == T0 + 15 * S             # b's lease untouched
    [sa] = [s for s in store.timing.sessions("timing") if s.id == "a"]
    assert sa.heartbeat_us == T0 + S and not sa.shedding and sa.eps_source == "declared"
    assert beat(store, "a", T0 + 2 * S, shedding=True) == []
    assert [lease(store, p).owner for p in (1, 2, 3, 9)] == [None, None, None, "b"]
    assert lease(store, 1).released_us == T0 + 2 * S and lease(store, 1).prev_owner == "a"
    [sa] = [s for s in store.timing.sessions("timing") if s.id == "a"]
    assert sa.shedding


def test_release_offers_the_lease_and_only_the_holder_can_release(store):
    store.timing.ensure_partitions()
    store.timing.grant_leases("a", [Grant(4, lease(store, 4).rev, T0 + 15 * S, 5000)], T0)
    assert store.timing.release_leases("b", [4], T0 + S) == []           # not b's
    assert store.timing.release_leases("a", [4], T0 + S, {4: "c"}) == [4]
    got = lease(store, 4)
    assert got.owner is None and got.handoff_to == "c" and got.released_us == T0 + S
    store.timing.grant_leases("c", [Grant(4, got.rev, T0 + 16 * S, 5000, 200_000, "released")], T0 + S + 200_000)
    got = lease(store, 4)
    assert got.owner == "c" and got.handoff_to is None and got.takeover_cause == "released"


def test_a_clean_stop_releases_everything_and_marks_the_session(store):
    store.timing.ensure_partitions()
    rows = store.timing.lease_table()
    beat(store, "a", T0)
    store.timing.grant_leases("a", [Grant(p, rows[p].rev, T0 + 15 * S, 5000) for p in range(10)], T0)
    assert store.timing.stop_node("a", T0 + S) == 10
    assert all(r.owner is None for r in store.timing.lease_table())
    [sa] = store.timing.sessions("timing")
    assert sa.stopped_us == T0 + S
    assert store.timing.prune_nodes("timing", T0 + 2 * S) == 1 and store.timing.sessions("timing") == []


def test_claims_read_only_the_partitions_held_modulo_the_count(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    rows = {}
    for part in (0, 1, 5, 261):                   # 261 is stored under an old, larger count
        trig, _, first = add_trigger(store, t, tg, {"every": "60s"}, partition=part)
        rows[part] = (trig.id, first)
    until = T0 + 3600 * S
    got = {r.trigger_id for r in store.timing.due_rows_in(until, 100, [1, 5], 256)}
    assert got == {rows[1][0], rows[5][0], rows[261][0]}          # 261 % 256 == 5
    assert {r.trigger_id for r in store.timing.due_rows_in(until, 100, [0], 256)} == {rows[0][0]}
    assert store.timing.due_rows_in(until, 100, [], 256) == []
    assert store.timing.due_rows_in(T0, 100, [0, 1, 5], 256) == []       # nothing due yet
    assert store.timing.earliest_due_in([5], 256) == min(rows[5][1], rows[261][1])
    assert store.timing.earliest_due_in([2], 256) is None
    assert {r.trigger_id for r in store.timing.due_rows_in(until, 100, [1], 4)} == {rows[1][0], rows[5][0],
                                                                                    rows[261][0]}


def test_partition_count_change_resizes_leases_and_repartitions_triggers(store):
    from fireledger.domain.partition import partition_of

    t = add_tenant(store)
    tg = add_target(store, t)
    ids = [add_trigger(store, t, tg, {"every": "60s"}, partition=200)[0].id for _ in range(5)]
    store.timing.ensure_partitions()
    assert store.timing.set_partition_count(64) == 256
    assert store.timing.partition_count() == 64 and len(store.timing.lease_table()) == 64
    assert len(store.timing.shadow_reports()) == 64
    assert store.timing.count_out_of_range(64) == 5 and store.timing.out_of_range_partitions(64) == [200]
    after, seen, moved = store.timing.repartition_batch("", 3, lambda tid: partition_of(tid, 64))
    assert seen == 3 and after == sorted(ids)[2]
    after, seen2, moved2 = store.timing.repartition_batch(after, 3, lambda tid: partition_of(tid, 64))
    assert seen2 == 2 and moved + moved2 == 5
    assert store.timing.count_out_of_range(64) == 0
    for tid in ids:
        assert store.history.trigger_by_id(tid).partition == partition_of(tid, 64)
    assert {r.trigger_id: r.partition for r in store.timing.due_index()} == {tid: partition_of(tid, 64) for tid in ids}
    assert store.timing.set_partition_count(300) == 64 and len(store.timing.lease_table()) == 300
    with pytest.raises(StoreError, match="out of range"):
        store.timing.set_partition_count(0)
    assert store.timing.count_triggers() == 5


def _fire(trig, us, kind=FireKind.SCHEDULED):
    return NewFire(trig.tenant_id, trig.id, us, 0, trig.current_version, kind, Lane.ON_TIME, FireState.PENDING,
                   us + 5, "2026f", "n1")


def test_shadow_snapshot_reads_registry_ledger_and_live_row_together(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, v, first = add_trigger(store, t, tg, {"every": "60s"}, partition=3)
    store.timing.apply_decisions([Decision(Advance(trig.id, first, 1, first + 60 * S, 1), (_fire(trig, first),))])
    # A manual fire later than the schedule does not move the recurrence.
    store.timing.apply_decisions([Decision(Advance(trig.id, first + 60 * S, 1, first + 60 * S, 1),
                                    (_fire(trig, first + 90 * S, FireKind.MANUAL),))])
    [row], strays = store.timing.shadow_snapshot(3)
    assert strays == []
    assert (row.trigger_id, row.state, row.version, row.partition) == (trig.id, "active", 1, 3)
    assert row.last_us == first and row.run_start_us == v.created_us and row.resumed_us is None
    assert (row.due_next_us, row.due_version, row.due_partition) == (first + 60 * S, 1, 3)
    assert row.schedule == v.schedule
    # An amendment that keeps the schedule keeps the run's start; one that changes it starts a new run.
    v2 = dataclasses.replace(v, version=2, created_us=T0 + 100 * S)
    assert store.registry.amend_trigger(store.registry.get_trigger(t.id, trig.id), v2, "renamed", first + 60 * S,
                                        T0 + 100 * S)
    assert store.timing.shadow_snapshot(3)[0][0].run_start_us == v.created_us
    v3 = dataclasses.replace(v, version=3, created_us=T0 + 200 * S, schedule={**v.schedule, "every": "30s"})
    assert store.registry.amend_trigger(store.registry.get_trigger(t.id, trig.id), v3, "x", first + 90 * S,
                                        T0 + 200 * S)
    assert store.timing.shadow_snapshot(3)[0][0].run_start_us == T0 + 200 * S
    # Pause then resume records the resume point.
    cur = store.registry.get_trigger(t.id, trig.id)
    assert store.registry.set_trigger_state(cur, TriggerState.PAUSED, None, T0 + 300 * S)
    row = store.timing.shadow_snapshot(3)[0][0]
    assert row.state == "paused" and row.due_next_us is None and row.resumed_us is None
    cur = store.registry.get_trigger(t.id, trig.id)
    assert store.registry.set_trigger_state(cur, TriggerState.ACTIVE, T0 + 330 * S, T0 + 310 * S)
    assert store.timing.shadow_snapshot(3)[0][0].resumed_us == T0 + 310 * S
    # A due row whose trigger does not exist is a stray of its partition.
    with store.engine.write() as c:
        q = store.q["tl_rebuild_insert"]
        c.execute(q, {"trigger_id": "tr_ghost", "tenant_id": t.id, "partition": 3, "next_us": T0, "version": 1})
    assert [s.trigger_id for s in store.timing.shadow_snapshot(3)[1]] == ["tr_ghost"]


def test_shadow_rota_claims_are_exclusive_and_reports_round_trip(store):
    store.timing.ensure_partitions()
    p = store.timing.shadow_claim("a", T0, 256)
    q = store.timing.shadow_claim("b", T0 + 1, 256)
    assert p == 0 and q == 1                       # the stalest first; a claimed one is no longer stalest
    d = Divergence(p, "tr_x", "missing", None, None, T0 + 60 * S, 2)
    report = ShadowReport(p, "a", T0 + 5, 4, 3, {"missing": 1}, 1, 1234, (d,))
    store.timing.shadow_write(report)
    got = next(r for r in store.timing.shadow_reports() if r.partition == p)
    assert (got.reported_us, got.node, got.triggers, got.live_rows, got.divergent, got.count("missing"),
            got.repartition_pending, got.duration_us) == (T0 + 5, "a", 4, 3, 1, 1, 1, 1234)
    [div] = store.timing.shadow_divergences()
    assert (div.trigger_id, div.kind, div.expected_next_us, div.expected_version, div.node) == \
        ("tr_x", "missing", T0 + 60 * S, 2, "a")
    store.timing.shadow_write(dataclasses.replace(report, counts={}, divergences=()))
    assert store.timing.shadow_divergences() == []


def test_rebuild_partition_replaces_rows_with_what_the_function_computes(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    keep, _, first = add_trigger(store, t, tg, {"every": "60s"}, partition=2)
    wrong, _, _ = add_trigger(store, t, tg, {"every": "60s"}, partition=2)
    lost, _, _ = add_trigger(store, t, tg, {"every": "60s"}, partition=2)
    other, _, other_first = add_trigger(store, t, tg, {"every": "60s"}, partition=9)
    with store.engine.write() as c:
        ph = "?" if store.engine_name == "sqlite" else "%s"
        c.execute(f"DELETE FROM due WHERE trigger_id = {ph}", (lost.id,))
        c.execute(f"UPDATE due SET next_us = 1 WHERE trigger_id = {ph}", (wrong.id,))
        c.execute(store.q["tl_rebuild_insert"], {"trigger_id": "tr_ghost", "tenant_id": t.id, "partition": 2,
                                                 "next_us": T0, "version": 1})
    stats = store.timing.rebuild_partition(2, lambda r: first)
    assert (stats.triggers, stats.rows, stats.added, stats.removed, stats.changed) == (3, 3, 1, 1, 1)
    index = {r.trigger_id: r.next_us for r in store.timing.due_index()}
    assert index == {keep.id: first, wrong.id: first, lost.id: first, other.id: other_first}
    store.timing.rebuild_partition(9, lambda r: None)
    assert other.id not in {r.trigger_id for r in store.timing.due_index()}
    with store.engine.write() as c:
        c.execute(store.q["tl_rebuild_insert"], {"trigger_id": "tr_ghost2", "tenant_id": t.id, "partition": 77,
                                                 "next_us": T0, "version": 1})
    assert store.timing.delete_orphan_due() == 1


def test_definition_changes_notify_listeners_on_postgres(store, caps):
    """Migration 0002: bumping the definitions counter notifies ``fireledger_definitions`` on commit
    (SQLite has no notifications: the timing loop's capped sleep is its only path)."""
    if not caps.notifies:
        assert store.registry.definitions_counter() == 0
        return
    import psycopg

    with psycopg.connect(store.engine.url, autocommit=True) as conn:
        conn.execute("LISTEN fireledger_definitions")
        t = add_tenant(store)
        add_trigger(store, t, add_target(store, t), {"every": "60s"})
        got = [n.payload for n in conn.notifies(timeout=5, stop_after=1)]
    assert got and json.loads(got[0]) == store.registry.definitions_counter()


def test_two_nodes_racing_for_the_same_leases_never_deadlock(store):
    """Two lease cycles that renew what they hold and take over the same 64 partitions at once, their
    takeovers listed in opposite orders (the cycle lists them in a hashed spread): every lease write
    locks its rows in partition order, so PostgreSQL never has to break a deadlock between them (a
    broken one cost the cycle its round and the switchover quick form seconds of lateness, decision
    0262). Each transaction either commits or loses compare-and-sets; none fails."""
    import threading

    store.timing.ensure_partitions()
    parts = list(range(64))
    rows = store.timing.lease_table()
    store.timing.grant_leases("a", [Grant(p, rows[p].rev, T0 + 15 * S, 5000) for p in parts], T0)
    start = threading.Barrier(2)
    failures: list[str] = []
    taken: dict[str, int] = {"a": 0, "b": 0}

    def cycle(node: str, order: list[int]) -> None:
        start.wait()
        for i in range(40):
            now = T0 + (i + 1) * 1000
            try:
                beat(store, node, now)
                revs = {r.partition: r.rev for r in store.timing.lease_table()}
                got = store.timing.grant_leases(node, [Grant(p, revs[p], now + 15 * S, 5000, 0, "expired")
                                                       for p in order], now)
                taken[node] += len(got)
            except Exception as exc:  # every failure is the finding, whatever its type
                failures.append(f"{node}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=cycle, args=("a", parts)),
               threading.Thread(target=cycle, args=("b", parts[::-1]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert failures == [], failures[:3]
    # They did race: both took leases over, and every lease has one owner, the rows intact.
    assert taken["a"] > 0 and taken["b"] > 0
    final = store.timing.lease_table()
    assert [r.partition for r in final][:64] == parts and all(r.owner in ("a", "b") for r in final[:64])
