"""Jitter smearing is deterministic, bounded, never early, and flattens a top-of-minute burst."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from fireledger.domain.smearing import dispatch_not_before_us, is_popular, smear_offset_us

US = 1_000_000
MINUTE = 1_800_000_000 * US - (1_800_000_000 * US) % (60 * US)


@given(tid=st.text(min_size=1, max_size=40), window=st.integers(0, 3600))
def test_offset_is_deterministic_and_within_the_window(tid, window):
    a = smear_offset_us(tid, window)
    assert a == smear_offset_us(tid, window)
    assert 0 <= a < max(1, window * US)
    nb = dispatch_not_before_us(tid, MINUTE, window)
    assert nb is None if window == 0 else MINUTE <= nb < MINUTE + window * US


def test_opted_out_and_unpopular_instants_are_not_delayed():
    assert dispatch_not_before_us("tr_x", MINUTE, 0) is None
    assert not is_popular(MINUTE + 30 * US)
    assert dispatch_not_before_us("tr_x", MINUTE + 30 * US, 30) is None


def test_a_burst_is_flattened_across_the_window():
    offsets = [smear_offset_us(f"tr_{i:05d}", 10) // US for i in range(10_000)]
    per_second = Counter(offsets)
    assert set(per_second) == set(range(10))
    assert max(per_second.values()) < 10_000 / 10 * 1.15     # peak ≈ burst / window
