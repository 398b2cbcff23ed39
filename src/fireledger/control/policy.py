"""``PATCH /v1/triggers/{id}/policy`` (the policy surface, role ``policy`` alone).

Changes only a trigger's post-outage and overlap policy — missed-fire policy, catch-up horizon,
overlap policy, outcome window — as a new version, exactly like an amendment of those fields
(the same code), and audits the prior and new values. An ``author`` may not widen a trigger's blast
radius: setting these fields through the management surface also needs the ``policy`` role.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict

from fireledger.domain.model import Principal

from . import triggers
from .auth import require
from .context import ApiContext, get_ctx
from .problems import invalid
from .schemas import CATCHUP_DOC, OUTCOME_DOC, MissedFire, Overlap, Problem, TriggerPatch, TriggerView, _duration

router = APIRouter(prefix="/v1/triggers", tags=["policy"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})


class PolicyPatch(BaseModel):
    """Any subset of the policy fields; absent fields keep their value. ``null`` is refused."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    missed_fire_policy: MissedFire = None  # type: ignore[assignment]
    catchup_horizon: str = _duration("catchup_horizon", None, CATCHUP_DOC)
    overlap_policy: Overlap = None  # type: ignore[assignment]
    outcome_window: str = _duration("outcome_window", None, OUTCOME_DOC)


@router.patch("/{trigger_id}/policy", response_model=TriggerView,
              responses={404: {"model": Problem}, 409: {"model": Problem}},
              summary="Change a trigger's missed-fire / catch-up / overlap policy (audited)")
def set_policy(trigger_id: str, body: PolicyPatch, principal: Principal = Depends(require("policy")),
               ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    fields = body.model_fields_set
    if not fields:
        raise invalid([("body", "names no policy field to change")])
    patch = TriggerPatch(**{f: getattr(body, f) for f in fields})
    return triggers.amend_trigger(trigger_id, patch, principal, ctx)


__all__ = ["router"]
