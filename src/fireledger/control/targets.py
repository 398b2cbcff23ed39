"""``/v1/targets``: where fires are delivered. A target is a privilege (invariant 12, seed ADR-14).

A new ``http`` target is ``unverified``: no trigger may point at it until its origin proves
ownership — serve the target's ``verification.response`` (the exact body; it is not derivable from
the request) at ``verification.challenge_path`` = ``/.well-known/fireledger-verification/<token>`` on
the target's origin, then ``POST /v1/targets/{id}/verify`` (see :mod:`fireledger.security.targets`).
Instead of the challenge path, an ``https`` target may publish the response as the TXT record
``verification.dns_name`` and verify with ``{"method": "dns"}`` (:mod:`fireledger.security.dnsverify`).
Verification lasts 30 days (``verification.expires_at``); the control plane renews it automatically
during its last 7 days (``verification.renews_from``, :mod:`fireledger.reverify`), and a verification
not renewed by its expiry becomes ``lapsed``. A failed or lapsed verification is also checked by the
attempt runner, which then does not call the target (the fire is recorded ``failed`` with the cause).
A plain-http target with a host name is pinned to the addresses that answered its challenge (0089).
The URL must be ``https`` unless the operator allows private targets.

Creating, verifying and deleting a target need the ``admin`` role and are audited.
"""

from __future__ import annotations

import base64
import secrets
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from fireledger.dispatch.internal import PREFIX as INTERNAL_PREFIX
from fireledger.dispatch.internal import name_problem
from fireledger.domain.keys import new_id
from fireledger.domain.model import Principal, Target, TargetKind, VerificationState
from fireledger.domain.trust_records import TargetTrust
from fireledger.security.egress import EgressPolicy
from fireledger.security.envelope import sealed_target
from fireledger.security.limits import max_targets_per_tenant
from fireledger.security.targets import WELL_KNOWN, forget_cached, prove_target, verification_response
from fireledger.verifysettings import VerificationSettings

from .auth import require
from .context import ApiContext, get_ctx
from .formats import TARGET_KINDS, IdCursor, cursor_query
from .problems import ProblemError, conflict, invalid, not_found
from .schemas import Problem, TargetCreate
from .urls import check_target_url
from .views import id_cursor, instant, parse_id_cursor

router = APIRouter(prefix="/v1/targets", tags=["management"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})


DNS_LABEL = "_fireledger-verification"   # fireledger.security.dnsverify.DNS_LABEL (dnspython loaded lazily)


class VerificationView(BaseModel):
    state: str = Field(description="unverified, verified, failed or lapsed (was verified; not renewed by "
                                   "expires_at). A trigger may use the target only while verified.",
                       json_schema_extra={"enum": ["unverified", "verified", "failed", "lapsed"]})
    method: str | None = Field(None, description="How the verification was proved: http (challenge_path) or "
                                                 "dns (the TXT record at dns_name); null when never proved.",
                               json_schema_extra={"enum": ["http", "dns", None]})
    token: str = Field(description="Names the challenge: the last segment of challenge_path.")
    challenge_path: str = Field(description="Where the target's origin serves `response`: "
                                            "/.well-known/fireledger-verification/<token>.")
    response: str = Field(description="The exact body to serve at challenge_path (status 200; surrounding "
                                      "whitespace ignored), then POST /v1/targets/{id}/verify. It is "
                                      "token + '.' + an HMAC under a deployment key, so it cannot be derived "
                                      "from the request.")
    addresses: list[str] | None = Field(
        None, description="A plain-http target with a host name: the addresses that answered the challenge; "
                          "attempts connect only to these (verify again after moving it). Null otherwise.")
    dns_name: str | None = Field(None, description="An https target may instead publish `response` as a TXT "
                                                   "record at this name and verify with {\"method\": \"dns\"}.")
    verified_at: str | None
    expires_at: str | None = Field(description="A trigger may use the target until then; the verification "
                                               "is renewed automatically before (renews_from).")
    renews_from: str | None = Field(None, description="From this instant (7 days before expires_at) the control "
                                                      "plane proves ownership again by the same method; a failed "
                                                      "try is retried (every 6 h by default) and recorded in error.")
    error: str | None = Field(description="Why the last verification (or automatic re-verification) failed.")


class VerifyRequest(BaseModel):
    """The body of ``POST /v1/targets/{id}/verify`` (optional: the http method)."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field("http", description="http: fetch challenge_path on the target's origin; dns: read the "
                                            "TXT record at dns_name (https targets on port 443 only).",
                        json_schema_extra={"enum": ["http", "dns"]})


class TargetOut(BaseModel):
    id: str
    kind: str
    url: str | None
    verification: VerificationView
    created_at: str


class TargetCreatedOut(TargetOut):
    secret: str = Field(description="Standard Webhooks signing secret; shown only once.")


class TargetPageOut(BaseModel):
    items: list[TargetOut]
    next: str | None


def new_signing_secret() -> str:
    """Standard Webhooks secret ``whsec_<base64 of 32 random bytes>``."""
    try:
        from fireledger.dispatch.signing import new_secret
    except ImportError:  # pragma: no cover - the signing module ships with the dispatch plane
        return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
    return new_secret()


def _settings(ctx: ApiContext) -> VerificationSettings:
    return ctx.settings.verification if ctx.settings is not None else VerificationSettings()


def view(store: Any, t: Target, trust: TargetTrust | None, *, secret: str | None = None,
         window_s: float = VerificationSettings().reverify_window_s) -> dict[str, Any]:
    """A target as the API shows it (the secret only when given: the create response); ``window_s``:
    how long before the expiry the automatic re-verification starts (``renews_from``)."""
    pinned = trust.pinned if trust else None
    expires = trust.expires_us if trust else None
    host = (urlsplit(t.url).hostname or "") if t.kind == "http" and t.url else ""
    out: dict[str, Any] = {
        "id": t.id, "kind": t.kind, "url": t.url,
        "verification": {
            "state": trust.state if trust else t.verification_state,
            "token": t.verification_token,
            "challenge_path": WELL_KNOWN + t.verification_token,
            "response": verification_response(store, t.verification_token, t.id),
            "addresses": sorted(pinned) if pinned is not None else None,
            "method": trust.method if trust else None,
            "dns_name": f"{DNS_LABEL}.{host.rstrip('.')}" if host else None,
            "verified_at": instant(trust.verified_us) if trust else None,
            "expires_at": instant(expires),
            "renews_from": instant(expires - int(window_s * 1e6)) if expires is not None else None,
            "error": trust.error if trust else None,
        },
        "created_at": instant(t.created_us),
    }
    if secret is not None:
        out["secret"] = secret
    return out


@router.post("", status_code=201, response_model=TargetCreatedOut,
             summary="Register a target (the signing secret is shown only in this response)")
def create_target(body: TargetCreate, response: Response, principal: Principal = Depends(require("admin")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    errors: list[tuple[str, str]] = []
    url = body.url
    if body.kind not in TARGET_KINDS:
        errors.append(("kind", "must be one of http, queue, internal"))
    elif body.kind == "http":
        if body.url is None:
            errors.append(("url", "is required for an http target"))
        else:
            problem = check_target_url(body.url, allow_private=ctx.allow_private_targets)
            if problem:
                errors.append(("url", problem))
        if body.name is not None:
            errors.append(("name", "applies only to an internal target"))
    else:   # queue / internal: inside fireledger, nothing to verify (fireledger.dispatch.internal)
        if body.url is not None:
            errors.append(("url", f"a {body.kind} target has no url"))
        if body.kind == "queue" and body.name is not None:
            errors.append(("name", "applies only to an internal target"))
        if body.kind == "internal":
            problem = "is required for an internal target" if body.name is None else name_problem(body.name)
            if problem:
                errors.append(("name", problem))
            url = INTERNAL_PREFIX + (body.name or "")
    if errors:
        raise invalid(errors)
    limit = max_targets_per_tenant()
    if ctx.store.registry.count_targets(principal.tenant_id) >= limit:
        raise ProblemError(409, f"the tenant has {limit} targets, the limit", slug="limit-reached")
    target = Target(
        id=new_id("tg"), tenant_id=principal.tenant_id, kind=TargetKind(body.kind), url=url,
        secret=new_signing_secret(),
        verification_state=VerificationState.UNVERIFIED if body.kind == "http" else VerificationState.VERIFIED,
        verification_token=secrets.token_urlsafe(24), created_us=ctx.now_us(),
    )
    ctx.store.registry.create_target_audited(sealed_target(ctx.store, target), principal.id)
    response.headers["Location"] = f"/v1/targets/{target.id}"
    return view(ctx.store, target, None, secret=target.secret)


@router.get("", response_model=TargetPageOut, summary="List targets (oldest id first, paged)")
def list_targets(limit: int = Query(100, ge=1, le=1000), cursor: IdCursor | None = cursor_query(),
                 principal: Principal = Depends(require("reader")),
                 ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = parse_id_cursor(cursor)
    rows = ctx.store.registry.list_targets(principal.tenant_id, after=after, limit=limit + 1)
    page = rows[:limit]
    window_s = _settings(ctx).reverify_window_s
    return {"items": [view(ctx.store, t, ctx.store.trust.target_trust(t.id), window_s=window_s) for t in page],
            "next": id_cursor(page[-1].id) if len(rows) > limit else None}


@router.get("/{target_id}", response_model=TargetOut, responses={404: {"model": Problem}})
def get_target(target_id: str, principal: Principal = Depends(require("reader")),
               ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    t = ctx.store.registry.get_target(principal.tenant_id, target_id)
    if t is None:
        raise not_found("target")
    return view(ctx.store, t, ctx.store.trust.target_trust(t.id), window_s=_settings(ctx).reverify_window_s)


@router.post("/{target_id}/verify", response_model=TargetOut,
             responses={404: {"model": Problem}, 409: {"model": Problem}},
             summary="Prove ownership by the challenge path (http) or the TXT record (dns): state verified or failed")
async def verify_target(target_id: str, body: VerifyRequest | None = None,
                        principal: Principal = Depends(require("admin")),
                        ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    t = await anyio.to_thread.run_sync(ctx.store.registry.get_target, principal.tenant_id, target_id)
    if t is None:
        raise not_found("target")
    if t.kind != "http" or not t.url:
        raise conflict(f"a {t.kind} target needs no verification")
    method = body.method if body is not None else "http"
    if method not in ("http", "dns"):
        raise invalid([("method", "must be http or dns")])
    vs = _settings(ctx)
    cause, addresses = await prove_target(ctx.store, t.id, t.url, t.verification_token, method,
                                          EgressPolicy(allow_private=ctx.allow_private_targets),
                                          resolver=ctx.resolver, nameservers=vs.nameservers)
    now_us = ctx.now_us()
    if cause is None:
        state, verified, expires = "verified", now_us, now_us + int(vs.validity_s * 1_000_000)
    else:
        state, verified, expires = "failed", None, None
    ok = await anyio.to_thread.run_sync(partial(ctx.store.trust.set_target_verification, addresses=addresses,
                                                method=method if cause is None else None),
                                        principal.tenant_id, t.id, state, verified, expires, cause,
                                        principal.id, now_us)
    if not ok:
        raise not_found("target")
    forget_cached(t.id)
    trust = await anyio.to_thread.run_sync(ctx.store.trust.target_trust, t.id)
    return view(ctx.store, t, trust, window_s=vs.reverify_window_s)


@router.delete("/{target_id}", status_code=204, response_class=Response,
               responses={404: {"model": Problem}, 409: {"model": Problem}},
               summary="Delete a target (refused while a live trigger uses it)")
def delete_target(target_id: str, principal: Principal = Depends(require("admin")),
                  ctx: ApiContext = Depends(get_ctx)) -> Response:
    outcome = ctx.store.registry.delete_target_audited(principal.tenant_id, target_id, principal.id, ctx.now_us())
    if outcome == "absent":
        raise not_found("target")
    if outcome.startswith("in-use:"):
        # Both ids belong to this tenant.
        raise conflict(f"target {target_id} is used by trigger {outcome[7:]}; delete or amend that trigger first")
    return Response(status_code=204)
