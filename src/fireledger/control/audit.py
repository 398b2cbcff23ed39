"""``/v1/audit`` (privileged, role ``admin``): the tenant's own rows of the hash-chained audit; and the
helpers the API uses to audit refusals (a definition's acts are audited by :mod:`fireledger.registry`,
in the transaction of the act).

What is audited (actor = principal id, or ``operator`` / ``system:*``; time; prior and new value):
tenant creation and deletion, principal creation and revocation, target creation, verification and
deletion, policy changes of a trigger (the policy fields before and after), a pause or resume of a
trigger (``trigger.pause`` / ``trigger.resume``, decision 0180), and every refusal for a
missing role or for a bearer token that is not valid (``denied``: the request line, the missing role
and, for policy fields, which fields; ``count`` refusals per row). Refusals are accounted per principal
and window, a bounded number written one by one and the rest as one summary row with their count
(:mod:`fireledger.control.denials`, decision 0091). Audit values never contain payloads, secrets or
tokens.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from fireledger.domain.keys import from_us
from fireledger.domain.model import Principal
from fireledger.recurrence import format_instant

from .auth import Forbidden, require
from .context import ApiContext, get_ctx
from .denials import DenialLedger
from .formats import SeqCursor, cursor_query
from .problems import invalid
from .schemas import Problem
from .views import id_cursor, parse_id_cursor

log = logging.getLogger("fireledger.control")

router = APIRouter(prefix="/v1/audit", tags=["privileged"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

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
def list_audit(limit: int = Query(100, ge=1, le=1000), cursor: SeqCursor | None = cursor_query(),
               principal: Principal = Depends(require("admin")),
               ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    after_text = parse_id_cursor(cursor)
    if after_text and (not after_text.isdigit() or len(after_text) > 18):
        raise invalid([("cursor", "is not a cursor returned by this list (pass `next` back unchanged)")])
    after = int(after_text) if after_text else 0
    rows = ctx.store.trust.audit_rows(after, limit + 1, principal.tenant_id)
    page = rows[:limit]
    items = []
    for r in page:
        d = r.as_json()
        items.append({"seq": r.seq, "actor": r.actor, "action": r.action, "at": format_instant(from_us(r.at_us)),
                      "prior": d["prior"], "new": d["new"], "prev_hash": r.prev_hash, "hash": r.hash})
    return {"items": items, "next": id_cursor(str(page[-1].seq)) if len(rows) > limit else None}


def denial_ledger(app_state: Any) -> DenialLedger | None:
    """The app's :class:`~fireledger.control.denials.DenialLedger` (created by ``create_app``)."""
    ledger = getattr(app_state, "denials", None)
    return ledger if isinstance(ledger, DenialLedger) else None


async def _account(ledger: DenialLedger, tenant_id: str | None, actor: str, reason: str, new: dict[str, Any],
                   breakdown: str) -> None:
    rows = ledger.note(tenant_id, actor, reason, new, breakdown)
    if rows:   # most refusals of a flood are only counted: no store write, no thread
        await anyio.to_thread.run_sync(ledger.write, rows)


async def record_denial(request: Request, exc: Forbidden) -> None:
    """Audit a refusal for a missing role (called by the app's problem handler before answering),
    bounded per principal (decision 0091). A failure to write is logged and does not change the refusal."""
    principal = getattr(request.state, "principal", None)
    ledger = denial_ledger(request.app.state)
    if not isinstance(principal, Principal) or ledger is None:
        return
    line = f"{request.method} {request.url.path}"[:300]
    new = {"request": line, "missing_role": exc.role, **exc.context}
    route = getattr(request.scope.get("route"), "path", None) or "unrouted"
    await _account(ledger, principal.tenant_id, principal.id, f"role:{exc.role}", new,
                   f"{request.method} {route}"[:300])


async def record_invalid_token(scope: Any) -> None:
    """Audit a request whose bearer token is not valid (unknown or revoked), before its 401: actor
    ``anonymous``, no tenant, the request line and the client address; one key for the whole process,
    so no client can write more than the bound (decision 0091)."""
    app = scope.get("app")
    ledger = denial_ledger(getattr(app, "state", None))
    if ledger is None:
        return
    client = scope.get("client") or ("unknown", 0)
    line = f"{scope.get('method', '?')} {scope.get('path', '')}"[:300]
    new = {"request": line, "reason": "invalid-token", "source": str(client[0])[:100]}
    await _account(ledger, None, "anonymous", "invalid-token", new, "invalid-token")


__all__ = ["denial_ledger", "record_denial", "record_invalid_token", "router"]
