"""``/v1/tenant/quota``: the tenant's dispatch quota — read (role ``reader``), changed (role ``policy``).

Seed ADR-15 / invariant 13: a quota change multiplies work, so it is a grant of its own (``policy``),
not an author's act, and every change is audited in the same transaction with the prior and new
values (action ``tenant.quota``, actor the principal; the operator command ``fireledger tenant
quota`` writes the same row with actor ``operator``). A change takes effect at the next claim round
of every dispatch process (decision 0177).

The operator bounds what a tenant may give itself: ``fires_per_s`` at most
``FIRELEDGER_MAX_QUOTA_FIRES_PER_S`` (default 1000) and ``inflight`` at most
``FIRELEDGER_MAX_QUOTA_INFLIGHT`` (default 1000); above them the change is refused (422 naming the
field) and only the operator command can set it. The least a tenant may set is 0.01 fires/s and a
catch-up fraction of 0.01 (a recovery lane's pace stays a finite interval).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from fireledger.domain.model import Principal
from fireledger.security.limits import max_quota_fires_per_s, max_quota_inflight

from .auth import require
from .context import ApiContext, get_ctx
from .problems import invalid, not_found
from .schemas import Problem

router = APIRouter(prefix="/v1/tenant", tags=["policy"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

_NAMES = ("fires_per_s", "inflight", "catchup_fraction")
#: The least a tenant may set through the API: a rate's interval (1/rate) must stay a number the
#: shaper can add to an instant for every tenant's claim round (the operator command allows any > 0).
MIN_FIRES_PER_S = 0.01
MIN_FRACTION = 0.01


class QuotaPatch(BaseModel):
    """Any subset of the quota's parts; absent parts keep their value. ``null`` is refused."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    fires_per_s: float = Field(None, ge=MIN_FIRES_PER_S, le=1e9,   # type: ignore[assignment]
                               description="Attempts started per second (≥ 0.01; at most the operator's ceiling).")
    inflight: int = Field(None, ge=1, le=1_000_000_000,   # type: ignore[assignment]
                          description="Attempts in flight at once (≥ 1; at most the operator's ceiling).")
    catchup_fraction: float = Field(None, ge=MIN_FRACTION, le=1,   # type: ignore[assignment]
                                    description="Share of the quota the catch-up and backfill lanes drain at.")


class QuotaParts(BaseModel):
    fires_per_s: float
    inflight: int
    catchup_fraction: float


class QuotaView(QuotaParts):
    catchup_per_s: float = Field(description="fires_per_s × catchup_fraction: each recovery lane's rate.")
    prior: QuotaParts | None = Field(None, description="The quota before this change (change answers only).")


def quota_view(q: tuple[float, int, float], prior: tuple[float, int, float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {**dict(zip(_NAMES, q, strict=True)), "catchup_per_s": round(q[0] * q[2], 6)}
    out["prior"] = None if prior is None else dict(zip(_NAMES, prior, strict=True))
    return out


@router.get("/quota", response_model=QuotaView, summary="The tenant's dispatch quota")
def get_quota(principal: Principal = Depends(require("reader")),
              ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    q = ctx.store.dispatch.tenant_quota(principal.tenant_id)
    if q is None:
        raise not_found("tenant")
    return quota_view(q)


@router.patch("/quota", response_model=QuotaView, responses={404: {"model": Problem}},
              summary="Change the tenant's dispatch quota (role policy; audited with the prior value)")
def set_quota(body: QuotaPatch, principal: Principal = Depends(require("policy")),
              ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    fields = body.model_fields_set
    if not fields:
        raise invalid([("body", "names no quota part to change")])
    problems: list[tuple[str, str]] = []
    if body.fires_per_s is not None and not math.isfinite(body.fires_per_s):
        problems.append(("fires_per_s", "must be a finite number"))
    elif body.fires_per_s is not None and body.fires_per_s > (top := max_quota_fires_per_s()):
        problems.append(("fires_per_s", f"is above the operator's ceiling {top} (ask the operator)"))
    if body.inflight is not None and body.inflight > (most := max_quota_inflight()):
        problems.append(("inflight", f"is above the operator's ceiling {most} (ask the operator)"))
    if problems:
        raise invalid(problems)
    prior = ctx.store.dispatch.set_tenant_quota(
        principal.tenant_id, fires_per_s=body.fires_per_s, inflight=body.inflight,
        catchup_fraction=body.catchup_fraction, actor=principal.id, now_us=ctx.now_us())
    now = ctx.store.dispatch.tenant_quota(principal.tenant_id)
    if prior is None or now is None:
        raise not_found("tenant")
    return quota_view(now, prior)


__all__ = ["router"]
