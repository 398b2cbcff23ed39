"""An adaptive connection limit for one origin: how many requests the dispatch plane keeps open to
one receiver at once (docs/decisions/0116-adaptive-origin-limits.md).

The receiver's capacity is found, not assumed (issue 15): the limit starts small, grows while the
receiver keeps up, and is halved when it shows it cannot take more. It is TCP's congestion window
applied to connections (additive increase, multiplicative decrease, with a slow start), plus
TCP Vegas' idea of reading queueing in the latency:

* **start** at ``initial`` (never above ``maximum``, the configured ``limit_per_host``);
* **grow** on each success that used the limit (at least half of it in flight when it started,
  as Netflix's concurrency-limits AIMD asks) and answered within the expected time: ``+1`` per
  success below ``threshold`` (slow start: the limit doubles per round trip), ``+1/limit`` above
  it (one per round trip);
  never above ``maximum``. "Within the expected time" is at most ``2 × baseline + slack``, the
  baseline being the shortest recent response time (it drifts up slowly, so a receiver whose
  normal answer is slow — 0.5 s — still lets the limit grow: only a response time that *grows*
  with the load holds it);
* **halve** on a drop: a connect that stalled or was refused, a request the receiver's TCP never
  acknowledged, a response timeout, a 429 or a 503; never below ``minimum``. One decrease per
  round of requests: a drop reported by a request that started before the last decrease is the
  same congestion already answered (TCP's "once per window") and changes nothing.

Pure logic, no clock and no I/O: the caller passes what happened; tests drive it directly.
"""

from __future__ import annotations

import math

__all__ = ["AdaptiveLimit"]

#: Response times up to ``LATENCY_FACTOR × baseline + LATENCY_SLACK_S`` count as keeping up.
LATENCY_FACTOR = 2.0
LATENCY_SLACK_S = 0.05
#: How fast the baseline follows response times longer than itself (per success): slow, so a
#: burst of queueing does not become the new normal, but a receiver that became slower for good is
#: not held forever.
BASELINE_DRIFT = 0.01


class AdaptiveLimit:
    """The limit of one origin. ``limit`` is a float; :attr:`allowed` is the whole number of
    requests that may be in flight. ``epoch`` changes at every decrease: take it when a request
    starts and give it back with the request's drop, so one congestion halves the limit once."""

    __slots__ = ("_limit", "baseline_s", "decreases", "epoch", "initial", "maximum", "minimum", "threshold")

    def __init__(self, *, maximum: int, initial: int = 4, minimum: int = 1) -> None:
        if minimum < 1 or maximum < minimum:
            raise ValueError("need 1 <= minimum <= maximum")
        self.maximum = maximum
        self.minimum = minimum
        self.initial = max(minimum, min(initial, maximum))
        self._limit = float(self.initial)
        self.threshold = float(maximum)   # slow start until the first decrease
        self.baseline_s = math.inf
        self.epoch = 0
        self.decreases = 0

    @property
    def limit(self) -> float:
        return self._limit

    @property
    def allowed(self) -> int:
        """Requests that may be in flight to the origin now."""
        return max(self.minimum, min(self.maximum, int(self._limit)))

    def keeps_up(self, latency_s: float) -> bool:
        """A response time that is within the expected time (see the module docstring)."""
        return latency_s <= LATENCY_FACTOR * self.baseline_s + LATENCY_SLACK_S

    def on_success(self, latency_s: float, inflight: int) -> None:
        """A response that is not a drop (any status but 429/503) after ``latency_s``, with
        ``inflight`` requests to the origin open when it started (itself included)."""
        if not math.isfinite(latency_s) or latency_s < 0:
            return
        fast = self.keeps_up(latency_s)
        if latency_s < self.baseline_s:
            self.baseline_s = latency_s
        else:
            self.baseline_s += (latency_s - self.baseline_s) * BASELINE_DRIFT
        if not fast or 2 * inflight < self._limit:
            return   # the receiver is queueing, or the limit was not what held the requests back
        step = 1.0 if self._limit < self.threshold else 1.0 / self._limit
        self._limit = min(float(self.maximum), self._limit + step)

    def on_drop(self, epoch: int) -> bool:
        """The receiver could not take a request that started in ``epoch``; returns whether the
        limit was decreased (only once per epoch)."""
        if epoch != self.epoch:
            return False
        self._limit = max(float(self.minimum), math.floor(self._limit / 2))
        self.threshold = self._limit
        self.epoch += 1
        self.decreases += 1
        return True
