"""The shadow rebuilder and the due-index rebuild, on real SQLite and PostgreSQL, driven by a fake
clock (the manual scheduler) and the real timing loop; the operator commands as real processes; the
step guard of the timing plane's clock."""

from __future__ import annotations

import dataclasses
import json

import pytest

from e2e import cli
from fireledger.clock import FakeClock, Interval
from fireledger.domain.model import TriggerState
from fireledger.domain.partition import partition_of
from fireledger.observe.metrics import METRICS
from fireledger.store import Store
from fireledger.timing import ShadowRebuilder, TimingLoop
from fireledger.timing.clockguard import StepGuardClock
from fireledger.timing.shadow import expected_next, rebuild
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
MS = 1_000


@pytest.fixture
def store(store):
    """The engine-parametrised store (tests/conftest.py), its partitions made."""
    store.timing.ensure_partitions()
    return store


def check_all(shadow, store, parts):
    return {p: shadow.check(p) for p in parts}


def ph(store):
    return "?" if store.engine_name == "sqlite" else "%s"


def build(store, clock):
    t = add_tenant(store)
    tg = add_target(store, t)
    trigs = []
    for i, sched in enumerate([{"every": "10s"}, {"cron": "*/30 * * * * *", "zone": "Europe/Paris"},
                               {"every": "7s"}, {"at": "2027-01-15T08:00:25Z"}]):
        trig, v, first = add_trigger(store, t, tg, sched, partition=i % 2)
        trigs.append((trig, v))
    return t, trigs


def test_a_consistent_index_shows_no_divergence_through_fires_amendments_pauses_and_resumes(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    t, trigs = build(store, clock)
    loop = TimingLoop(store, clock, "n1")
    shadow = ShadowRebuilder(store, clock, "n1")
    for _ in range(8):
        clock.advance(4 * S)
        loop.tick()
        reports = check_all(shadow, store, (0, 1))
        assert sum(r.divergent for r in reports.values()) == 0, [r.divergences for r in reports.values()]
    (a, va), (b, vb), (c, vc), _ = trigs
    # Amend: a new schedule (a new run starts now), a rename that keeps the schedule (keeps the instant).
    now = clock.now().earliest_us
    cur = store.registry.get_trigger(t.id, a.id)
    va2 = dataclasses.replace(va, version=2, created_us=now, schedule={**va.schedule, "every": "3s"})
    from fireledger.definitions import next_us, recurrence_of

    assert store.registry.amend_trigger(cur, va2, "a2", next_us(recurrence_of(va2), now), now)
    cur = store.registry.get_trigger(t.id, b.id)
    assert store.registry.amend_trigger(cur, dataclasses.replace(vb, version=2, created_us=now), "b2", cur.next_us, now)
    cur = store.registry.get_trigger(t.id, c.id)
    assert store.registry.set_trigger_state(cur, TriggerState.PAUSED, None, now)
    for _ in range(3):
        clock.advance(3 * S)
        loop.tick()
        assert sum(r.divergent for r in check_all(shadow, store, (0, 1)).values()) == 0
    now = clock.now().earliest_us
    cur = store.registry.get_trigger(t.id, c.id)
    assert store.registry.set_trigger_state(cur, TriggerState.ACTIVE, next_us(recurrence_of(vc), now), now)
    for _ in range(3):
        clock.advance(3 * S)
        loop.tick()
        reports = check_all(shadow, store, (0, 1))
        assert sum(r.divergent for r in reports.values()) == 0
    assert sum(r.triggers for r in reports.values()) == 4
    # Stored under 0/1 by hand: pending wherever that differs from the id's hash partition (a random
    # id can hash to the partition it was stored under, so the count is computed, not assumed).
    from fireledger.domain.partition import partition_of

    n = store.timing.partition_count()
    expected = sum(1 for i, (trig, _) in enumerate(trigs) if partition_of(trig.id, n) != i % 2)
    assert reports[0].repartition_pending + reports[1].repartition_pending == expected


def test_every_kind_of_divergence_is_reported_and_the_rebuild_matches_the_report(store):
    clock = FakeClock(T0 + 30 * S, eps_us=5 * MS)
    t, trigs = build(store, clock)
    (a, _), (b, _), (c, _), (d, _) = trigs
    loop = TimingLoop(store, clock, "n1")
    loop.tick()
    p = ph(store)
    good = {r.trigger_id: (r.next_us, r.version, r.partition) for r in store.timing.due_index()}
    with store.engine.write() as conn:
        conn.execute(f"DELETE FROM due WHERE trigger_id = {p}", (a.id,))                       # missing
        conn.execute(f"UPDATE due SET next_us = next_us + 1 WHERE trigger_id = {p}", (b.id,))  # wrong_instant
        conn.execute(f"UPDATE due SET version = 9 WHERE trigger_id = {p}", (c.id,))           # wrong_version
        conn.execute(store.q["tl_rebuild_insert"], {"trigger_id": d.id, "tenant_id": t.id, "partition": 1,
                                                    "next_us": T0, "version": 1})             # orphaned:
        # d is a one-shot already decided (its row was retired): a row for it should not exist.
        conn.execute(store.q["tl_rebuild_insert"], {"trigger_id": "tr_ghost", "tenant_id": t.id, "partition": 1,
                                                    "next_us": T0, "version": 1})             # stray
    shadow = ShadowRebuilder(store, clock, "n1")
    reports = check_all(shadow, store, (0, 1))
    kinds = {(x.trigger_id, x.kind) for r in reports.values() for x in r.divergences}
    assert kinds == {(a.id, "missing"), (b.id, "wrong_instant"), (c.id, "wrong_version"), (d.id, "orphaned"),
                     ("tr_ghost", "orphaned")}
    shadow.publish()
    assert METRICS.shadow_divergence.labels("orphaned")._value.get() == 2
    stored = {(x.trigger_id, x.kind, x.expected_next_us) for x in store.timing.shadow_divergences()}
    assert (a.id, "missing", good[a.id][0]) in stored
    # What the shadow expected is exactly what the rebuild writes.
    expected = {x.trigger_id: (x.expected_next_us, x.expected_version) for x in store.timing.shadow_divergences()
                if x.expected_next_us is not None}
    rebuild(store)
    after = {r.trigger_id: (r.next_us, r.version) for r in store.timing.due_index()}
    for tid, want in expected.items():
        assert after[tid] == want
    assert d.id not in good and after == {tid: (n, v) for tid, (n, v, _) in good.items()}
    assert sum(r.divergent for r in check_all(shadow, store, (0, 1)).values()) == 0


def test_a_wrong_partition_and_a_pending_repartition(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, _ = add_trigger(store, t, tg, {"every": "10s"})
    right = partition_of(trig.id)
    with store.engine.write() as conn:
        conn.execute(f"UPDATE triggers SET partition = {ph(store)} WHERE id = {ph(store)}", (right, trig.id))
    shadow = ShadowRebuilder(store, clock, "n1")
    [x] = shadow.check(right).divergences
    assert x.kind == "wrong_partition" and shadow.last.repartition_pending == 0
    rebuild(store)
    assert shadow.check(right).divergent == 0 and store.timing.due_index()[0].partition == right


def test_the_rota_walks_every_partition_once_before_repeating(store):
    clock = FakeClock(T0, eps_us=5 * MS)
    store.timing.set_partition_count(8)
    a, b = ShadowRebuilder(store, clock, "a"), ShadowRebuilder(store, clock, "b")
    seen = []
    for _ in range(4):
        clock.advance(1000)
        seen += [r.partition for r in (a.step(), b.step()) if r is not None]
    assert sorted(seen) == list(range(8))
    assert all(r.reported_us for r in store.timing.shadow_reports())


def test_expected_next_follows_the_latest_anchor():
    from fireledger.domain.timing_records import ShadowRow

    row = ShadowRow("tr_1", "tn_1", "active", 1, 0, {"every": "10s", "anchor": "2027-01-15T08:00:00Z"},
                    T0, None, None, None, None, None)
    assert expected_next(row) == T0 + 10 * S
    assert expected_next(dataclasses.replace(row, last_us=T0 + 50 * S)) == T0 + 60 * S
    assert expected_next(dataclasses.replace(row, last_us=T0 + 50 * S, resumed_us=T0 + 95 * S)) == T0 + 100 * S
    assert expected_next(dataclasses.replace(row, state="paused")) is None


def test_step_guard_widens_the_interval_when_the_wall_clock_steps():
    """The cross-check extrapolates with the local wall clock between probes: a step must not pass
    through as an earlier-than-true earliest bound (falsification scenario timing-clock-step)."""
    wall = [T0 * 1000]
    mono = [10**12]

    class Base:
        def now(self):
            w = wall[0] // 1000
            return Interval(w - 5 * MS, w + 5 * MS, "declared")

        def monotonic(self):
            return mono[0] / 1e9

    g = StepGuardClock(Base(), hold_s=10, wall_ns=lambda: wall[0], mono_ns=lambda: mono[0])
    assert g.now().eps_us == 5 * MS
    wall[0] += 100 * MS * 1000
    mono[0] += 100 * MS * 1000
    assert g.now().eps_us == 5 * MS                      # time passing is not a step
    wall[0] += 2 * S * 1000                               # stepped forward 2 s
    iv = g.now()
    assert iv.eps_us > 2 * S and iv.earliest_us <= T0 + 100 * MS and iv.source.endswith("+step")
    mono[0] += 11 * S * 1000
    wall[0] += 11 * S * 1000
    assert g.now().eps_us == 5 * MS                      # no probe to wait for: after the hold, trusted


def test_due_index_commands_rebuild_and_report(tmp_path):
    db = f"sqlite:///{tmp_path}/fl.db"
    s = Store.open(db)
    try:
        clock = FakeClock(T0, eps_us=5 * MS)
        t, trigs = build(s, clock)
        with s.engine.write() as conn:
            conn.execute("DELETE FROM due")
        ShadowRebuilder(s, clock, "n1").check(0)
    finally:
        s.close()
    rep = json.loads(cli("due-index", "report", "--db", db, "--json").stdout)
    assert rep["checked"] == 1 and rep["by_kind"]["missing"] == 2
    assert {d["kind"] for d in rep["divergences"]} == {"missing"}
    out = json.loads(cli("due-index", "rebuild", "--db", db, "--json").stdout)
    assert out["rows"] == 4 and out["added"] == 4 and out["partitions"] == 256
    assert "rebuilt the due index" in cli("due-index", "rebuild", "--db", db).stdout
    bad = cli("due-index", "report", "--db", db, "--limit", "-1", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("--limit: -1 is out of range 0-100000")
    assert cli("due-index", "rebuild", "--db", f"sqlite:///{tmp_path}/nope.db", check=False).returncode == 2


def test_partitions_commands_change_the_count_and_refuse_bad_input(tmp_path):
    db = f"sqlite:///{tmp_path}/fl.db"
    s = Store.open(db)
    try:
        t = add_tenant(s)
        tg = add_target(s, t)
        ids = [add_trigger(s, t, tg, {"every": "10s"}, partition=partition_of(f"x{i}"))[0].id for i in range(6)]
        with s.engine.write() as conn:
            for tid in ids:
                conn.execute("UPDATE triggers SET partition = ? WHERE id = ?", (partition_of(tid), tid))
                conn.execute("UPDATE due SET partition = ? WHERE trigger_id = ?", (partition_of(tid), tid))
    finally:
        s.close()
    out = json.loads(cli("partitions", "set", "16", "--db", db, "--json", "--batch", "4").stdout)
    assert out["previous"] == 256 and out["partitions"] == 16 and out["triggers"] == 6
    s = Store.open(db)
    try:
        assert s.timing.partition_count() == 16
        assert {r.trigger_id: r.partition for r in s.timing.due_index()} == {tid: partition_of(tid, 16) for tid in ids}
    finally:
        s.close()
    show = json.loads(cli("partitions", "show", "--db", db, "--json").stdout)
    assert show["partitions"] == 16 and show["stored_out_of_range"] == 0
    bad = cli("partitions", "set", "0", "--db", db, check=False)
    assert bad.returncode == 2 and "COUNT: 0 is out of range 1-65536" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_bad_timing_setting_stops_the_process_with_one_line(tmp_path):
    db = f"sqlite:///{tmp_path}/fl.db"
    out = cli("timing", "--db", db, env={"FIRELEDGER_SESSION_TTL_S": "soon"}, check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "fireledger: timing: FIRELEDGER_SESSION_TTL_S: 'soon' is not a number"


def test_a_timing_process_serves_its_own_metrics(tmp_path):
    """``fireledger timing`` has no HTTP API; FIRELEDGER_METRICS_LISTEN serves its own metrics (here
    with leases forced on SQLite: the node takes every partition and its shadow walks them)."""
    import urllib.request

    from e2e import Service, free_port, wait_until

    port = free_port()
    svc = Service(f"sqlite:///{tmp_path}/fl.db", tmp_path, command="timing",
                  env={"FIRELEDGER_METRICS_LISTEN": f"127.0.0.1:{port}", "FIRELEDGER_TIMING_LEASES": "1",
                       "FIRELEDGER_SHADOW_INTERVAL_S": "0.05"}).start()
    try:
        def scraped() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return None
            owned = [ln for ln in text.splitlines() if ln.startswith("fireledger_timing_partitions_owned{")]
            checked = 'fireledger_shadow_divergence{kind="missing"}' in text
            return text if owned and owned[0].endswith(" 256.0") and checked else None

        text = wait_until(scraped, 30, "the timing process to own every partition and report a shadow check")
        assert 'fireledger_shadow_divergence{kind="missing"} 0.0' in text
        assert "fireledger_shadow_partitions_checked_total 0.0" not in text
    finally:
        svc.stop()
    bad = cli("timing", "--db", f"sqlite:///{tmp_path}/fl.db", env={"FIRELEDGER_METRICS_LISTEN": "nowhere"},
              check=False)
    assert bad.returncode == 2 and "FIRELEDGER_METRICS_LISTEN: 'nowhere' is not HOST:PORT" in bad.stderr


def test_an_expensive_check_is_followed_by_a_pause_that_keeps_the_rebuilder_within_its_budget():
    from fireledger.clock import FakeClock
    from fireledger.timing.shadow import ShadowRebuilder, ShadowSettings

    r = ShadowRebuilder(None, FakeClock(0), "n", ShadowSettings(interval_s=1.0, budget=0.05))  # type: ignore[arg-type]
    assert r.pause_after(0.01) == 1.0                      # cheap checks: the interval
    assert abs(r.pause_after(0.4) - 7.6) < 1e-9            # 0.4 s of work → 5 % of a core
    busy = 0.4
    assert busy / (busy + r.pause_after(busy)) <= 0.05 + 1e-9
