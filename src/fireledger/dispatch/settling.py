"""From an attempt's result to the fire's next state, and the pieces of an attempt that need no I/O:
the body sent, the shaper a claim transaction calls. Pure functions (the runner,
:mod:`fireledger.dispatch.runner`, does the I/O).

Outcomes: 2xx ``delivered``; 408/429/5xx/connection errors (a request the receiver never got
included) retried with bounded, jittered backoff (truncated at the trigger's next instant) in the
fire's own lane; other 4xx/3xx ``failed`` with the status as cause; a timeout after the request may
have reached the receiver is attempt result ``unknown`` — retried under the same key while attempts
remain, and the fire ends ``unknown`` when they run out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from fireledger.definitions import next_us, recurrence_for
from fireledger.domain.dispatch_records import ClaimSnapshot, Settlement, ShapedDecision
from fireledger.domain.instants import after_us
from fireledger.domain.keys import from_us
from fireledger.domain.model import AttemptResult, DispatchJob, Fire, FireState, Lane
from fireledger.recurrence import RecurrenceError, format_duration, format_instant
from fireledger.store.engine import is_database_error

from . import shaping
from .http import HttpResult
from .lanes import DispatchConfig
from .retry import retry_plan

__all__ = ["age_origin_us", "dead_letter_body", "decode_payload", "dispatch_body", "settle", "settle_on_error",
           "time_to_next_s"]


def decode_payload(tenant_id: str, payload: bytes) -> Any:
    """The payload of a version as sent to a target (the one place the dispatch path reads it)."""
    return json.loads(payload) if payload else {}


_ENCODED: dict[bytes, str] = {}
_ENCODED_MAX = 4096
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _encoded_payload(tenant_id: str, payload: bytes) -> str:
    """The payload as it appears in a body: its JSON re-encoded compactly (the exact text
    ``json.dumps(decode_payload(...), separators=(",", ":"))`` gives), remembered by plaintext."""
    hit = _ENCODED.get(payload)
    if hit is None:
        hit = _dumps(decode_payload(tenant_id, payload))
        if len(_ENCODED) >= _ENCODED_MAX:
            _ENCODED.clear()
        _ENCODED[payload] = hit
    return hit


def dispatch_body(job: DispatchJob, key: str) -> bytes:
    """The JSON body of an HTTP dispatch (DESIGN.md §4): exactly the bytes of ``json.dumps`` of
    ``{fire_key, trigger_id, scheduled_instant, attempt, lane, kind, version, payload}`` in that
    order with separators ``(",", ":")``, assembled from the parts (the payload's encoding is
    remembered by plaintext, decision 0139). A dead letter's delivery record: :func:`dead_letter_body`."""
    if job.dead_letter is not None:
        return dead_letter_body(job, key)
    f = job.fire
    return (f'{{"fire_key":{_dumps(key)},"trigger_id":{_dumps(f.trigger_id)},'
            f'"scheduled_instant":{_dumps(format_instant(from_us(f.scheduled_us)))},"attempt":{int(job.attempt)},'
            f'"lane":{_dumps(str(f.lane))},"kind":{_dumps(str(f.kind))},"version":{int(f.version)},'
            f'"payload":{_encoded_payload(f.tenant_id, job.payload)}}}').encode()


def dead_letter_body(job: DispatchJob, key: str) -> bytes:
    """The body delivering a dead letter (decision 0178): the fields of a dispatch body for the
    delivery record itself (``fire_key`` is its own key, ``kind`` ``dead-letter``), then
    ``dead_letter`` — the dead fire's history record (key, state, cause, attempts with their results;
    :func:`fireledger.observe.records.fire_record`, never a payload) — then ``payload``: the trigger
    version's payload, the tenant's own data going to the tenant's own verified target, so the
    receiver can replay the work."""
    from fireledger.observe.records import fire_record

    f = job.fire
    assert job.dead_letter is not None
    return json.dumps({"fire_key": key, "trigger_id": f.trigger_id,
                       "scheduled_instant": format_instant(from_us(f.scheduled_us)), "attempt": int(job.attempt),
                       "lane": str(f.lane), "kind": str(f.kind), "version": int(f.version),
                       "dead_letter": fire_record(job.dead_letter),
                       "payload": decode_payload(f.tenant_id, job.payload)}, separators=(",", ":")).encode()


def settle(job: DispatchJob, res: HttpResult, now_us: int, jitter: float,
           until_next_s: float | None = None) -> Settlement:
    """Pure: from an attempt's result to the fire's next state (terminal, or pending + retry time).

    Retries follow the version's retry policy (``job.policies``: ``max_attempts``, ``min_backoff_s``
    doubling to ``max_backoff_s``, ``max_event_age_s``; decision 0147) and stop at the first bound
    reached, which the cause names: the attempts ("retries exhausted after N attempts"), the event age
    (no retry later than ``max_event_age_s`` after :func:`age_origin_us`) or ``until_next_s``, the
    time left before the trigger's next scheduled instant (always a hard bound: one fire's retries
    never overlap the next fire). Whatever the target answered, the retry instant is within
    ``RETRY_AFTER_MAX_S`` (or the backoff cap) of ``now_us`` and inside the representable range
    (:func:`fireledger.domain.instants.after_us`); a ``Retry-After`` that is not a finite number
    ``>= 0`` is ignored.
    """
    status = res.http_status
    if res.outcome == "delivered":
        return Settlement(job, AttemptResult.DELIVERED, status, None, FireState.DELIVERED, None, None)
    if res.outcome == "failed":
        cause = f"failed: HTTP {status} is final" if status else f"failed: {res.error}"
        return Settlement(job, AttemptResult.FAILED, status, res.error, FireState.FAILED, cause, None)
    ra = res.retry_after_s
    if ra is not None and not (isinstance(ra, int | float) and math.isfinite(ra) and ra >= 0):
        ra = None
    nxt = until_next_s if until_next_s is None or math.isfinite(until_next_s) else None
    p = job.policies
    made = job.attempt - job.fire.attempt_base     # attempts since the fire's latest redrive (decision 0148)
    delay = retry_plan(max(1, made), base_s=p.min_backoff_s, cap_s=p.max_backoff_s, max_attempts=p.max_attempts,
                       jitter=jitter, next_scheduled=None, retry_after_s=ra)
    bound = None if delay is not None else "attempts"
    if bound is None and nxt is not None and delay is not None and delay >= nxt:
        bound = "next instant"
    age_left = _age_left_s(job, now_us)
    if bound is None and age_left is not None and delay is not None and delay >= age_left:
        bound = "event age"
    if bound is None and delay is not None:
        return Settlement(job, AttemptResult(res.outcome), status, res.error, FireState.PENDING, None,
                          after_us(now_us, delay))
    ended = _ENDED[bound or "attempts"].format(n=job.attempt, age=_age_text(p.max_event_age_s))
    if res.outcome == "unknown":
        return Settlement(job, AttemptResult.UNKNOWN, status, res.error, FireState.UNKNOWN,
                          f"unknown: no answer within {p.timeout_s:g}s and " + _ENDED_UNKNOWN[bound or "attempts"]
                          .format(age=_age_text(p.max_event_age_s)), None)
    what = f"HTTP {status}" if status else (res.error or "no answer")
    return Settlement(job, AttemptResult(res.outcome), status, res.error, FireState.FAILED,
                      f"failed: {ended} (last: {what})", None)


def time_to_next_s(job: DispatchJob, now_us: int) -> float | None:
    """Seconds left for retries (None: unbounded by the schedule). An on-time fire retries until
    the trigger's next instant after it. A caught-up or backfilled fire's next instant has passed
    already, so it gets the same span — its period — counted from its first attempt (decision
    0032): retries are bounded the same way whatever lane the fire drains in. Not a dead letter's
    delivery record, whose retries follow only its own (default) retry policy."""
    f = job.fire
    try:
        rec = recurrence_for(f.trigger_id, f.version, job.schedule)
        nxt = next_us(rec, f.scheduled_us)
    except RecurrenceError:
        return None
    if nxt is None or f.kind == "dead-letter":   # a dead letter's delivery: the schedule does not bound it (0178)
        return None
    if f.redriven_us is not None or f.lane != Lane.ON_TIME.value:   # redriven: from the redrive (0148)
        nxt = age_origin_us(f) + (nxt - f.scheduled_us)
    return max(0.0, (nxt - now_us) / 1e6)


#: How a failed fire's cause names the bound that ended its retries (decision 0147).
_ENDED = {
    "attempts": "retries exhausted after {n} attempts",
    "next instant": "retries truncated at the trigger's next instant after {n} attempts",
    "event age": "retries ended by retry.max_event_age ({age}) after {n} attempts",
}
_ENDED_UNKNOWN = {
    "attempts": "no attempts left",
    "next instant": "no retry before the trigger's next instant",
    "event age": "no retry within retry.max_event_age ({age})",
}


def _age_text(seconds: int | None) -> str:
    return "none" if seconds is None else format_duration(timedelta(seconds=seconds))


def age_origin_us(fire: Fire) -> int:
    """The instant a fire's event age counts from: its latest redrive; else its first attempt for a
    caught-up or backfilled fire (its instant is past by design, decision 0032); else its instant."""
    if fire.redriven_us is not None:
        return fire.redriven_us
    if fire.lane != Lane.ON_TIME.value and fire.dispatched_us is not None:
        return fire.dispatched_us
    return fire.scheduled_us


def _age_left_s(job: DispatchJob, now_us: int) -> float | None:
    """Seconds left before the fire's event age reaches ``max_event_age_s`` (None: no age bound)."""
    age = job.policies.max_event_age_s
    if age is None:
        return None
    return max(0.0, (age_origin_us(job.fire) + age * 1_000_000 - now_us) / 1e6)


#: A store that failed while an attempt was being prepared (a failover, a lost connection): the fire
#: is tried again under the same key this long after the failure (issue 16).
STORE_RETRY_US = 1_000_000


def settle_on_error(job: DispatchJob, res: HttpResult | None, exc: BaseException,
                    now_us: int | None = None) -> Settlement:
    """The settlement of an attempt during which this process raised ``exc`` unexpectedly: never
    nothing (an attempt that settles nothing would be re-leased forever). The cause names the
    exception class only (its message may carry payload data). The fire ends ``unknown`` when the
    request may have reached the target (``res.sent``). Not sent because the *store* failed (a
    database error while the target was re-checked, e.g. during a PostgreSQL failover; ``now_us``
    given): a further attempt under the same key :data:`STORE_RETRY_US` later. Otherwise ``failed``:
    a bug or a broken part of this process is not something a retry can be expected to fix."""
    what = type(exc).__name__
    if res is not None and res.sent:
        return Settlement(job, AttemptResult.UNKNOWN, res.http_status, f"dispatch error: {what}", FireState.UNKNOWN,
                          f"unknown: the attempt was sent, then this process failed ({what})", None)
    if now_us is not None and is_database_error(exc):
        return Settlement(job, AttemptResult.RETRY, None, f"store error: {what}", FireState.PENDING, None,
                          now_us + STORE_RETRY_US)
    return Settlement(job, AttemptResult.FAILED, None, f"dispatch error: {what}", FireState.FAILED,
                      f"failed: not sent: the dispatch process failed preparing the attempt ({what})", None)


def _candidate(f: Fire) -> shaping.Candidate:
    return shaping.Candidate(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq, f.lane)


class _Shaper:
    """Adapts a claim transaction's snapshot to :func:`shaping.shape` (with this round's capacity)."""

    def __init__(self, config: DispatchConfig, capacity: shaping.Capacity) -> None:
        self.config = config
        self.capacity = capacity

    def bucket_keys(self, candidates: Mapping[str, Sequence[Fire]]) -> list[str]:
        return shaping.bucket_keys(candidates, self.config)   # the fires themselves: only tenant_id is read

    def decide(self, snapshot: ClaimSnapshot) -> ShapedDecision:
        by_key: dict[tuple[str, str, int, int], Fire] = {}
        cands: dict[str, list[shaping.Candidate]] = {}
        for lane, fires in snapshot.candidates.items():
            out = cands[lane] = []
            for f in fires:
                c = _candidate(f)
                by_key[c.key] = f
                out.append(c)
        quotas = {t: shaping.TenantQuota(*q) for t, q in snapshot.quotas.items()}
        plan = shaping.shape(snapshot.now_us, cands, quotas, snapshot.inflight, snapshot.tats, self.capacity,
                             self.config)
        return ShapedDecision([(by_key[c.key], a.value) for c, a in plan.admitted], plan.tats, plan.wake_us,
                              plan.waiting)
