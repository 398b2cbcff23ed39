"""Domain records shared by the store, the planes and the API.

Instants are integer microseconds since the Unix epoch (``*_us``) inside the store and on the fire
path, and aware UTC datetimes at the edges; :mod:`fireledger.domain.keys` converts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class TriggerState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DELETED = "deleted"


class MissedFirePolicy(StrEnum):
    FIRE_ALL = "fire-all"
    FIRE_ONCE_NOW = "fire-once-now"
    SKIP = "skip"


class OverlapPolicy(StrEnum):
    ALLOW = "allow"
    SKIP = "skip"
    QUEUE = "queue"


class FireKind(StrEnum):
    SCHEDULED = "scheduled"
    CATCH_UP = "catch-up"
    BACKFILL = "backfill"
    MANUAL = "manual"


class Lane(StrEnum):
    ON_TIME = "on-time"
    CATCH_UP = "catch-up"
    BACKFILL = "backfill"


class FireState(StrEnum):
    """Life of a fire record. ``pending``/``dispatching``/``held`` are live; the rest are terminal."""

    PENDING = "pending"          # committed, waiting for (another) attempt
    DISPATCHING = "dispatching"  # an attempt runner holds it
    DELIVERED = "delivered"      # a 2xx was received
    FAILED = "failed"            # final refusal (4xx) or retries exhausted
    UNKNOWN = "unknown"          # sent, no answer by the deadline and no retry left
    EXPIRED = "expired"          # older than the catch-up horizon: never dispatched
    SKIPPED = "skipped"          # withheld by a policy: never dispatched
    HELD = "held"                # committed, withheld by overlap policy queue until released


TERMINAL_STATES = frozenset(
    {FireState.DELIVERED, FireState.FAILED, FireState.UNKNOWN, FireState.EXPIRED, FireState.SKIPPED}
)


class TargetKind(StrEnum):
    HTTP = "http"          # an endpoint that receives signed POSTs
    QUEUE = "queue"        # a tenant-owned queue inside fireledger, pulled at /v1/queues
    INTERNAL = "internal"  # a registered Python callable


class VerificationState(StrEnum):
    """A target's ownership verification (an ``http`` target starts ``unverified``)."""

    UNVERIFIED = "unverified"
    VERIFIED = "verified"
    FAILED = "failed"
    #: Was verified; the verification reached its expiry without being renewed (decision 0171).
    LAPSED = "lapsed"


class AttemptResult(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Policies:
    """A trigger version's declared policies, with the seed's defaults."""

    missed_fire: MissedFirePolicy = MissedFirePolicy.FIRE_ONCE_NOW
    catchup_horizon_s: int = 3600
    overlap: OverlapPolicy = OverlapPolicy.ALLOW
    outcome_window_s: int = 3600
    jitter_s: int = 0
    timeout_s: float = 30.0
    #: The retry policy (``retry`` in the API, decision 0147): attempts in all (1–185), the backoff's
    #: first step and cap (equal jitter between half and all of the step), and the longest a fire may
    #: keep retrying after its instant (None: no bound but the attempts and the next instant).
    max_attempts: int = 8
    min_backoff_s: float = 1.0
    max_backoff_s: float = 300.0
    max_event_age_s: int | None = None


@dataclass(frozen=True, slots=True)
class TriggerVersion:
    """An immutable definition version. ``schedule`` is the API's schedule object, normalised."""

    trigger_id: str
    version: int
    tenant_id: str
    schedule: dict[str, Any]
    target_id: str
    payload: bytes
    policies: Policies
    tzdata_version: str
    created_us: int


@dataclass(frozen=True, slots=True)
class Trigger:
    id: str
    tenant_id: str
    name: str
    state: TriggerState
    current_version: int
    partition: int
    created_us: int
    updated_us: int
    next_us: int | None = None          # from the due index (None: nothing due / paused)
    pause_reason: str | None = None     # why the timing plane paused it (None: paused by a principal)


@dataclass(frozen=True, slots=True)
class Target:
    id: str
    tenant_id: str
    kind: TargetKind
    url: str | None
    secret: str
    verification_state: VerificationState
    verification_token: str
    created_us: int


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    name: str
    created_us: int


@dataclass(frozen=True, slots=True)
class Principal:
    id: str
    tenant_id: str
    name: str
    roles: frozenset[str]
    created_us: int
    revoked_us: int | None = None


@dataclass(frozen=True, slots=True)
class DueRow:
    """One row of the due index: the single next instant of a live trigger."""

    trigger_id: str
    tenant_id: str
    partition: int
    next_us: int
    version: int


@dataclass(frozen=True, slots=True)
class NewFire:
    """A fire the timing plane has decided; inserted with the due-row advance in one transaction."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int
    version: int
    kind: FireKind
    lane: Lane
    state: FireState
    decided_us: int
    tzdata_version: str
    decided_by: str
    cause: str | None = None
    not_before_us: int | None = None   # earliest dispatch (jitter smearing); None = at once
    eps_us: int | None = None          # the clock bound ε in force at the decision (invariant 18)
    eps_source: str | None = None      # who vouched for it: kernel, declared, kernel+postgres, …


@dataclass(frozen=True, slots=True)
class Advance:
    """Compare-and-set of one due row: from (expected_next_us, expected_version) to new_next_us.

    ``new_next_us`` None removes the row (the recurrence is exhausted).
    """

    trigger_id: str
    expected_next_us: int
    expected_version: int
    new_next_us: int | None
    new_version: int


@dataclass(frozen=True, slots=True)
class FireUpdate:
    """A compare-and-set state change of an existing fire (overlap policy ``queue``): a held fire
    superseded (``held`` → ``skipped``) or released (``held`` → ``pending``). ``at_us`` is the
    decision instant: the finish time of a terminal state, the first dispatch time of ``pending``."""

    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int
    expected_state: FireState
    new_state: FireState
    cause: str
    at_us: int


@dataclass(frozen=True, slots=True)
class Decision:
    """What the timing plane commits for one due row: the fires and the advance, atomically
    (``updates``: changes of existing fires committed with it, only when the advance succeeds)."""

    advance: Advance
    fires: tuple[NewFire, ...] = ()
    updates: tuple[FireUpdate, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """Result of applying one Decision: ``advanced`` False means the CAS found the row moved
    (decided elsewhere — normal); ``inserted`` lists the fires this call created (a primary-key
    conflict is not an error: that fire was decided elsewhere)."""

    trigger_id: str
    advanced: bool
    inserted: tuple[NewFire, ...] = ()


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int
    started_us: int
    finished_us: int | None
    result: AttemptResult | None
    http_status: int | None
    error: str | None
    node: str


@dataclass(frozen=True, slots=True)
class Fire:
    tenant_id: str
    trigger_id: str
    scheduled_us: int
    seq: int
    version: int
    kind: FireKind
    lane: Lane
    state: FireState
    cause: str | None
    decided_us: int
    decided_by: str
    dispatched_us: int | None
    finished_us: int | None
    tzdata_version: str
    attempts: int
    next_attempt_us: int | None
    eps_us: int | None = None           # ε at the decision and its source (None: not recorded)
    eps_source: str | None = None
    attempt_list: tuple[Attempt, ...] = field(default=())
    #: A redriven fire (decision 0148): the attempts made before its latest redrive (its retry policy
    #: counts the attempts after them) and when that redrive was made (None: never redriven).
    attempt_base: int = 0
    redriven_us: int | None = None


@dataclass(frozen=True, slots=True)
class DispatchJob:
    """A fire leased to an attempt runner, with what it needs to make one attempt."""

    fire: Fire
    attempt: int
    target: Target
    payload: bytes
    policies: Policies
    lease_owner: str
    lease_expires_us: int
    schedule: dict[str, Any] = field(default_factory=dict)
    #: Set by the trust gate (``fireledger.security.targets.admit``) for a plain-http target with a
    #: host name: the only addresses the attempt may connect to (those its ownership was verified at).
    pinned_addresses: frozenset[str] | None = None
