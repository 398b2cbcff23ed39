"""retry_plan: a pure retry schedule, truncated at the trigger's next instant."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fireledger.dispatch.retry import RETRY_AFTER_MAX_S, retry_plan


def plan(attempt: int, **kw: object) -> float | None:
    args: dict[str, object] = {"jitter": 0.0, "next_scheduled": None, "retry_after_s": None}
    args.update(kw)
    return retry_plan(attempt, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attempt", "kw", "expected"),
    [
        # jitter 0 -> half the step; jitter -> 1 approaches the full step
        (1, {}, 0.5),
        (2, {}, 1.0),
        (3, {}, 2.0),
        (7, {}, 32.0),
        (1, {"jitter": 0.5}, 0.75),
        (4, {"jitter": 0.5}, 6.0),
        (1, {"jitter": 0.999}, 0.9995),
        # the cap applies to the step before jitter
        (7, {"max_attempts": 20, "cap_s": 40.0}, 20.0),
        (15, {"max_attempts": 20, "cap_s": 40.0, "jitter": 0.5}, 30.0),
        (19, {"max_attempts": 20}, 150.0),
        # custom base/factor
        (3, {"base_s": 0.1, "factor": 3.0}, 0.45),
        (5, {"base_s": 2.0, "factor": 1.0}, 1.0),
        # max attempts: attempt N of N was the last one
        (8, {}, None),
        (9, {}, None),
        (1, {"max_attempts": 1}, None),
        (2, {"max_attempts": 3}, 1.0),
        (3, {"max_attempts": 3}, None),
        # Retry-After raises the delay, even above the cap
        (1, {"retry_after_s": 3.0}, 3.0),
        (3, {"retry_after_s": 1.0}, 2.0),
        (1, {"retry_after_s": 1000.0}, 1000.0),
        (1, {"retry_after_s": 1e13}, 3600.0),   # capped at RETRY_AFTER_MAX_S (decision 0082)
        (1, {"retry_after_s": 0.0}, 0.5),
        # truncated at the next instant: reaching it is already too late
        (3, {"next_scheduled": 2.0}, None),
        (3, {"next_scheduled": 2.0001}, 2.0),
        (1, {"next_scheduled": 0.0}, None),
        (1, {"next_scheduled": -5.0}, None),
        (1, {"next_scheduled": 10.0, "retry_after_s": 10.0}, None),
        (1, {"next_scheduled": 10.0, "retry_after_s": 9.0}, 9.0),
        (1, {"next_scheduled": 60.0}, 0.5),
        # a huge attempt count does not overflow
        (5000, {"max_attempts": 10_000}, 150.0),
    ],
)
def test_table(attempt: int, kw: dict[str, object], expected: float | None) -> None:
    got = plan(attempt, **kw)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attempt", "kw"),
    [
        (0, {}),
        (-1, {}),
        (True, {}),
        (1, {"jitter": 1.0}),
        (1, {"jitter": -0.1}),
        (1, {"jitter": math.nan}),
        (1, {"base_s": 0.0}),
        (1, {"factor": 0.5}),
        (1, {"cap_s": 0.0}),
        (1, {"max_attempts": 0}),
        (1, {"retry_after_s": -1.0}),
        (1, {"retry_after_s": math.inf}),
        (1, {"next_scheduled": math.nan}),
    ],
)
def test_invalid_input(attempt: int, kw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        plan(attempt, **kw)


jitters = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
positive = st.floats(min_value=1e-3, max_value=1e4)


@given(
    jitter=jitters,
    base=positive,
    factor=st.floats(min_value=1.0, max_value=10.0),
    cap=positive,
    max_attempts=st.integers(min_value=1, max_value=60),
    retry_after=st.none() | st.floats(min_value=0.0, max_value=1e5),
    next_scheduled=st.none() | st.floats(min_value=-10.0, max_value=1e5),
)
def test_properties(
    jitter: float,
    base: float,
    factor: float,
    cap: float,
    max_attempts: int,
    retry_after: float | None,
    next_scheduled: float | None,
) -> None:
    delays = [
        retry_plan(
            a,
            base_s=base,
            factor=factor,
            cap_s=cap,
            max_attempts=max_attempts,
            jitter=jitter,
            next_scheduled=next_scheduled,
            retry_after_s=retry_after,
        )
        for a in range(1, max_attempts + 3)
    ]
    # no attempt is planned at or beyond max_attempts
    assert all(d is None for d in delays[max_attempts - 1 :])
    seen_none = False
    prev = 0.0
    for d in delays:
        if d is None:
            seen_none = True
            continue
        assert not seen_none, "once exhausted, a plan never comes back"
        assert math.isfinite(d)
        assert d >= 0
        assert d >= prev, "non-decreasing in attempt for a fixed jitter"
        prev = d
        if retry_after is None:
            assert d <= cap
        else:   # Retry-After is honoured up to RETRY_AFTER_MAX_S (decision 0082)
            assert d >= min(retry_after, RETRY_AFTER_MAX_S)
            assert d <= max(cap, min(retry_after, RETRY_AFTER_MAX_S))
        if next_scheduled is not None:
            assert d < next_scheduled, "never at or past the next scheduled instant"


@given(attempt=st.integers(min_value=1, max_value=7), j1=jitters, j2=jitters)
def test_more_jitter_never_shortens(attempt: int, j1: float, j2: float) -> None:
    lo, hi = sorted((j1, j2))
    a = plan(attempt, jitter=lo)
    b = plan(attempt, jitter=hi)
    assert a is not None and b is not None
    assert a <= b
    step = min(300.0, 2.0 ** (attempt - 1))
    assert step / 2 <= a <= step
