"""Bounded-uncertainty time (DESIGN.md §1 "Where ε comes from, honestly").

``Clock.now()`` returns an :class:`Interval` ``(earliest, latest)`` in integer microseconds since the
epoch, with the source of its bound. The timing plane claims an instant only when it is ≤
``earliest``: deliberately ε late, never early.
"""

from .base import Clock, ClockReading, Interval
from .crosscheck import CrossCheckedClock
from .fake import FakeClock
from .system import SystemClock, kernel_error_bound

__all__ = ["Clock", "ClockReading", "CrossCheckedClock", "FakeClock", "Interval", "SystemClock", "kernel_error_bound"]
