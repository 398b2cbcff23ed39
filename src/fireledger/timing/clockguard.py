"""A guard against the wall clock being stepped while the timing plane runs.

The PostgreSQL cross-check (:class:`fireledger.clock.CrossCheckedClock`) re-measures the server
offset every few seconds and extrapolates in between *with the local wall clock*. A step of the
local clock between two probes therefore moves the corrected interval with it: a clock stepped
forward by 2 s would make ``earliest`` 2 s early until the next probe (falsification scenario
``timing-clock-step`` caught exactly this).

:class:`StepGuardClock` watches the wall clock against the monotonic clock (a step moves only the
former). When they disagree by more than slewing can explain, it widens the interval by the size of
the step on both sides — the node then reads an uncertainty it cannot justify and sheds — and keeps
it widened until the base clock has re-measured after the step (a probe newer than the step), or for
``hold_s`` when the base clock has no probe (SQLite: one process, one clock; after the hold the
stepped clock is the only clock there is).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from fireledger.clock import Clock, Interval

log = logging.getLogger("fireledger.timing.clock")

#: A disagreement between wall and monotonic clocks larger than this (plus the slew allowance) is a step.
STEP_TOLERANCE_US = 5_000
#: Frequency error the kernel may apply while slewing (500 ppm is the NTP maximum).
SLEW_PPM = 500


class StepGuardClock:
    """Wraps a :class:`~fireledger.clock.Clock`; see the module docstring."""

    def __init__(self, base: Clock, *, hold_s: float = 10.0, tolerance_us: int = STEP_TOLERANCE_US,
                 wall_ns: Callable[[], int] = time.time_ns, mono_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.base = base
        self.hold_s = hold_s
        self.tolerance_us = tolerance_us
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._lock = threading.Lock()
        self._last: tuple[int, int] | None = None   # (wall µs, mono µs) of the previous reading
        self._widen_us = 0
        self._step_mono: float | None = None        # monotonic seconds of the last step seen
        self.steps = 0

    def _probe_after(self, at_mono: float) -> bool:
        probe = getattr(self.base, "probe", None)
        return probe is not None and getattr(probe, "at_mono", 0.0) > at_mono

    def now(self) -> Interval:
        iv = self.base.now()
        wall = self._wall_ns() // 1000
        mono = self._mono_ns() // 1000
        with self._lock:
            if self._last is not None:
                d_wall = wall - self._last[0]
                d_mono = mono - self._last[1]
                step = d_wall - d_mono
                if abs(step) > self.tolerance_us + abs(d_mono) * SLEW_PPM // 1_000_000:
                    self.steps += 1
                    self._widen_us = max(self._widen_us, abs(step))
                    self._step_mono = mono / 1e6
                    log.warning("the wall clock stepped by %+.3f s against the monotonic clock: widening "
                                "the uncertainty by %.3f s until the clock is re-checked", step / 1e6,
                                self._widen_us / 1e6)
            self._last = (wall, mono)
            if self._step_mono is not None:
                has_probe = hasattr(self.base, "probe")
                rechecked = self._probe_after(self._step_mono) if has_probe else False
                if rechecked or mono / 1e6 - self._step_mono > (self.hold_s if not has_probe else 3 * self.hold_s):
                    self._widen_us, self._step_mono = 0, None
            widen = self._widen_us
        if not widen:
            return iv
        return Interval(iv.earliest_us - widen, iv.latest_us + widen, f"{iv.source}+step")

    def monotonic(self) -> float:
        return self.base.monotonic()

    def __getattr__(self, name: str) -> object:
        # Anything else (the cross-check's probe, a system clock's source) reads through.
        if name in ("base", "__setstate__"):
            raise AttributeError(name)
        return getattr(self.base, name)
