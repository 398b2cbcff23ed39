"""The Clock protocol and its reading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Interval:
    """True time lies in ``[earliest_us, latest_us]``; ``source`` says who vouches for the bound."""

    earliest_us: int
    latest_us: int
    source: str

    @property
    def eps_us(self) -> int:
        """Half the width: the ε recorded on fires and exported as a metric."""
        return (self.latest_us - self.earliest_us + 1) // 2

    @property
    def mid_us(self) -> int:
        return (self.earliest_us + self.latest_us) // 2


ClockReading = Interval


class Clock(Protocol):
    """Injected time. Nothing on the fire path reads ``time.time()`` directly."""

    def now(self) -> Interval:
        """The current uncertainty interval."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (for sleeping and durations only, never for instants)."""
        ...
