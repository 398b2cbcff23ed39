"""Lanes and their configuration: on-time, catch-up and backfill, each with its own drain rate and
concurrency (seed ADR-09; DESIGN.md invariant 8).

* ``rate`` (fires/s) is a *global* limit: it is enforced in the store, so every dispatch process
  sharing a database shares it. ``None`` means unlimited.
* ``concurrency`` is *per process*: the attempts this process keeps in flight in the lane (it bounds
  sockets and memory, which are per process).
* ``DispatchConfig.concurrency`` bounds the process's attempts over all lanes; when the lanes want
  more, the shaper sheds in the published order (backfill, catch-up, over-quota, on-time).

Configuration comes from the environment (``DispatchConfig.from_env``):

=====================================  ==========================================================
``FIRELEDGER_DISPATCH_CONCURRENCY``    attempts in flight in this process, all lanes (256)
``FIRELEDGER_LANE_ON_TIME``            ``rate=<fires/s|inf>,concurrency=<n>`` (rate=inf, 256)
``FIRELEDGER_LANE_CATCH_UP``           likewise (rate=200, concurrency=32)
``FIRELEDGER_LANE_BACKFILL``           likewise (rate=50, concurrency=16)
``FIRELEDGER_OVER_QUOTA_SHARE``        share of the on-time lane's concurrency that over-quota
                                       attempts may hold (0.5)
``FIRELEDGER_CONNECT_TIMEOUT_S``       seconds to establish a connection to a target and for its
                                       TCP to acknowledge a request (5; within the attempt's
                                       timeout: decision 0117)
=====================================  ==========================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fireledger.domain.model import Lane
from fireledger.errors import FireledgerError

if TYPE_CHECKING:
    from fireledger.settings import LaneOverride, Settings

__all__ = ["LANES", "ConfigError", "DispatchConfig", "LaneConfig", "parse_lane"]

#: The lanes in priority order (the shedding order is the reverse).
LANES: tuple[str, ...] = (Lane.ON_TIME.value, Lane.CATCH_UP.value, Lane.BACKFILL.value)


class ConfigError(FireledgerError, ValueError):
    """A dispatch setting is malformed; the message names the setting (one line, no traceback)."""


@dataclass(frozen=True, slots=True)
class LaneConfig:
    """One lane: ``rate`` fires/s over every dispatch process (None: unlimited) and
    ``concurrency`` attempts in flight in this process."""

    rate: float | None
    concurrency: int

    def __post_init__(self) -> None:
        if self.rate is not None and (not math.isfinite(self.rate) or self.rate <= 0):
            raise ConfigError("rate must be a positive number of fires per second (or inf)")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ConfigError("concurrency must be an integer >= 1")

    @property
    def burst(self) -> float:
        """Attempts the lane may start at once after idling: a tenth of a second of its rate."""
        return 1.0 if self.rate is None else max(1.0, self.rate / 10)


def _default_lanes() -> dict[str, LaneConfig]:
    return {
        Lane.ON_TIME.value: LaneConfig(None, 256),
        Lane.CATCH_UP.value: LaneConfig(200.0, 32),
        Lane.BACKFILL.value: LaneConfig(50.0, 16),
    }


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """Everything that shapes the dispatch plane's drain. See the module docstring.

    ``quota_burst_s``: a tenant may start ``quota_fires_per_s × quota_burst_s`` attempts at once
    (at least one) before the rest of its traffic counts as over quota. ``over_quota_debt_s``: how
    far past its quota a tenant's over-quota attempts may run its bucket (so it regains in-quota
    standing at most that long after its load stops). Recovery lanes (catch-up, backfill) have no
    burst: they are paced strictly at ``catchup_fraction × quota_fires_per_s``.
    """

    concurrency: int = 256
    lanes: Mapping[str, LaneConfig] = field(default_factory=_default_lanes)
    over_quota_share: float = 0.5
    quota_burst_s: float = 1.0
    over_quota_debt_s: float = 1.0
    batch: int = 512
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ConfigError("concurrency must be an integer >= 1")
        missing = [lane for lane in LANES if lane not in self.lanes]
        if missing:
            raise ConfigError(f"lanes: missing {', '.join(missing)}")
        if not 0 <= self.over_quota_share <= 1:
            raise ConfigError("over_quota_share must be between 0 and 1")
        if not self.quota_burst_s > 0 or not self.over_quota_debt_s >= 0:
            raise ConfigError("quota_burst_s must be > 0 and over_quota_debt_s >= 0")
        if self.batch < 1:
            raise ConfigError("batch must be >= 1")
        if not (math.isfinite(self.connect_timeout_s) and self.connect_timeout_s > 0):
            raise ConfigError("connect_timeout_s must be finite and > 0")

    def lane(self, name: str) -> LaneConfig:
        return self.lanes[name]

    @property
    def over_quota_slots(self) -> int:
        """Attempts over quota this process may hold at once (part of the on-time lane)."""
        return int(self.lanes[Lane.ON_TIME.value].concurrency * self.over_quota_share)

    def with_lane(self, name: str, **changes: float | int | None) -> DispatchConfig:
        """A copy with one lane changed (tests and embedding)."""
        lanes = dict(self.lanes)
        lanes[name] = replace(lanes[name], **changes)  # type: ignore[arg-type]
        return replace(self, lanes=lanes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DispatchConfig:
        """Read the dispatch ``FIRELEDGER_*`` settings from ``env`` (the process environment when
        None; see the module docstring); raises :class:`ConfigError` naming the variable."""
        from fireledger.settings import (
            parse_connect_timeout_s,
            parse_dispatch_concurrency,
            parse_lanes,
            parse_over_quota_share,
            process_env,
        )

        source = process_env() if env is None else env
        try:
            return cls.from_values(parse_dispatch_concurrency(source), parse_over_quota_share(source),
                                   parse_lanes(source), parse_connect_timeout_s(source))
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @classmethod
    def from_settings(cls, settings: Settings) -> DispatchConfig:
        """The configuration ``settings`` (read once by the entry point) describes."""
        return cls.from_values(settings.dispatch_concurrency, settings.over_quota_share, settings.lanes,
                               settings.connect_timeout_s)

    @classmethod
    def from_values(cls, concurrency: int | None, over_quota_share: float | None,
                    lanes: Mapping[str, LaneOverride], connect_timeout_s: float = 5.0) -> DispatchConfig:
        """The defaults with the given overrides (``None``/absent: the default)."""
        base = cls()
        merged = dict(base.lanes)
        for lane, (rate_given, rate, lane_concurrency) in lanes.items():
            old = merged[lane]
            merged[lane] = LaneConfig(rate if rate_given else old.rate,
                                      old.concurrency if lane_concurrency is None else lane_concurrency)
        return cls(concurrency=base.concurrency if concurrency is None else concurrency, lanes=merged,
                   over_quota_share=base.over_quota_share if over_quota_share is None else over_quota_share,
                   connect_timeout_s=connect_timeout_s)


def parse_lane(text: str, base: LaneConfig) -> LaneConfig:
    """``rate=<fires/s|inf>,concurrency=<n>`` (either part optional) over ``base``."""
    from fireledger.settings import parse_lane_text

    try:
        rate_given, rate, concurrency = parse_lane_text(text)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return LaneConfig(rate if rate_given else base.rate, base.concurrency if concurrency is None else concurrency)
