"""The dispatch plane's records: what a claim offers the shaper, what it answers, what a claim and
a settlement carry, and what a queue consumer receives. Pure values (no I/O); the store and the
dispatch plane meet here (``fireledger.store.dispatch``, ``fireledger.dispatch``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .keys import FireKey
from .model import AttemptResult, DispatchJob, Fire, FireState

ON_TIME = "on-time"


#: Outcomes a work outcome row may hold (no row = ``unknown``).
OUTCOMES = ("succeeded", "failed")


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of one attempt: its result and what becomes of the fire (``state`` ``pending`` with
    ``next_attempt_us``: a retry; any other state is terminal)."""

    job: DispatchJob
    result: AttemptResult
    http_status: int | None
    error: str | None
    state: FireState
    cause: str | None
    next_attempt_us: int | None


@dataclass(frozen=True, slots=True)
class ClaimSnapshot:
    """What a shaper decides from, read inside the claim transaction.

    ``candidates``: per lane, due fires in fair order (already locked on PostgreSQL);
    ``quotas``: tenant → (fires/s, in flight, catch-up fraction); ``inflight``: tenant → attempts
    in flight in every process; ``tats``: bucket key → state (see ``fireledger.dispatch.shaping``).
    """

    now_us: int
    candidates: Mapping[str, Sequence[Fire]]
    quotas: Mapping[str, tuple[float, int, float]]
    inflight: Mapping[str, int]
    tats: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ShapedDecision:
    """A shaper's answer: the fires to lease (each with its service class) and changed buckets."""

    admitted: Sequence[tuple[Fire, str]]
    tats: Mapping[str, int]
    wake_us: int | None = None
    waiting: Mapping[str, int] = field(default_factory=dict)


class Shaper(Protocol):
    def bucket_keys(self, candidates: Mapping[str, Sequence[Fire]]) -> list[str]:
        """Every rate bucket :meth:`decide` may read or charge, sorted."""
        ...

    def decide(self, snapshot: ClaimSnapshot) -> ShapedDecision:
        ...


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A leased fire and the class it was admitted as (``on-time``, ``over-quota``, …)."""

    job: DispatchJob
    admission: str


@dataclass
class RankCache:
    """The fair order of a large backlog, kept between claim rounds of one dispatcher (SQLite).

    Ranking a lane's whole backlog costs time proportional to the backlog (≈100 ms at 10,000 due
    fires on this machine class) while a round admits a few hundred, so a burst used to be ranked
    again for every round. With a cache, a lane is ranked ``depth`` fires deep and later rounds take
    the next candidates from that order (re-checked live and due inside the write transaction, as
    always) until fewer than a round's worth remain or the order is too old: older than
    ``max_age_us`` and than ``cost_factor`` times what the last ranking took. The cost is bounded
    staleness: a fire committed after the ranking — or a tenant whose quota freed up — is placed in
    the order at the next ranking, at most that age later (decision 0074).
    """

    max_age_us: int = 200_000
    depth: int = 4096
    #: The order may also be kept for this many times what ranking it cost, so ranking never takes
    #: more than about a tenth of the claim thread's time however large the backlog.
    cost_factor: int = 10
    lanes: dict[str, tuple[int, list[Fire]]] = field(default_factory=dict)   # lane → (ranked at, order)
    rankings: int = 0   # how many times a non-empty lane was ranked (observability and tests)
    last_cost_us: int = 0   # what the last ranking took (a cost measurement, not a time of day)

    def take(self, lane: str, now_us: int, limit: int) -> list[Fire] | None:
        """The next ``limit`` candidates of ``lane`` from a fresh enough order, else None (rank)."""
        entry = self.lanes.get(lane)
        age_limit = max(self.max_age_us, self.cost_factor * self.last_cost_us)
        if entry is None or now_us - entry[0] > age_limit or len(entry[1]) < limit:
            return None
        return entry[1][:limit]

    def keep(self, lane: str, now_us: int, ranked: list[Fire], cost_us: int = 0) -> None:
        self.lanes[lane] = (now_us, ranked)
        if ranked:
            self.rankings += 1
            self.last_cost_us = cost_us

    def settle(self, lane: str, offered: Sequence[Fire], gone: set[tuple[str, str, int, int]]) -> None:
        """Drop from the order the offered candidates that were leased or are no longer due; those
        left waiting by the shaper keep their place at the front."""
        entry = self.lanes.get(lane)
        if entry is None:
            return
        head = [f for f in offered if _pk(f) not in gone]
        self.lanes[lane] = (entry[0], head + entry[1][len(offered):])


@dataclass(frozen=True, slots=True)
class ClaimResult:
    jobs: list[ClaimedJob]
    wake_us: int | None
    waiting: Mapping[str, int]
    offered: Mapping[str, int]   # candidates offered to the shaper, per lane


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """A message handed to a queue consumer: its fire, the fire's payload (bytes as stored), how
    many times it has been handed out (this one included) and until when it stays hidden."""

    fire: Fire
    payload: bytes
    receives: int
    visible_until_us: int

    @property
    def key(self) -> FireKey:
        f = self.fire
        return FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)


def _pk(f: Fire) -> tuple[str, str, int, int]:
    return (f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)


__all__ = ["ON_TIME", "OUTCOMES", "ClaimResult", "ClaimSnapshot", "ClaimedJob", "QueueMessage", "RankCache",
           "Settlement", "ShapedDecision", "Shaper"]
