"""``/v1/principals`` (privileged, role ``admin``): the tenant's principals and their tokens.

A principal is a named holder of a set of roles. Creating one mints its bearer token, shown only in
the create response (stored as a SHA-256 hash). Revoking one makes its token invalid at once; the
tenant's last live ``admin`` cannot be revoked (409), so a tenant never locks itself out. Every
creation and revocation is audited with the actor and the roles granted or withdrawn.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field

from fireledger.domain.keys import new_id
from fireledger.domain.model import Principal
from fireledger.security.limits import MAX_NAME_CHARS, max_principals_per_tenant, name_problem

from .auth import require
from .context import ApiContext, get_ctx
from .formats import IdCursor, cursor_query
from .problems import ProblemError, conflict, invalid, not_found
from .schemas import Problem
from .tenants import ALL_ROLES, hash_token, new_token
from .views import id_cursor, instant, parse_id_cursor

router = APIRouter(prefix="/v1/principals", tags=["privileged"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

Role = Literal["admin", "author", "backfill", "consumer", "policy", "reader", "runner"]


class PrincipalCreate(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="A label for the holder.")
    roles: list[Role] = Field(min_length=1, max_length=len(ALL_ROLES),
                              description=f"Roles to grant: any of {sorted(ALL_ROLES)}.",
                              examples=[["author", "reader"]], json_schema_extra={"uniqueItems": True})


class PrincipalView(BaseModel):
    id: str
    name: str
    roles: list[str]
    created_at: str
    revoked_at: str | None


class PrincipalCreated(PrincipalView):
    token: str = Field(description="Bearer token; shown only once.")


class PrincipalPage(BaseModel):
    items: list[PrincipalView]
    next: str | None


def principal_view(p: Principal) -> dict[str, Any]:
    return {"id": p.id, "name": p.name, "roles": sorted(p.roles), "created_at": instant(p.created_us),
            "revoked_at": instant(p.revoked_us)}


@router.post("", status_code=201, response_model=PrincipalCreated,
             summary="Create a principal with roles (its token is shown only in this response)")
def create_principal(body: PrincipalCreate, response: Response, principal: Principal = Depends(require("admin")),
                     ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    errors: list[tuple[str, str]] = []
    why = name_problem(body.name)
    if why:
        errors.append(("name", why))
    unknown = [r for r in body.roles if r not in ALL_ROLES]
    for i, r in enumerate(body.roles):
        if r in unknown:
            errors.append((f"roles.{i}", f"is not a role; roles are {sorted(ALL_ROLES)}"))
    if len(set(body.roles)) != len(body.roles):
        errors.append(("roles", "must not repeat a role"))
    if errors:
        raise invalid(errors)
    limit = max_principals_per_tenant()
    if ctx.store.trust.count_principals(principal.tenant_id) >= limit:
        raise ProblemError(409, f"the tenant has {limit} principals, the limit", slug="limit-reached")
    now_us = ctx.now_us()
    token = new_token()
    p = Principal(new_id("pr"), principal.tenant_id, body.name, frozenset(body.roles), now_us)
    ctx.store.trust.create_principal_audited(p, hash_token(token), principal.id)
    response.headers["Location"] = f"/v1/principals/{p.id}"
    return {**principal_view(p), "token": token}


@router.get("", response_model=PrincipalPage, summary="List the tenant's principals (revoked ones too)")
def list_principals(limit: int = Query(100, ge=1, le=1000), cursor: IdCursor | None = cursor_query(),
                    principal: Principal = Depends(require("admin")),
                    ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after = parse_id_cursor(cursor)
    rows = ctx.store.trust.list_principals(principal.tenant_id, after=after, limit=limit + 1)
    page = rows[:limit]
    return {"items": [principal_view(p) for p in page],
            "next": id_cursor(page[-1].id) if len(rows) > limit else None}


@router.get("/{principal_id}", response_model=PrincipalView, responses={404: {"model": Problem}})
def get_principal(principal_id: str, principal: Principal = Depends(require("admin")),
                  ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    p = ctx.store.trust.get_principal(principal.tenant_id, principal_id)
    if p is None:
        raise not_found("principal")
    return principal_view(p)


@router.delete("/{principal_id}", status_code=204, response_class=Response,
               responses={404: {"model": Problem}, 409: {"model": Problem}},
               summary="Revoke a principal: its token stops working at once")
def revoke_principal(principal_id: str, principal: Principal = Depends(require("admin")),
                     ctx: ApiContext = Depends(get_ctx)) -> Response:
    outcome = ctx.store.trust.revoke_principal(principal.tenant_id, principal_id, principal.id, ctx.now_us())
    if outcome == "absent":
        raise not_found("principal")
    if outcome == "last-admin":
        raise conflict("this is the tenant's last admin principal; grant admin to another one first")
    return Response(status_code=204)


__all__ = ["router"]
