"""Retry schedule for dispatch attempts: a pure function, no clock, no randomness.

The caller supplies the jitter draw and the time left until the trigger's next scheduled instant,
so the same inputs always give the same answer and the schedule can be tested exhaustively.
"""

from __future__ import annotations

import math

__all__ = ["RETRY_AFTER_MAX_S", "retry_plan"]

#: The longest wait a target's ``Retry-After`` can ask for (1 h). A longer one (in either form, delta
#: seconds or HTTP-date) is honoured up to this; the attempt budget still bounds the retries. No
#: input from a target may push an instant past what the store can hold (decision 0082).
RETRY_AFTER_MAX_S = 3600.0


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number")
    return float(value)


def retry_plan(
    attempt: int,
    *,
    base_s: float = 1.0,
    factor: float = 2.0,
    cap_s: float = 300.0,
    max_attempts: int = 8,
    jitter: float,
    next_scheduled: float | None,
    retry_after_s: float | None,
    retry_after_max_s: float = RETRY_AFTER_MAX_S,
) -> float | None:
    """Return the delay in seconds before the next attempt, or ``None`` for "make no further attempt".

    ``attempt`` is the 1-based number of the attempt that just ended (so ``attempt=1`` plans the
    first retry). The delay is

        ``min(cap_s, base_s * factor ** (attempt - 1)) * (0.5 + jitter / 2)``

    ("equal jitter": between half and all of the capped exponential step), then raised to at
    least ``retry_after_s`` when the target sent one (``Retry-After`` may exceed ``cap_s``), itself
    capped at ``retry_after_max_s`` (an absurd ``Retry-After`` waits that long, no longer).

    ``None`` is returned when ``attempt >= max_attempts``, or when ``next_scheduled`` (seconds
    from now until the trigger's next scheduled instant) is given and the delay would reach or
    pass it: retries are truncated at the next instant, so a fire never retries into the next
    one.

    Guarantees, for valid input: the result is ``None`` or a finite float ``>= 0``; for a fixed
    ``jitter`` it is non-decreasing in ``attempt`` (until it becomes ``None``); without
    ``retry_after_s`` it is at most ``cap_s``, with it at most ``max(cap_s, retry_after_max_s)``;
    it is always strictly less than
    ``next_scheduled`` when that is given.

    Raises ``ValueError`` for: ``attempt < 1``, ``max_attempts < 1``, ``base_s <= 0``,
    ``factor < 1``, ``cap_s <= 0``, ``retry_after_max_s <= 0``, ``jitter`` outside ``[0, 1)``,
    non-finite numbers, or a negative ``retry_after_s``.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError("attempt must be an int >= 1")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError("max_attempts must be an int >= 1")
    base = _finite("base_s", base_s)
    fac = _finite("factor", factor)
    cap = _finite("cap_s", cap_s)
    jit = _finite("jitter", jitter)
    if base <= 0:
        raise ValueError("base_s must be > 0")
    if fac < 1:
        raise ValueError("factor must be >= 1")
    if cap <= 0:
        raise ValueError("cap_s must be > 0")
    if not 0 <= jit < 1:
        raise ValueError("jitter must be in [0, 1)")
    nxt = None if next_scheduled is None else _finite("next_scheduled", next_scheduled)
    after = None if retry_after_s is None else _finite("retry_after_s", retry_after_s)
    if after is not None and after < 0:
        raise ValueError("retry_after_s must be >= 0")
    after_max = _finite("retry_after_max_s", retry_after_max_s)
    if after_max <= 0:
        raise ValueError("retry_after_max_s must be > 0")

    if attempt >= max_attempts:
        return None
    try:
        step = base * fac ** (attempt - 1)
    except OverflowError:
        step = math.inf
    delay = min(cap, step) * (0.5 + jit / 2)
    if after is not None:
        delay = max(delay, min(after, after_max))
    if nxt is not None and delay >= nxt:
        return None
    return delay
