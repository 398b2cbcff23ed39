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


__all__ = ["ON_TIME", "OUTCOMES", "ClaimResult", "ClaimSnapshot", "ClaimedJob", "QueueMessage",
           "Settlement", "ShapedDecision", "Shaper"]
