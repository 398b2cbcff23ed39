"""``/v1/queues/{target_id}``: tenant-owned queues inside fireledger (targets of kind ``queue``).

A fire whose target is a queue is *delivered* when it is put on the queue (in the same transaction
as its attempt's settlement; the message key is the fire key, so a fire is on its queue at most
once). Consumers pull with a visibility timeout and ack by fire key; a message not acked before its
timeout is handed out again — at-least-once, like every delivery here, so consumers deduplicate on
the fire key (``receives`` counts the hand-outs).

=======================================  =========  ==================================================
``GET  /v1/queues/{id}``                 reader     depth: messages, visible now, oldest instant
``POST /v1/queues/{id}/pull``            consumer   ``{"max": 10, "visibility_timeout": "30s"}``
``POST /v1/queues/{id}/ack``             consumer   ``{"fire_keys": ["…", …]}``
=======================================  =========  ==================================================

A pulled message carries the same fields as an HTTP dispatch body (``fire_key``, ``trigger_id``,
``scheduled_instant``, ``attempt``, ``lane``, ``kind``, ``version``, ``payload``): consuming is
delivery, so it needs the ``consumer`` role — a grant that allows nothing else — or ``admin``
(decision 0176). Another tenant's queue, or a target that is not a queue, is "no such queue" (404).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from fireledger.domain.dispatch_records import QueueMessage
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import Principal, Target
from fireledger.recurrence import RecurrenceError, format_instant, parse_duration

from .auth import require, require_any
from .context import ApiContext, get_ctx
from .formats import FIRE_KEY_PATTERN, duration_field
from .problems import invalid, not_found
from .schemas import Problem
from .views import instant

router = APIRouter(prefix="/v1/queues", tags=["management"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 404: {"model": Problem},
                              422: {"model": Problem}})

MAX_PULL = 100
MAX_VISIBILITY = timedelta(hours=12)


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max: int = Field(10, ge=1, le=MAX_PULL, description="Messages to take at most.")
    visibility_timeout: str = duration_field("30s", "How long pulled messages stay hidden: 1s to 12h.",
                                             timedelta(seconds=1), MAX_VISIBILITY, whole_seconds=False)


class AckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fire_keys: list[Annotated[str, Field(pattern=FIRE_KEY_PATTERN)]] = Field(
        min_length=1, max_length=MAX_PULL, description="Keys of processed messages.")


class MessageBody(BaseModel):
    fire_key: str
    trigger_id: str
    scheduled_instant: str
    attempt: int
    lane: str
    kind: str
    version: int
    payload: Any = Field(description="The trigger's payload (null when it cannot be opened: see payload_error).")
    dead_letter: dict[str, Any] | None = Field(
        None, description="For kind dead-letter (decision 0178): the dead fire's history record (key, state, cause, "
                          "attempts); null otherwise.")


class MessageView(BaseModel):
    fire_key: str
    receives: int = Field(description="How many times this message has been handed out, this time included.")
    visible_until: str = Field(description="Ack before this instant, or the message is handed out again.")
    body: MessageBody
    payload_error: str | None = None


class PullView(BaseModel):
    messages: list[MessageView]


class AckView(BaseModel):
    acked: list[str]
    not_found: list[str] = Field(description="Keys not on this queue (already acked, or never on it).")


class QueueView(BaseModel):
    target_id: str
    messages: int
    visible: int = Field(description="Messages a pull would hand out now.")
    oldest_scheduled_instant: str | None


def _queue(ctx: ApiContext, principal: Principal, target_id: str) -> Target:
    t = ctx.store.registry.get_target(principal.tenant_id, target_id)
    if t is None or t.kind != "queue":
        raise not_found("queue")
    return t


def _message(ctx: ApiContext, m: QueueMessage) -> dict[str, Any]:
    from fireledger.dispatch.runner import decode_payload

    f = m.fire
    key = str(m.key)
    payload: Any = None
    error = None
    try:
        from fireledger.security.envelope import cipher_for

        plain = cipher_for(ctx.store).open(f.tenant_id, f.trigger_id, f.version, m.payload)
        payload = decode_payload(f.tenant_id, plain)
    except ValueError as exc:   # PayloadUnreadable (the tenant's key is gone), or not JSON
        error = str(exc) if type(exc).__name__ == "PayloadUnreadable" else "the payload could not be decoded"
    dead = None
    if f.kind == "dead-letter":   # a dead letter's delivery: its history rides along (decision 0178)
        from fireledger.domain.keys import dead_fire_key
        from fireledger.observe.records import fire_record

        found = ctx.store.history.get_fire(dead_fire_key(m.key))
        dead = None if found is None else fire_record(found)
    return {
        "fire_key": key, "receives": m.receives, "visible_until": instant(m.visible_until_us),
        "body": {"fire_key": key, "trigger_id": f.trigger_id,
                 "scheduled_instant": format_instant(from_us(f.scheduled_us)), "attempt": f.attempts,
                 "lane": f.lane, "kind": f.kind, "version": f.version, "payload": payload,
                 "dead_letter": dead},
        "payload_error": error,
    }


@router.get("/{target_id}", response_model=QueueView, summary="A queue's depth")
def queue_stats(target_id: str, principal: Principal = Depends(require("reader")),
                ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    t = _queue(ctx, principal, target_id)
    total, visible, oldest = ctx.store.dispatch.queue_stats(principal.tenant_id, t.id, ctx.now_us())
    return {"target_id": t.id, "messages": total, "visible": visible, "oldest_scheduled_instant": instant(oldest)}


@router.post("/{target_id}/pull", response_model=PullView,
             summary="Take up to `max` messages, hidden for `visibility_timeout` (ack them by fire key)")
def pull(target_id: str, body: PullRequest, principal: Principal = Depends(require_any("consumer", "admin")),
         ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    try:
        vis = parse_duration(body.visibility_timeout, "visibility_timeout", minimum=timedelta(seconds=1),
                             maximum=MAX_VISIBILITY)
    except RecurrenceError as exc:
        raise invalid([(exc.field, exc.problem)]) from None
    t = _queue(ctx, principal, target_id)
    got = ctx.store.dispatch.queue_pull(principal.tenant_id, t.id, ctx.now_us(), body.max,
                                        vis // timedelta(microseconds=1))
    return {"messages": [_message(ctx, m) for m in got]}


@router.post("/{target_id}/ack", response_model=AckView, summary="Remove processed messages, by fire key")
def ack(target_id: str, body: AckRequest, principal: Principal = Depends(require_any("consumer", "admin")),
        ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    keys: list[FireKey] = []
    errors = []
    for i, text in enumerate(body.fire_keys):
        try:
            keys.append(FireKey.parse(text))
        except ValueError:
            errors.append((f"fire_keys.{i}", "is not a fire key (tenant.trigger.YYYYMMDDTHHMMSSZ.seq)"))
    if errors:
        raise invalid(errors)
    t = _queue(ctx, principal, target_id)
    oks = ctx.store.dispatch.queue_ack(principal.tenant_id, t.id, keys)
    return {"acked": [str(k) for k, ok in zip(keys, oks, strict=True) if ok],
            "not_found": [str(k) for k, ok in zip(keys, oks, strict=True) if not ok]}


__all__ = ["router"]
