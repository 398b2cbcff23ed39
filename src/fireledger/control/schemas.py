"""Request and response shapes of the control API (they also document it at ``/openapi.json``).

Request bodies forbid unknown fields. A duration's form is a pattern declared and enforced here
(:mod:`.formats`); its bounds are declared (``x-fireledger-duration``) and checked with the schedule by
the definitions service, so every problem names its field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fireledger.registry.checks import _DURATIONS

from .formats import TARGET_KINDS, JsonInt, duration_field, schedule_schema, target_create_schema

MissedFire = Literal["fire-all", "fire-once-now", "skip"]
Overlap = Literal["allow", "skip", "queue"]

_SCHEDULE_DOC = (
    'One of {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"}, {"every": "90s"} or '
    '{"at": "2027-01-01T00:00:00Z"}, each with optional "not_before"/"not_after" (RFC 3339).'
)
_SCHEDULE_EXAMPLE = {"cron": "0 9 * * 1-5", "zone": "Europe/Paris"}
CATCHUP_DOC = "Duration, 0s to 24h, whole seconds."
OUTCOME_DOC = "Duration, 1s to 7d, whole seconds."
JITTER_DOC = ("Smearing window for fires on whole minutes (ADR-10): dispatch up to this long after the instant, "
              "at a fixed per-trigger offset. \"0s\" opts out. At most 1h, whole seconds.")
TIMEOUT_DOC = "Attempt timeout, 1s to 15m."


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _duration(field: str, default: str | None, description: str) -> Any:
    """A definition's duration field with the bounds the definitions service applies."""
    lo, hi, whole = _DURATIONS[field]
    return duration_field(default, description, lo, hi, whole_seconds=whole)


# --- targets ----------------------------------------------------------------------------------


class TargetCreate(_Body):
    """One of three shapes by ``kind`` (declared as ``oneOf``; the handler names the field)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=target_create_schema())

    kind: str = Field(description="'http' (an endpoint), 'queue' (a queue inside fireledger, pulled at "
                                  "/v1/queues/{id}) or 'internal' (a registered Python callable).",
                      examples=["http"], json_schema_extra={"enum": list(TARGET_KINDS)})
    url: str | None = Field(None, description="http: the https:// endpoint that receives signed POSTs.")
    name: str | None = Field(None, max_length=200, description="internal: the registered callable's name.")


class Verification(BaseModel):
    state: str
    token: str


class TargetView(BaseModel):
    id: str
    kind: str
    url: str | None
    verification: Verification
    created_at: str


class TargetCreated(TargetView):
    secret: str = Field(description="Standard Webhooks signing secret; shown only once.")


class TargetPage(BaseModel):
    items: list[TargetView]
    next: str | None


# --- triggers ---------------------------------------------------------------------------------


class RetryPolicy(_Body):
    """A trigger's retry policy (decision 0147). Retries stop at whichever bound comes first: the attempts,
    the event age, or the trigger's next instant (always: a fire never retries into the next one); the
    fire's cause names the bound. In an amendment, absent fields keep their value."""

    max_attempts: JsonInt = Field(8, ge=1, le=185,
                              description="Attempts in all, the first included (1 to 185).")
    min_backoff: str = _duration("retry.min_backoff", "1s",
                                 "First retry delay (doubling each retry, equal jitter), 1s to 1h.")
    max_backoff: str = _duration("retry.max_backoff", "5m", "Cap of the retry delay, 1s to 1h, at least min_backoff.")
    max_event_age: str | None = _duration(
        "retry.max_event_age", None,
        "No retry is made later than this after the fire's instant (after its first attempt for caught-up and "
        "backfilled fires, after the redrive for a redriven one), 1m to 24h, whole seconds. Null: no age bound.")


class RetryPatch(_Body):
    """Any subset of :class:`RetryPolicy`'s fields (absent: unchanged)."""

    max_attempts: JsonInt = Field(None, ge=1, le=185,  # type: ignore[assignment]
                              description="Attempts in all, the first included (1 to 185).")
    min_backoff: str = _duration("retry.min_backoff", None, "First retry delay, 1s to 1h.")
    max_backoff: str = _duration("retry.max_backoff", None, "Cap of the retry delay, 1s to 1h.")
    max_event_age: str | None = _duration("retry.max_event_age", None, "1m to 24h, whole seconds; null: no bound.")


class RetryView(BaseModel):
    max_attempts: int
    min_backoff: str
    max_backoff: str
    max_event_age: str | None


class TriggerCreate(_Body):
    name: str = Field(min_length=1, max_length=200)
    schedule: dict[str, Any] = Field(description=_SCHEDULE_DOC, examples=[_SCHEDULE_EXAMPLE],
                                     json_schema_extra=schedule_schema())
    target_id: str = Field(max_length=100)
    payload: dict[str, Any] = Field(default_factory=dict,
                                    description="JSON object sent with every fire (≤ 64 KiB encoded).")
    missed_fire_policy: MissedFire = "fire-once-now"
    catchup_horizon: str = _duration("catchup_horizon", "1h", CATCHUP_DOC)
    overlap_policy: Overlap = "allow"
    outcome_window: str = _duration("outcome_window", "1h", OUTCOME_DOC)
    jitter: str = _duration("jitter", "10s", JITTER_DOC)
    timeout: str = _duration("timeout", "30s", TIMEOUT_DOC)
    retry: RetryPolicy | None = Field(None, description="Retry policy; absent: 8 attempts, 1s doubling to 5m.")


class TriggerPatch(_Body):
    """Any subset of the create fields; absent fields keep their value. ``null`` is refused."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    name: str = Field(None, min_length=1, max_length=200)  # type: ignore[assignment]
    schedule: dict[str, Any] = Field(None, description=_SCHEDULE_DOC,  # type: ignore[arg-type]
                                     json_schema_extra=schedule_schema())
    target_id: str = Field(None, max_length=100)  # type: ignore[assignment]
    payload: dict[str, Any] = None  # type: ignore[assignment]
    missed_fire_policy: MissedFire = None  # type: ignore[assignment]
    catchup_horizon: str = _duration("catchup_horizon", None, CATCHUP_DOC)
    overlap_policy: Overlap = None  # type: ignore[assignment]
    outcome_window: str = _duration("outcome_window", None, OUTCOME_DOC)
    jitter: str = _duration("jitter", None, JITTER_DOC)
    timeout: str = _duration("timeout", None, TIMEOUT_DOC)
    retry: RetryPatch = Field(None, description="Any subset of the retry policy's fields.")  # type: ignore[assignment]


class TriggerView(BaseModel):
    id: str
    name: str
    state: str
    version: int
    schedule: dict[str, Any]
    target_id: str
    missed_fire_policy: str
    catchup_horizon: str
    overlap_policy: str
    outcome_window: str
    jitter: str
    timeout: str
    retry: RetryView
    next_instant: str | None
    pause_reason: str | None = Field(
        default=None,
        description="Why the timing plane paused this trigger (state 'paused'): its stored schedule no longer "
                    "compiles or could not be planned; its due instant is recorded as a failed fire with the "
                    "same cause. Null when paused by a principal or not paused. Cleared by resume.")
    tzdata_version: str
    created_at: str
    updated_at: str
    payload_digest: str | None = Field(
        default=None,
        description="Keyed digest of the stored payload ('hmac-sha256:…'), equal to the dry run's for an equal "
                    "payload (JSON value, key order aside): tells whether a payload is the stored one without "
                    "returning it. Null when the payload cannot be opened (the tenant's key destroyed).")


class TriggerPage(BaseModel):
    items: list[TriggerView]
    next: str | None


class PreviewItem(BaseModel):
    instant: str
    local: str | None = Field(description="Wall time in the schedule's zone (ISO 8601, no offset).")
    dst: Literal["gap", "fold"] | None = Field(
        description="'gap': the wall time does not exist, fires when the clock jumps; "
                    "'fold': it occurs twice, fires on the first occurrence.")


class Preview(BaseModel):
    items: list[PreviewItem]
    tzdata_version: str


# --- fires ------------------------------------------------------------------------------------


class AttemptView(BaseModel):
    attempt: int
    started_at: str
    finished_at: str | None
    result: str | None
    http_status: int | None
    error: str | None


class FireView(BaseModel):
    key: str
    trigger_id: str
    scheduled_instant: str
    decided_at: str
    dispatched_at: str | None
    finished_at: str | None
    state: str
    cause: str | None
    kind: str
    lane: str
    version: int
    tzdata_version: str
    decided_by: str
    eps_s: float | None = Field(
        default=None,
        description="The clock bound ε (seconds) in force when this fire was decided: true time was within "
                    "± ε of the decider's clock, and the fire was claimed only once its instant was ≤ the "
                    "clock's earliest bound (never early). Null for fires decided before it was recorded.")
    eps_source: str | None = Field(
        default=None,
        description="Who vouched for eps_s: 'kernel' (the kernel's synchronisation error bound), 'declared' "
                    "(FIRELEDGER_DECLARED_EPS_MS, the kernel reports no synchronisation), either suffixed "
                    "'+postgres' when cross-checked against the PostgreSQL server's clock.")
    redriven_at: str | None = Field(
        default=None, description="When this fire was last redriven (POST /v1/fires/{key}/redrive): the attempts "
                                  "after that instant are the redrive's. Null: never redriven.")
    attempts: list[AttemptView]


class FirePage(BaseModel):
    items: list[FireView]
    next: str | None


class Health(BaseModel):
    status: str


class ProblemField(BaseModel):
    field: str
    problem: str


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[ProblemField] | None = None
