"""Overlap policy (seed ADR-12, DESIGN.md invariant 9, decision 0060).

* The pure rule (``fireledger.domain.overlap``) exhaustively: every previous-fire state × outcome ×
  dispatched or not × inside/outside its window × policy.
* The timing loop on a fake clock over a real store, on SQLite and PostgreSQL: ``skip`` records
  skipped with a cause; ``queue`` holds one fire, supersedes it with a newer instant, releases it
  when an outcome is reported and when the window ends (recording "counted as finished"); dispatch
  never claims a held fire; ``allow`` is untouched and never reads the previous fire.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fireledger.clock import FakeClock
from fireledger.control.history import explain_cause, fire_story, history_item
from fireledger.dispatch.http import HttpResult
from fireledger.dispatch.runner import settle
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import (
    Advance,
    Decision,
    DispatchJob,
    Fire,
    FireKind,
    FireState,
    Lane,
    NewFire,
    OverlapPolicy,
    Policies,
    Target,
)
from fireledger.domain.overlap import (
    HeldRef,
    PreviousFire,
    Verdict,
    apply_overlap,
    overlap_plan,
    previous_status,
    release_plan,
)
from fireledger.timing import TimingLoop
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
KEY = "tn_a.tr_b.20270115T080000Z.0"
WINDOW_S = 30
DISPATCHED = T0 + 100_000

# --- the pure rule, exhaustively ----------------------------------------------------------------


def expected_verdict(state: FireState, dispatched: bool, outcome: bool, past_window: bool,
                     policy: OverlapPolicy) -> Verdict:
    """The rule as the decision states it, independently of the implementation's branches."""
    if policy == OverlapPolicy.ALLOW:
        return Verdict.PROCEED
    if state in (FireState.SKIPPED, FireState.EXPIRED, FireState.HELD):   # never a previous fire
        return Verdict.PROCEED
    if state == FireState.FAILED or outcome:
        return Verdict.PROCEED
    if state in (FireState.PENDING, FireState.DISPATCHING):
        running = True
    elif not dispatched:       # delivered / unknown without a dispatch instant: no window to wait on
        running = False
    else:
        running = not past_window
    if running:
        return Verdict.SKIP if policy == OverlapPolicy.SKIP else Verdict.HOLD
    return Verdict.PROCEED_NOTED


CASES = list(itertools.product(list(FireState), [False, True], [False, True], [False, True], list(OverlapPolicy)))


@pytest.mark.parametrize(("state", "dispatched", "outcome", "past_window", "policy"), CASES,
                         ids=["-".join(str(x) for x in c) for c in CASES])
def test_overlap_plan_for_every_previous_state(state, dispatched, outcome, past_window, policy):
    prev = PreviousFire(KEY, state, DISPATCHED if dispatched else None, outcome, WINDOW_S)
    end = DISPATCHED + WINDOW_S * S
    at = end if past_window else end - 1          # the window's end is the first instant past it
    plan = overlap_plan(prev, policy, at)
    want = expected_verdict(state, dispatched, outcome, past_window, policy)
    assert plan.verdict == want
    if want == Verdict.PROCEED:
        assert plan.cause is None
    elif want == Verdict.PROCEED_NOTED:
        assert plan.cause is not None and plan.cause.startswith(f"overlap: previous fire {KEY} ")
        assert plan.cause.endswith("counted as finished")
        if dispatched:
            assert "had no outcome by the end of its window (2027-01-15T08:00:30.100000Z)" in plan.cause
    elif want == Verdict.SKIP:
        assert plan.cause is not None
        assert plan.cause.startswith(f"skipped: overlap policy skip; previous fire {KEY} still running (")
    else:
        assert plan.cause is not None
        assert plan.cause.startswith(f"held: overlap policy queue; previous fire {KEY} still running (")
    # The same facts decide a release (queue and skip release alike; allow releases at once).
    rel = release_plan(prev, policy, at)
    if policy == OverlapPolicy.ALLOW:
        assert rel.verdict == Verdict.PROCEED and rel.cause is not None and "now allow" in rel.cause
    elif want in (Verdict.SKIP, Verdict.HOLD):
        assert rel.verdict == Verdict.HOLD
    else:
        assert rel.verdict == want
        assert rel.cause is not None and rel.cause.startswith(f"overlap: released from hold; previous fire {KEY} ")
        assert rel.cause.endswith("counted as finished") == (want == Verdict.PROCEED_NOTED)


def test_running_causes_say_why_and_when_the_window_ends():
    at = DISPATCHED + 5 * S
    delivered = PreviousFire(KEY, FireState.UNKNOWN, DISPATCHED, False, WINDOW_S)
    assert overlap_plan(delivered, OverlapPolicy.SKIP, at).cause == (
        f"skipped: overlap policy skip; previous fire {KEY} still running "
        "(unknown, no outcome; its window ends 2027-01-15T08:00:30.100000Z)")
    waiting = PreviousFire(KEY, FireState.PENDING, None, False, WINDOW_S)
    assert previous_status(waiting, at).reason == "pending, not yet dispatched"
    # A pending fire is running however old it is: the dispatch plane still owns it.
    assert previous_status(waiting, at + 10**6 * S).running
    retrying = PreviousFire(KEY, FireState.PENDING, DISPATCHED, False, WINDOW_S)
    assert previous_status(retrying, DISPATCHED + 10**6 * S).running


def test_no_previous_fire_proceeds_and_releases():
    for policy in OverlapPolicy:
        assert overlap_plan(None, policy, T0).verdict == Verdict.PROCEED
    assert release_plan(None, OverlapPolicy.QUEUE, T0).verdict == Verdict.PROCEED


def _fire(us: int, state: FireState = FireState.PENDING, kind: FireKind = FireKind.SCHEDULED) -> NewFire:
    return NewFire("tn_a", "tr_b", us, 0, 1, kind, Lane.ON_TIME if kind == FireKind.SCHEDULED else Lane.CATCH_UP,
                   state, T0 + 100 * S, "2026a", "n1", None, us + 3 * S)


def _key(us: int) -> str:
    return str(FireKey("tn_a", "tr_b", us, 0))


def _decision(*fires: NewFire) -> Decision:
    return Decision(Advance("tr_b", fires[0].scheduled_us, 1, T0 + 200 * S, 1), tuple(fires))


RUNNING = PreviousFire(KEY, FireState.DISPATCHING, DISPATCHED, False, WINDOW_S)
AT = T0 + 100 * S


def test_apply_overlap_allow_returns_the_decision_unchanged():
    d = _decision(_fire(T0 + 60 * S), _fire(T0 + 90 * S))
    assert apply_overlap(d, RUNNING, HeldRef("tn_a", "tr_b", T0, 0), OverlapPolicy.ALLOW, 60, AT) is d


def test_apply_overlap_skip_skips_every_dispatchable_fire_behind_a_running_one():
    expired = _fire(T0, FireState.EXPIRED, FireKind.CATCH_UP)
    d = _decision(expired, _fire(T0 + 60 * S, kind=FireKind.CATCH_UP), _fire(T0 + 90 * S))
    out = apply_overlap(d, RUNNING, None, OverlapPolicy.SKIP, 60, AT)
    assert out.fires[0] == expired                       # the missed-fire record passes unchanged
    assert [f.state for f in out.fires[1:]] == [FireState.SKIPPED, FireState.SKIPPED]
    assert all(f.cause and f.cause.startswith(f"skipped: overlap policy skip; previous fire {KEY}")
               for f in out.fires[1:])
    assert all(f.not_before_us is None for f in out.fires[1:])
    assert out.updates == ()


def test_apply_overlap_lets_the_first_through_then_treats_it_as_running():
    d = _decision(_fire(T0 + 60 * S, kind=FireKind.CATCH_UP), _fire(T0 + 90 * S))
    out = apply_overlap(d, None, None, OverlapPolicy.SKIP, 60, AT)
    assert out.fires[0] == d.fires[0]
    assert out.fires[1].state == FireState.SKIPPED
    assert out.fires[1].cause == (f"skipped: overlap policy skip; previous fire {_key(T0 + 60 * S)} still "
                                  "running (pending, not yet dispatched)")


def test_apply_overlap_queue_holds_one_and_supersedes_older_holds():
    held_before = HeldRef("tn_a", "tr_b", T0 + 30 * S, 0)
    d = _decision(_fire(T0 + 60 * S), _fire(T0 + 90 * S))
    out = apply_overlap(d, RUNNING, held_before, OverlapPolicy.QUEUE, 60, AT)
    first, second = out.fires
    assert first.state == FireState.SKIPPED
    assert first.cause == (f"superseded: overlap policy queue holds one pending fire; {_key(T0 + 90 * S)} "
                           "replaced it")
    assert second.state == FireState.HELD and second.not_before_us is None
    assert second.cause is not None and second.cause.startswith(f"held: overlap policy queue; previous fire {KEY}")
    # The committed held fire is superseded by the first new hold, in the same decision.
    [u] = out.updates
    assert (u.scheduled_us, u.expected_state, u.new_state, u.at_us) == (
        T0 + 30 * S, FireState.HELD, FireState.SKIPPED, AT)
    assert u.cause == f"superseded: overlap policy queue holds one pending fire; {_key(T0 + 60 * S)} replaced it"


def test_apply_overlap_a_fire_that_proceeds_supersedes_a_stale_hold():
    """A previous fire that finished between the release check and the decision: the newer instant
    goes and the older held one is recorded superseded (never two dispatchable)."""
    done = replace(RUNNING, state=FireState.FAILED)
    out = apply_overlap(_decision(_fire(T0 + 60 * S)), done, HeldRef("tn_a", "tr_b", T0 + 30 * S, 0),
                        OverlapPolicy.QUEUE, 60, AT)
    assert out.fires[0].state == FireState.PENDING and out.fires[0].cause is None
    [u] = out.updates
    assert u.new_state == FireState.SKIPPED and u.cause.startswith("superseded:")


def test_apply_overlap_notes_a_previous_counted_as_finished():
    old = PreviousFire(KEY, FireState.UNKNOWN, DISPATCHED, False, WINDOW_S)
    out = apply_overlap(_decision(_fire(T0 + 60 * S)), old, None, OverlapPolicy.SKIP, 60, AT)
    assert out.fires[0].state == FireState.PENDING
    assert out.fires[0].cause == (f"overlap: previous fire {KEY} had no outcome by the end of its window "
                                  "(2027-01-15T08:00:30.100000Z); counted as finished")
    assert out.fires[0].not_before_us == T0 + 63 * S      # its smeared dispatch time is kept


def test_causes_are_explained_in_history():
    assert "skip withheld it" in (explain_cause("skipped: overlap policy skip; previous fire x still running") or "")
    assert "holds it" in (explain_cause("held: overlap policy queue; previous fire x still running (y)") or "")
    assert "replaced" in (explain_cause("superseded: overlap policy queue holds one pending fire; k") or "")
    assert "counted it as finished" in (explain_cause("overlap: previous fire k had no outcome ...") or "")
    # A terminal cause put before an overlap note is explained by its own head.
    both = "unknown: no answer within 1s and no attempts left; overlap: previous fire k had no outcome"
    assert "did not answer" in (explain_cause(both) or "")


def test_a_timed_out_last_attempt_ends_unknown_not_failed():
    """Invariant 9: a timeout is ``unknown``; with no attempt left (max_attempts 1) the fire ends
    unknown, and the cause says so."""
    fire = Fire("tn_a", "tr_b", T0, 0, 1, "scheduled", "on-time", "dispatching", None, T0, "n", T0, None,
                "2026a", 1, T0 + 2 * S)
    target = Target("tg", "tn_a", "http", "http://x", "whsec_x", "verified", "v", T0)
    job = DispatchJob(fire, 1, target, b"{}", Policies(timeout_s=1.0, max_attempts=1), "d1", T0 + 2 * S)
    s = settle(job, HttpResult("unknown", None, "timed out", 1.0, sent=True), T0 + S, 0.5, 60.0)
    assert (s.result, s.state) == ("unknown", "unknown")
    assert s.cause == "unknown: no answer within 1s and no attempts left"
    assert s.next_attempt_us is None


# --- the timing loop on a real store, both engines ------------------------------------------------


class Spy:
    """Counts the overlap queries the loop makes (the real store method still runs)."""

    def __init__(self, store):
        self.calls: list[int] = []
        real = store.timing.overlap_facts

        def facts(triggers):
            self.calls.append(len(triggers))
            return real(triggers)

        store.timing.overlap_facts = facts


def setup(store, policy: OverlapPolicy, window_s: int = 30, every: str = "10s"):
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, first = add_trigger(store, t, tg, {"every": every},
                                 policies=Policies(overlap=policy, outcome_window_s=window_s))
    clock = FakeClock(first)
    handed: list[NewFire] = []
    loop = TimingLoop(store, clock, "node-a", on_committed=handed.extend)
    return trig, tg, first, clock, loop, handed


def fires_of(store, trig):
    return {f.scheduled_us: f for f in store.history.history_fires(trig.tenant_id, trigger_id=trig.id, limit=1000)}


def claim(store, at_us):
    return store.dispatch.claim_dispatch("on-time", at_us, 10, "d1", 60 * S)


def finish(store, job, state, at_us, cause=None):
    assert store.dispatch.settle_attempts([Settlement(job, state, None, None, state, cause, None)], at_us) == [True]


def key_of(trig, us):
    return str(FireKey(trig.tenant_id, trig.id, us, 0))


def test_skip_records_skipped_with_a_cause_until_the_window_ends(store):
    trig, tg, first, clock, loop, handed = setup(store, OverlapPolicy.SKIP)
    assert [f.state for f in loop.tick().inserted] == [FireState.PENDING]
    [job] = claim(store, first + 100_000)                 # dispatched at first + 0.1 s
    k0 = key_of(trig, first)
    clock.set(first + 10 * S)
    [f1] = loop.tick().inserted
    assert f1.state == FireState.SKIPPED
    assert f1.cause.startswith(f"skipped: overlap policy skip; previous fire {k0} still running (dispatching")
    # The attempt times out with no attempt left: unknown, still inside its 30 s window.
    finish(store, job, "unknown", first + 11 * S, "unknown: no answer within 1s and no attempts left")
    for t in (20, 30):
        clock.set(first + t * S)
        [f] = loop.tick().inserted
        assert f.state == FireState.SKIPPED
        assert f.cause == (f"skipped: overlap policy skip; previous fire {k0} still running (unknown, no outcome; "
                           f"its window ends {_iso(first + 30 * S + 100_000)})")
    clock.set(first + 40 * S)
    [f4] = loop.tick().inserted
    assert f4.state == FireState.PENDING
    assert f4.cause == (f"overlap: previous fire {k0} had no outcome by the end of its window "
                        f"({_iso(first + 30 * S + 100_000)}); counted as finished")
    assert [f.scheduled_us for f in handed] == [first, first + 40 * S]     # skipped ones never handed over
    # History shows every decision with its cause, and the note survives delivery.
    [job4] = claim(store, first + 40 * S)
    finish(store, job4, "delivered", first + 41 * S)
    got = fires_of(store, trig)
    assert [got[first + t * S].state for t in (0, 10, 20, 30, 40)] == [
        "unknown", "skipped", "skipped", "skipped", "delivered"]
    item = history_item(got[first + 40 * S])
    assert item["state"] == "delivered" and item["cause"] == f4.cause
    assert any("counted it as finished" in line for _, line in fire_story(got[first + 40 * S]))
    assert got[first].cause == "unknown: no answer within 1s and no attempts left"


def test_an_outcome_or_a_failure_finishes_the_previous_fire_at_once(store):
    trig, tg, first, clock, loop, handed = setup(store, OverlapPolicy.SKIP)
    loop.tick()
    [job] = claim(store, first + 100_000)
    finish(store, job, "delivered", first + S)
    store.dispatch.record_outcome(FireKey(trig.tenant_id, trig.id, first, 0), "succeeded", first + 2 * S,
                         target_id=tg.id, msg_id="msg_1", replay_window_us=300 * S)
    clock.set(first + 10 * S)
    [f1] = loop.tick().inserted
    assert (f1.state, f1.cause) == (FireState.PENDING, None)
    [job1] = claim(store, first + 10 * S)
    finish(store, job1, "failed", first + 11 * S, "failed: HTTP 404 is final")
    clock.set(first + 20 * S)
    [f2] = loop.tick().inserted
    assert (f2.state, f2.cause) == (FireState.PENDING, None)


def test_queue_holds_one_supersedes_and_releases_on_outcome_and_on_window_end(store):
    trig, tg, first, clock, loop, handed = setup(store, OverlapPolicy.QUEUE)
    loop.tick()
    [job0] = claim(store, first + 100_000)
    finish(store, job0, "delivered", first + S)
    k0 = key_of(trig, first)
    clock.set(first + 10 * S)
    [f1] = loop.tick().inserted
    assert f1.state == FireState.HELD
    assert f1.cause.startswith(f"held: overlap policy queue; previous fire {k0} still running (delivered, no outcome")
    # Dispatch never claims a held fire.
    assert claim(store, first + 11 * S) == []
    clock.set(first + 20 * S)
    [f2] = loop.tick().inserted
    assert f2.state == FireState.HELD
    got = fires_of(store, trig)
    assert got[first + 10 * S].state == "skipped"
    assert got[first + 10 * S].cause == (f"superseded: overlap policy queue holds one pending fire; "
                                         f"{key_of(trig, first + 20 * S)} replaced it")
    assert sum(1 for f in got.values() if f.state == "held") == 1
    assert store.history.lane_depths().get(("on-time", "held")) == 1           # counted as a live fire
    assert store.history.count_expiring(trig.tenant_id, first + 100 * S) == (2, 1)   # never purged while held
    # The outcome arrives: the next cycle releases the held fire (before deciding anything new).
    store.dispatch.record_outcome(FireKey(trig.tenant_id, trig.id, first, 0), "succeeded", first + 25 * S,
                         target_id=tg.id, msg_id="msg_1", replay_window_us=300 * S)
    clock.set(first + 25 * S)
    res = loop.tick()
    assert res.inserted == []
    assert [f.scheduled_us for f in res.released] == [first + 20 * S]
    assert handed[-1].scheduled_us == first + 20 * S                  # handed to dispatch after commit
    rel = fires_of(store, trig)[first + 20 * S]
    assert rel.state == "pending" and rel.next_attempt_us == first + 25 * S
    assert rel.cause == (f"overlap: released from hold; previous fire {k0} finished "
                         "(its work outcome was reported)")
    [job2] = claim(store, first + 25 * S)
    assert job2.fire.scheduled_us == first + 20 * S
    # The released fire is now the running previous fire: the next instant is held behind it.
    clock.set(first + 30 * S)
    [f3] = loop.tick().inserted
    k2 = key_of(trig, first + 20 * S)
    assert f3.state == FireState.HELD and f"previous fire {k2} still running (dispatching" in f3.cause
    finish(store, job2, "unknown", first + 26 * S, "unknown: no answer within 1s and no attempts left")
    # No outcome ever comes: its window (first+25 s + 30 s) ends; two instants come due at once.
    # The held fire is released with the recorded "counted as finished", then the newer instant is
    # held behind it and supersedes its sibling of the same decision.
    clock.set(first + 55 * S)
    res = loop.tick()
    assert [f.scheduled_us for f in res.released] == [first + 30 * S]
    assert [(f.scheduled_us, f.state) for f in res.inserted] == [
        (first + 40 * S, FireState.SKIPPED), (first + 50 * S, FireState.HELD)]
    got = fires_of(store, trig)
    assert got[first + 30 * S].cause == (f"overlap: released from hold; previous fire {k2} had no outcome by the "
                                         f"end of its window ({_iso(first + 55 * S)}); counted as finished")
    assert got[first + 40 * S].cause.startswith("superseded: ")
    assert sum(1 for f in got.values() if f.state == "held") == 1
    story = fire_story(got[first + 50 * S])
    assert any("as held" in line for _, line in story) and any("held, not dispatched yet" in line
                                                                 for _, line in story)


def test_an_amendment_to_allow_releases_the_held_fire(store):
    trig, tg, first, clock, loop, handed = setup(store, OverlapPolicy.QUEUE)
    loop.tick()
    claim(store, first + 100_000)
    clock.set(first + 10 * S)
    assert [f.state for f in loop.tick().inserted] == [FireState.HELD]
    v1 = store.registry.get_version(trig.id, 1)
    v2 = replace(v1, version=2, policies=replace(v1.policies, overlap=OverlapPolicy.ALLOW),
                 created_us=first + 11 * S)
    assert store.registry.amend_trigger(store.registry.get_trigger(trig.tenant_id, trig.id), v2, trig.name,
                                        first + 20 * S,
                               first + 11 * S)
    clock.set(first + 12 * S)
    res = loop.tick()
    assert [f.scheduled_us for f in res.released] == [first + 10 * S]
    assert fires_of(store, trig)[first + 10 * S].cause == "overlap: released from hold; the overlap policy is now allow"


def test_deleting_the_tenant_skips_its_held_fire(store):
    """A held fire is live: tenant deletion withdraws it with the other live fires, so no release
    ever dispatches it."""
    trig, tg, first, clock, loop, handed = setup(store, OverlapPolicy.QUEUE)
    loop.tick()
    claim(store, first + 100_000)
    clock.set(first + 10 * S)
    assert [f.state for f in loop.tick().inserted] == [FireState.HELD]
    assert store.trust.delete_tenant(trig.tenant_id, "operator", first + 11 * S) is not None
    got = fires_of(store, trig)[first + 10 * S]
    assert (got.state, got.cause) == ("skipped", "skipped: the tenant was deleted")
    clock.set(first + 100 * S)
    assert loop.tick().released == []


def test_held_fires_are_re_evaluated_page_by_page(store):
    t = add_tenant(store)
    tg = add_target(store, t)
    trigs = [add_trigger(store, t, tg, {"every": "10s"}, policies=Policies(overlap=OverlapPolicy.QUEUE,
                                                                           outcome_window_s=30))[0]
             for _ in range(3)]
    first = T0 + 10 * S
    clock = FakeClock(first)
    loop = TimingLoop(store, clock, "node-a")
    loop.tick()
    jobs = claim(store, first)
    assert len(jobs) == 3
    clock.set(first + 10 * S)
    assert [f.state for f in loop.tick().inserted] == [FireState.HELD] * 3
    assert len(store.timing.held_fires()) == 3 and len(store.timing.held_fires(limit=2)) == 2
    for job in jobs:
        finish(store, job, "failed", first + 11 * S, "failed: HTTP 404 is final")
    released = loop.release_held(first + 12 * S, None, page=2)
    assert sorted(f.trigger_id for f in released) == sorted(tr.id for tr in trigs)
    assert store.timing.held_fires() == []


def test_allow_is_untouched_and_never_reads_the_previous_fire(store):
    spy = Spy(store)
    trig, tg, first, clock, loop, handed = setup(store, OverlapPolicy.ALLOW)
    loop.tick()
    claim(store, first + 100_000)                          # the previous fire is still running
    clock.set(first + 10 * S)
    [f1] = loop.tick().inserted
    assert (f1.state, f1.cause) == (FireState.PENDING, None)
    assert spy.calls == []


def test_one_overlap_query_per_batch_for_every_checked_trigger(store):
    spy = Spy(store)
    t = add_tenant(store)
    tg = add_target(store, t)
    trigs = [add_trigger(store, t, tg, {"every": "10s"}, policies=Policies(overlap=p, outcome_window_s=30))
             for p in (OverlapPolicy.SKIP, OverlapPolicy.QUEUE, OverlapPolicy.ALLOW, OverlapPolicy.SKIP)]
    first = trigs[0][2]
    clock = FakeClock(first + 10 * S)        # every trigger's first instant (and the next) are due
    loop = TimingLoop(store, clock, "node-a")
    res = loop.tick()
    assert spy.calls == [3]                  # one statement, three non-allow triggers
    by = {}
    for f in res.inserted:
        by.setdefault(f.trigger_id, []).append(f.state)
    assert by[trigs[2][0].id] == [FireState.PENDING, FireState.PENDING]
    assert by[trigs[0][0].id] == [FireState.PENDING, FireState.SKIPPED]
    assert by[trigs[1][0].id] == [FireState.PENDING, FireState.HELD]


def _iso(us: int) -> str:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    return format_instant(from_us(us))


# --- end to end: real processes, a target that holds the request open ----------------------------


@pytest.mark.e2e
def test_serve_skip_overlap_with_a_silent_target_ends_unknown_and_resumes_after_the_window(tmp_path):
    """``fireledger serve`` on SQLite; a trigger every 2 s, overlap ``skip``, timeout 1 s, outcome
    window 4 s, to a target that never answers and never calls back. The first fire ends unknown;
    the instants decided inside its window are skipped with the overlap cause; the first decided
    after the window end is dispatched, carrying the recorded "counted as finished"."""
    from e2e import Api, Service, new_tenant, verify_target, wait_until
    from fireledger.recurrence import parse_instant
    from sink import SinkServer

    db = f"sqlite:///{tmp_path}/fl.db"
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(db, tmp_path).start()
    try:
        _, token = new_tenant(db)
        api = Api(svc.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hang"}, 201)
        sink.add_secret(tg["secret"])
        verify_target(api, sink, tg)
        tid = api.ok("POST", "/v1/triggers", {
            "name": "overlapping", "schedule": {"every": "2s"}, "target_id": tg["id"], "overlap_policy": "skip",
            "outcome_window": "4s", "timeout": "1s", "jitter": "0s"}, 201)["id"]

        def ts(text):
            return parse_instant(text).timestamp()

        def settled():
            items = api.ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]
            if not items or items[0]["state"] != "unknown":
                return None
            after = [f for f in items[1:] if f["state"] != "skipped"]
            return items if after and after[0]["dispatched_at"] else None

        items = wait_until(settled, 20, "the first fire unknown and the next one dispatched")
        first = items[0]
        assert first["attempts"] and {a["result"] for a in first["attempts"]} == {"unknown"}
        assert first["cause"].startswith("unknown: no answer within 1s")
        window_end = ts(first["dispatched_at"]) + 4
        nxt = next(i for i, f in enumerate(items) if i > 0 and f["state"] != "skipped")
        skipped = items[1:nxt]
        assert skipped, "an instant inside the window should have been skipped"
        for f in skipped:
            assert f["cause"].startswith(f"skipped: overlap policy skip; previous fire {first['key']} still running")
            assert ts(f["decided_at"]) < window_end
            assert f["dispatched_at"] is None and f["attempts"] == []
        went = items[nxt]
        assert ts(went["decided_at"]) >= window_end
        assert f"overlap: previous fire {first['key']} had no outcome by the end of its window (" in went["cause"]
        assert went["cause"].endswith("counted as finished")
        # The window end stated in the cause is the first dispatch plus the window.
        stated = went["cause"].split("end of its window (")[1].split(")")[0]
        assert abs(ts(stated) - window_end) < 1e-5
        assert ts(went["scheduled_instant"]) <= window_end + 2     # within one interval of the window end
        # Really sent. ``dispatched_at`` is written by the claim, before the request is built and
        # written, so the sink may not have it yet: wait for the attempt to end (at its 1 s
        # timeout). An attempt recorded ``unknown`` must have been written (invariant 9).
        def went_attempt():
            for f in api.ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]:
                if f["key"] == went["key"] and f["attempts"] and f["attempts"][0]["finished_at"]:
                    return f["attempts"][0]
            return None

        attempt = wait_until(went_attempt, 10, "the dispatched fire's attempt to end")
        assert attempt["result"] == "unknown", attempt
        assert any(r["fire_key"] == went["key"] and r["attempt"] == attempt["attempt"] for r in sink.records())
    finally:
        svc.stop()
        sink.stop()
