"""Smearing never reorders a trigger's own fires (issue 18 item 4, decision 0145).

Pure: the planner run against a fake clock, the trigger's schedule compiled by the recurrence
compiler, and the report's tally. Dispatch is modelled as "at the not-before instant, or at the
decision when there is none" — the earliest the dispatch plane may start each fire.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.clock.fake import FakeClock
from fireledger.domain.keys import to_us
from fireledger.domain.model import DueRow, FireState, Policies
from fireledger.domain.policies import PlanContext, plan_due
from fireledger.domain.smearing import (
    US,
    dispatch_not_before_us,
    is_capped,
    smear_cap_us,
    smear_offset_us,
)
from fireledger.observe.smearing import _Tally
from fireledger.recurrence import compile_cron, compile_interval, next_after

MINUTE_US = 60 * US
ANCHOR = datetime(2026, 3, 27, 12, 0, tzinfo=UTC)


def _trigger_with_a_late_offset(window_s: int, at_least_us: int) -> str:
    """A trigger id whose uncapped offset is at least ``at_least_us`` (found, not hard-coded)."""
    return next(t for t in (f"tr_{i:04d}" for i in range(10_000)) if smear_offset_us(t, window_s) >= at_least_us)


def _run(trigger_id: str, every_s: int, jitter_s: int, seconds: int) -> list[tuple[int, int]]:
    """Drive the planner with a fake clock ticking 100 ms; return (scheduled, dispatch-from) per fire."""
    rec = compile_interval(f"{every_s}s", ANCHOR)

    def next_fn(after_us: int) -> int | None:
        nxt = next_after(rec, datetime.fromtimestamp(after_us / US, UTC))
        return None if nxt is None else to_us(nxt)

    clock = FakeClock(to_us(ANCHOR) - US)
    row = DueRow(trigger_id, "tn_1", 0, to_us(ANCHOR), 1)
    out: list[tuple[int, int]] = []
    for _ in range(seconds * 10):
        clock.advance(100_000)
        now = clock.now().earliest_us
        if row.next_us is None or row.next_us > now:
            continue
        ctx = PlanContext(earliest_us=now, decided_by="n", tzdata_version="2026f")
        d = plan_due(row, next_fn, Policies(jitter_s=jitter_s), ctx)
        for f in d.fires:
            assert f.state == FireState.PENDING
            out.append((f.scheduled_us, f.not_before_us if f.not_before_us is not None else f.decided_us))
        row = DueRow(row.trigger_id, row.tenant_id, 0, d.advance.new_next_us, row.version)
    return out


def test_a_2s_interval_smeared_by_4s_no_longer_arrives_after_its_next_fire() -> None:
    trigger = _trigger_with_a_late_offset(4, 2 * US)     # uncapped, it would land after 12:00:02
    minute = to_us(ANCHOR)
    assert minute + smear_offset_us(trigger, 4) >= minute + 2 * US
    assert dispatch_not_before_us(trigger, minute, 4) is not None      # the old call: no next instant
    old = dispatch_not_before_us(trigger, minute, 4)
    assert old is not None and old >= minute + 2 * US                  # ... reordered against 12:00:02

    fires = _run(trigger, every_s=2, jitter_s=4, seconds=6)
    scheduled = [s for s, _ in fires]
    assert scheduled == [minute + k * 2 * US for k in range(len(scheduled))] and len(scheduled) >= 3
    whole_minute = dict(fires)[minute]
    assert minute <= whole_minute < minute + US                        # capped: below half of the 2 s gap
    dispatch_order = [s for s, _ in sorted(fires, key=lambda f: (f[1], f[0]))]
    assert dispatch_order == scheduled                                 # never reordered
    assert all(a[1] < b[1] for a, b in pairwise(fires))

    tally = _Tally()
    for s, nb in fires:
        tally.add(trigger, s, nb, 4, next_us=s + 2 * US)
    assert tally.capped == 1 and tally.smeared == 1


@settings(max_examples=300, deadline=None)
@given(trigger=st.text("abcdef0123456789", min_size=4, max_size=12), window_s=st.integers(1, 3600),
       gaps=st.lists(st.integers(1, 7200), min_size=2, max_size=8))
def test_offsets_keep_any_schedule_in_order(trigger: str, window_s: int, gaps: list[int]) -> None:
    """Whatever the gaps between instants (whole minutes or not), dispatch follows the instants."""
    instants = [0]
    for g in gaps:
        instants.append(instants[-1] + g * US)
    nexts = [*instants[1:], None]
    starts = []
    for u, v in zip(instants, nexts, strict=True):
        nb = dispatch_not_before_us(f"tr_{trigger}", u, window_s, v)
        starts.append(u if nb is None else nb)
        if nb is not None:
            cap = smear_cap_us(u, v)
            assert u <= nb < u + window_s * US
            assert cap is None or nb - u < cap
    assert all(a < b for a, b in pairwise(starts))


def test_uncapped_triggers_keep_the_offset_they_always_had() -> None:
    """A gap of at least twice the window changes nothing (decision 0067: the offset function stays)."""
    for i in range(200):
        t = f"tr_{i}"
        assert dispatch_not_before_us(t, 0, 10, 20 * US) == smear_offset_us(t, 10)
        assert dispatch_not_before_us(t, 0, 10, MINUTE_US) == dispatch_not_before_us(t, 0, 10)
        assert not is_capped(0, 10, 20 * US) and is_capped(0, 10, 19 * US)


def test_a_cron_with_seconds_gets_the_cap_of_its_own_gap() -> None:
    rec = compile_cron("0,3 * * * * *", "Europe/London")             # :00 and :03 of every minute
    u = to_us(ANCHOR)
    nxt = next_after(rec, ANCHOR)
    assert nxt is not None and to_us(nxt) == u + 3 * US
    nb = dispatch_not_before_us("tr_x", u, 10, to_us(nxt))
    assert nb is not None and nb - u < 1_500_000
