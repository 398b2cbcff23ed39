"""``/v1/audit`` (privileged, role ``admin``): the tenant's own rows of the hash-chained audit; and the
helpers the API uses to audit acts it performs outside the trust store mixin.

What is audited (actor = principal id, or ``operator`` / ``system:*``; time; prior and new value):
tenant creation and deletion, principal creation and revocation, target creation, verification and
deletion, policy changes of a trigger (the policy fields before and after), and every refusal for a
missing role (``denied``: the request line, the missing role and, for policy fields, which fields).
Audit values never contain payloads, secrets or tokens.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from fireledger.domain.keys import from_us
from fireledger.domain.model import Policies, Principal
from fireledger.recurrence import format_instant

from .auth import Forbidden, require
from .context import ApiContext, get_ctx
from .problems import invalid
from .schemas import Problem
from .views import id_cursor, parse_id_cursor, policy_fields

log = logging.getLogger("fireledger.control")

router = APIRouter(prefix="/v1/audit", tags=["privileged"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

#: Policy fields as the API names them, read from a version's policies.
_POLICY_API_FIELDS = ("missed_fire_policy", "catchup_horizon", "overlap_policy", "outcome_window")


class AuditItem(BaseModel):
    seq: int
    actor: str
    action: str
    at: str
    prior: Any = None
    new: Any = None
    prev_hash: str
    hash: str


class AuditPage(BaseModel):
    items: list[AuditItem]
    next: str | None


@router.get("", response_model=AuditPage, summary="The tenant's audit rows, oldest first (paged)")
def list_audit(limit: int = Query(100, ge=1, le=1000), cursor: str | None = Query(None, max_length=300),
               principal: Principal = Depends(require("admin")),
               ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after_text = parse_id_cursor(cursor)
    if after_text and not after_text.isdigit():
        raise invalid([("cursor", "is not a cursor returned by this list (pass `next` back unchanged)")])
    after = int(after_text) if after_text else 0
    rows = ctx.store.audit_rows(after, limit + 1, principal.tenant_id)
    page = rows[:limit]
    items = []
    for r in page:
        d = r.as_json()
        items.append({"seq": r.seq, "actor": r.actor, "action": r.action, "at": format_instant(from_us(r.at_us)),
                      "prior": d["prior"], "new": d["new"], "prev_hash": r.prev_hash, "hash": r.hash})
    return {"items": items, "next": id_cursor(str(page[-1].seq)) if len(rows) > limit else None}


async def record_denial(request: Request, exc: Forbidden) -> None:
    """Audit a refusal for a missing role (called by the app's problem handler before answering).
    A failure to write is logged (type only) and does not change the refusal."""
    principal = getattr(request.state, "principal", None)
    ctx: ApiContext | None = getattr(request.app.state, "fireledger", None)
    if not isinstance(principal, Principal) or ctx is None:
        return
    line = f"{request.method} {request.url.path}"[:300]
    new = {"request": line, "missing_role": exc.role, **exc.context}
    try:
        await anyio.to_thread.run_sync(ctx.store.append_audit, principal.tenant_id, principal.id, "denied",
                                       ctx.now_us(), None, new)
    except Exception as err:  # the refusal stands; the failure to audit it is loud
        log.error("could not audit a denied request: %s", type(err).__name__)


def _policy_values(p: Policies) -> dict[str, Any]:
    values = policy_fields(p)
    return {k: values[k] for k in _POLICY_API_FIELDS}


def record_policy_change(ctx: ApiContext, principal: Principal, trigger_id: str, prior: Policies | None,
                         new: Policies, fields: set[str], now_us: int) -> None:
    """Audit a change of a trigger's policy fields (``prior`` None: set at creation)."""
    touched = sorted(fields & set(_POLICY_API_FIELDS))
    if not touched:
        return
    before = {"trigger_id": trigger_id, **_policy_values(prior)} if prior is not None else None
    after = {"trigger_id": trigger_id, **_policy_values(new), "fields": touched}
    ctx.store.append_audit(principal.tenant_id, principal.id, "trigger.policy", now_us, before, after)


__all__ = ["record_denial", "record_policy_change", "router"]
