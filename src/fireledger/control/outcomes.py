"""Work outcomes: ``POST /v1/fires/{key}/outcome`` (a signed callback) and ``GET`` to read it.

A target reports what became of the work a fire started — ``succeeded`` or ``failed`` — by POSTing
``{"fire_key": "<key>", "outcome": "succeeded"}`` to ``/v1/fires/{key}/outcome``, signed per Standard
Webhooks v1 with the secret of the target the fire was dispatched to (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``; :func:`callback` builds body and headers, or any
Standard Webhooks library). The signature *is* the authentication: no bearer token is needed (the
guard middleware lets exactly this route through), and it proves the sender holds that target's
secret, so one tenant can never report on another's fires. The body's ``fire_key`` (required, under
the signature) must equal the key in the path: a signed callback for one fire cannot be replayed
against another fire of the same target. Callbacks for a fire whose target or tenant was deleted
are refused (409).

Replay window: the ``webhook-timestamp`` must be within :data:`REPLAY_WINDOW_S` of the server's clock
(a stale callback is refused 401), and a ``webhook-id`` is accepted once per target within the window
(a replayed one is refused 409). The first reported outcome is final: repeating it is a harmless 200,
a different one is 409. No outcome row means ``unknown`` (seed ADR-12); the timing plane's overlap
check reads these rows.

``GET /v1/fires/{key}/outcome`` (role ``reader``, bearer token) answers ``succeeded``, ``failed``
or ``unknown``.

Answers: 201 recorded · 200 already recorded (same outcome) · 401 signature missing, wrong or
stale · 404 no such fire · 409 replayed ``webhook-id``, a different outcome already recorded, a
fire never dispatched, or its target or tenant deleted · 413 body over 64 KiB · 422 body not
``{"fire_key": <the path's key>, "outcome": "succeeded"|"failed"}`` (the detail names the field).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fireledger.dispatch.signing import SignatureError, verify
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Principal
from fireledger.security.envelope import PayloadUnreadable, open_secret
from fireledger.store import OutcomeRejected

from .auth import require
from .bodylimit import CALLBACK_BODY_BYTES
from .context import ApiContext, get_ctx
from .problems import ProblemError, conflict, invalid, not_found, validation_problem
from .schemas import Problem
from .views import instant

router = APIRouter(prefix="/v1/fires", tags=["history"],
                   responses={404: {"model": Problem}, 422: {"model": Problem}})

#: How far a callback's ``webhook-timestamp`` may be from the server's clock, both ways; also how
#: long a ``webhook-id`` is remembered.
REPLAY_WINDOW_S = 300
#: Largest callback body read (enforced by :mod:`fireledger.control.bodylimit`, the one body cap).
MAX_CALLBACK_BYTES = CALLBACK_BODY_BYTES
class OutcomeReport(BaseModel):
    """The callback body."""

    model_config = ConfigDict(extra="forbid")

    fire_key: str = Field(max_length=300, description="The fire this outcome is about: must equal the key in "
                                                       "the path (it is covered by the signature, which binds "
                                                       "the callback to this one fire).")
    outcome: Literal["succeeded", "failed"] = Field(description="What became of the work this fire started.")


class OutcomeView(BaseModel):
    key: str
    outcome: Literal["succeeded", "failed", "unknown"] = Field(
        description="'unknown': no outcome reported (yet).")
    reported_at: str | None


async def raw_body(request: Request) -> bytes:
    """The exact request bytes (the signature covers them). At most :data:`MAX_CALLBACK_BYTES`:
    :mod:`fireledger.control.bodylimit` refuses a longer body (413) before this route runs."""
    return await request.body()


def _key(text: str) -> FireKey:
    try:
        return FireKey.parse(text)
    except ValueError:
        raise not_found("fire") from None


def _report(body: bytes) -> OutcomeReport:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise invalid([("body", "is not valid JSON")], status=400) from None
    if not isinstance(doc, dict):
        raise invalid([("body", 'must be a JSON object: {"fire_key": …, "outcome": "succeeded" | "failed"}')])
    try:
        return OutcomeReport.model_validate(doc)
    except ValidationError as exc:
        raise validation_problem([{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]) from None


@router.post("/{key}/outcome", status_code=201, response_model=OutcomeView,
             responses={200: {"model": OutcomeView}, 401: {"model": Problem}, 409: {"model": Problem},
                        413: {"model": Problem}},
             openapi_extra={"requestBody": {
                 "required": True,
                 "description": "Signed per Standard Webhooks v1 with the secret of the fire's target "
                                "(webhook-id, webhook-timestamp, webhook-signature headers). fire_key must "
                                "equal the key in the path.",
                 "content": {"application/json": {"schema": OutcomeReport.model_json_schema()}}}},
             summary="Report a fire's work outcome (signed with the target's secret; no bearer token)")
def report_outcome(key: str, request: Request, response: Response, body: bytes = Depends(raw_body),
                   ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    fk = _key(key)
    found = ctx.store.dispatch.outcome_context(fk)
    if found is None:
        raise not_found("fire")
    fire, target = found
    now_us = ctx.clock.now().latest_us
    try:
        secret = open_secret(ctx.store, target)   # stored sealed under the tenant's data key
    except PayloadUnreadable:
        raise ProblemError(401, "the callback cannot be verified: the target's signing secret is no longer "
                                "readable (its tenant was deleted)", slug="unauthorized",
                           title="Unauthorized") from None
    try:
        verify(secret, request.headers, body, now=now_us / 1e6, tolerance_s=REPLAY_WINDOW_S)
    except SignatureError as exc:
        raise ProblemError(401, f"the callback signature does not verify: {exc.reason} (sign it with the "
                                "secret of the fire's target; timestamps must be within "
                                f"{REPLAY_WINDOW_S}s)", slug="unauthorized", title="Unauthorized") from None
    report = _report(body)
    try:
        bound = FireKey.parse(report.fire_key)
    except ValueError:
        bound = None
    if bound != fk:
        raise invalid([("fire_key", "must equal the fire key in the path (the signed body names the fire "
                                    "it reports on)")])
    gone = _deleted(ctx, fire.tenant_id, target.id)
    if gone is not None:
        raise conflict(f"{gone}: its outcomes are no longer accepted")
    if fire.dispatched_us is None:
        raise conflict(f"the fire is {fire.state} and was never dispatched: no work can have run")
    msg_id = request.headers.get("webhook-id", "")
    try:
        fresh = ctx.store.dispatch.record_outcome(fk, report.outcome, now_us, target_id=target.id, msg_id=msg_id[:200],
                                         replay_window_us=REPLAY_WINDOW_S * 1_000_000)
    except OutcomeRejected as exc:
        if exc.reason == "replayed":
            raise conflict("this webhook-id was already accepted: a replayed callback is refused") from None
        raise conflict(f"the outcome {exc.recorded!r} is already recorded for this fire; it is final") from None
    if not fresh:
        response.status_code = 200
    recorded = ctx.store.dispatch.get_outcome(fk)
    assert recorded is not None
    return {"key": str(fk), "outcome": recorded[0], "reported_at": instant(recorded[1])}


def _deleted(ctx: ApiContext, tenant_id: str, target_id: str) -> str | None:
    """What was deleted of a fire's tenant and target (the tenant first), or None."""
    tenant = ctx.store.registry.tenant_state(tenant_id)
    if tenant is None or tenant.get("deleted_us") is not None:
        return "the fire's tenant was deleted"
    trust = ctx.store.trust.target_trust(target_id)
    if trust is None or trust.deleted_us is not None:
        return f"the fire's target {target_id} was deleted"
    return None


def callback(secret: str, fire_key: str, outcome: str, *, msg_id: str, timestamp: int) -> tuple[bytes, dict[str, str]]:
    """``(body, headers)`` of an outcome callback for ``fire_key`` signed with the target's ``secret``
    (Standard Webhooks v1): POST them to ``/v1/fires/{fire_key}/outcome``."""
    from fireledger.dispatch.signing import build_headers

    body = json.dumps({"fire_key": fire_key, "outcome": outcome}, separators=(",", ":")).encode()
    return body, {**build_headers(secret, msg_id, timestamp, body), "content-type": "application/json"}


@router.get("/{key}/outcome", response_model=OutcomeView, responses={401: {"model": Problem}},
            summary="A fire's work outcome: succeeded, failed, or unknown (none reported)")
def get_outcome(key: str, principal: Principal = Depends(require("reader")),
                ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    fk = _key(key)
    if fk.tenant_id != principal.tenant_id or ctx.store.history.get_fire(fk) is None:
        raise not_found("fire")
    recorded = ctx.store.dispatch.get_outcome(fk)
    if recorded is None:
        return {"key": str(fk), "outcome": "unknown", "reported_at": None}
    return {"key": str(fk), "outcome": recorded[0], "reported_at": instant(recorded[1])}


__all__ = ["MAX_CALLBACK_BYTES", "REPLAY_WINDOW_S", "callback", "router"]
