"""Lane due ages, the page, declared drains and the duplicate-delivery rate: pure values and rules
(decisions 0165–0167). The store reads the facts; these functions say what they mean.

* A lane's *due age* is how long its oldest fire never attempted has been dispatchable (from its
  dispatch time: the decision, or the jittered not-before). Retries are not counted (decision 0051).
* The *page* is the due age of instants the service owes on time: undecided due-index rows (the
  timing plane's stall) and the on-time lane. The catch-up and backfill lanes never page: they drain
  at their capped rates by design, and an outage's catch-up would otherwise page for its whole drain.
* A *drain* declared by an operator (``fireledger drain start --for 2h``) suppresses the page until
  it is stopped or expires, whichever is first.
* A *duplicate delivery* is a ``delivered`` attempt (the receiver answered 2xx) of a fire that had
  already been delivered by an earlier attempt: the receiver acknowledged the same key twice. A
  *possible* duplicate is an attempt made after an earlier attempt of the same fire that may have
  reached the receiver without the ledger learning its answer (result ``unknown``, or no result: its
  runner vanished), of a fire eventually delivered. Rates are per million delivered fires.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The shipped page's threshold (deploy/prometheus/alerts.yml ``FireledgerDueAgeHigh``), seconds.
PAGE_THRESHOLD_S = 60.0
#: The longest drain one declaration may hold (an operator re-declares to extend it).
MAX_DRAIN_S = 7 * 24 * 3600
#: Lanes whose due age pages (the others are recovery lanes, paced by design).
PAGING_LANES: tuple[str, ...] = ("on-time",)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")


@dataclass(frozen=True, slots=True)
class Drain:
    """A declared drain: in force from ``started_us`` until ``expires_us`` unless ``ended_us``
    (``drain stop``) came first."""

    id: str
    started_us: int
    expires_us: int
    reason: str
    actor: str
    ended_us: int | None = None
    ended_by: str | None = None

    def in_force(self, now_us: int) -> bool:
        """True while the drain suppresses the page at ``now_us``."""
        return self.ended_us is None and self.started_us <= now_us < self.expires_us

    def as_json(self, now_us: int) -> dict[str, object]:
        """The drain as an operator reads it (instants in µs, remaining seconds at ``now_us``)."""
        return {"id": self.id, "started_us": self.started_us, "expires_us": self.expires_us,
                "reason": self.reason, "actor": self.actor, "ended_us": self.ended_us,
                "ended_by": self.ended_by, "in_force": self.in_force(now_us),
                "remaining_s": max(0.0, (self.expires_us - now_us) / 1e6) if self.in_force(now_us) else 0.0}


@dataclass(frozen=True, slots=True)
class DeliveryCounts:
    """What the ledger holds about deliveries over a window: fires delivered, extra ``delivered``
    attempts of an already-delivered fire (proven duplicates), and attempts following an attempt
    whose answer the ledger never learned, of a fire eventually delivered (possible duplicates)."""

    delivered_fires: int
    duplicate_attempts: int
    possible_duplicate_attempts: int

    @property
    def duplicates_per_million(self) -> float | None:
        return per_million(self.duplicate_attempts, self.delivered_fires)

    @property
    def possible_per_million(self) -> float | None:
        return per_million(self.possible_duplicate_attempts, self.delivered_fires)


def per_million(extra: int, fires: int) -> float | None:
    """``extra`` per million ``fires`` (None without fires: no rate, rather than a made-up 0)."""
    if extra < 0 or fires < 0:
        raise ValueError("counts must be >= 0")
    return None if fires == 0 else extra * 1_000_000 / fires


def age_s(now_us: int, since_us: int | None) -> float:
    """Seconds from ``since_us`` to ``now_us`` (0 when nothing waits or it is not due yet)."""
    return 0.0 if since_us is None else max(0.0, (now_us - since_us) / 1e6)


def page_due_age_s(now_us: int, undecided_since_us: int | None, lane_since_us: dict[str, int]) -> float:
    """The due age the page looks at: the older of the oldest undecided due-index row and the
    oldest never-attempted fire of a paging lane (:data:`PAGING_LANES`)."""
    ages = [age_s(now_us, undecided_since_us)]
    ages += [age_s(now_us, lane_since_us.get(lane)) for lane in PAGING_LANES]
    return max(ages)


def page_firing(due_age_s: float, drain: Drain | None, now_us: int,
                threshold_s: float = PAGE_THRESHOLD_S) -> bool:
    """Whether the shipped page fires: the page's due age over ``threshold_s`` and no drain in force."""
    return due_age_s > threshold_s and not (drain is not None and drain.in_force(now_us))


def parse_duration_s(text: str) -> int:
    """``90s``, ``15m``, ``2h``, ``1d`` → seconds (> 0, at most :data:`MAX_DRAIN_S`); ``ValueError``
    naming the problem otherwise."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError("a duration is a whole number followed by s, m, h or d (e.g. 2h)")
    seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    if seconds > MAX_DRAIN_S:
        raise ValueError("must be at most 7d (declare again to extend)")
    return seconds


def validate_reason(reason: str) -> str:
    """The reason, stripped: 1–500 printable characters on one line (``ValueError`` otherwise)."""
    r = reason.strip()
    if not r:
        raise ValueError("must not be empty")
    if len(r) > 500:
        raise ValueError("must be at most 500 characters")
    if any(not ch.isprintable() for ch in r):
        raise ValueError("must be one line of printable characters")
    return r


__all__ = ["MAX_DRAIN_S", "PAGE_THRESHOLD_S", "PAGING_LANES", "DeliveryCounts", "Drain", "age_s", "page_due_age_s",
           "page_firing", "parse_duration_s", "per_million", "validate_reason"]
