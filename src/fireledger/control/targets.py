"""``/v1/targets``: where fires are delivered. A target is a privilege (invariant 12)."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from fastapi import APIRouter, Depends, Query, Response

from fireledger.domain.keys import new_id
from fireledger.domain.model import Principal, Target
from fireledger.store import InvariantViolation, StoreError

from .auth import require
from .context import ApiContext, get_ctx
from .problems import conflict, invalid, not_found
from .schemas import Problem, TargetCreate, TargetCreated, TargetPage, TargetView
from .urls import check_target_url
from .views import id_cursor, parse_id_cursor, target_view

router = APIRouter(prefix="/v1/targets", tags=["targets"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})


def new_signing_secret() -> str:
    """Standard Webhooks secret ``whsec_<base64 of 32 random bytes>``."""
    try:
        from fireledger.dispatch.signing import new_secret
    except ImportError:  # pragma: no cover - the signing module ships with the dispatch plane
        return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
    return new_secret()


@router.post("", status_code=201, response_model=TargetCreated,
             summary="Register a target (the signing secret is shown only in this response)")
def create_target(body: TargetCreate, response: Response, principal: Principal = Depends(require("admin")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    errors: list[tuple[str, str]] = []
    if body.kind != "http":
        errors.append(("kind", "only 'http' is supported in this version"))
    elif body.url is None:
        errors.append(("url", "is required for an http target"))
    else:
        problem = check_target_url(body.url, allow_private=ctx.allow_private_targets)
        if problem:
            errors.append(("url", problem))
    if errors:
        raise invalid(errors)
    target = Target(
        id=new_id("tg"), tenant_id=principal.tenant_id, kind="http", url=body.url,
        secret=new_signing_secret(), verification_state="unverified",
        verification_token=secrets.token_urlsafe(24), created_us=ctx.now_us(),
    )
    ctx.store.create_target(target)
    response.headers["Location"] = f"/v1/targets/{target.id}"
    return target_view(target, with_secret=True)


@router.get("", response_model=TargetPage, summary="List targets (oldest id first, paged)")
def list_targets(limit: int = Query(100, ge=1, le=1000), cursor: str | None = Query(None, max_length=300),
                 principal: Principal = Depends(require("reader")),
                 ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = parse_id_cursor(cursor)
    rows = ctx.store.list_targets(principal.tenant_id, after=after, limit=limit + 1)
    page = rows[:limit]
    return {"items": [target_view(t) for t in page],
            "next": id_cursor(page[-1].id) if len(rows) > limit else None}


@router.get("/{target_id}", response_model=TargetView, responses={404: {"model": Problem}})
def get_target(target_id: str, principal: Principal = Depends(require("reader")),
               ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    t = ctx.store.get_target(principal.tenant_id, target_id)
    if t is None:
        raise not_found("target")
    return target_view(t)


@router.delete("/{target_id}", status_code=204, response_class=Response,
               responses={404: {"model": Problem}, 409: {"model": Problem}},
               summary="Delete a target (refused while a live trigger uses it)")
def delete_target(target_id: str, principal: Principal = Depends(require("admin")),
                  ctx: ApiContext = Depends(get_ctx)) -> Response:
    if ctx.store.get_target(principal.tenant_id, target_id) is None:
        raise not_found("target")
    try:
        deleted = ctx.store.delete_target(principal.tenant_id, target_id, ctx.now_us())
    except InvariantViolation:
        raise
    except StoreError as exc:
        # "target X is used by trigger Y": both ids belong to this tenant.
        raise conflict(f"{exc}; delete or amend that trigger first") from None
    if not deleted:
        raise not_found("target")
    return Response(status_code=204)
