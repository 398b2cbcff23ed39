"""Triggers as code: the shape of a ``fireledger apply`` file, and its JSON Schema at
``GET /v1/schemas/triggers.json`` (decision 0185).

The file declares one tenant's targets and triggers (the tenant is the token's), each under its
**name**, which is its identity. The models are built from the API's own request models
(:class:`~.schemas.TargetCreate`, :class:`~.schemas.TriggerCreate`), so a field, a default, a form
or a bound has one definition for the API and for the file::

    targets:
      reports:                       # a name the file's triggers refer to
        kind: http
        url: https://hooks.example.com/reports
    triggers:
      daily-report:                  # the trigger's name: its identity
        schedule: {cron: "0 9 * * 1-5", zone: Europe/Paris}
        target: reports              # a target of this file (or target_id: an existing target's id)
        payload: {report: daily}
        paused: false                # optional; true keeps it paused

The schema is public (no token): an editor fetches it by URL. It describes no tenant's data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model, model_validator

from .schemas import TargetCreate, TriggerCreate

TRIGGERS_SCHEMA_PATH = "/v1/schemas/triggers.json"
SCHEMA_ID = "https://fireledger.dev/schemas/triggers.json"
FILE_VERSION = 1

#: A name of the file's targets map (the triggers' ``target`` refers to it).
TargetName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
#: A trigger's name (as ``TriggerCreate.name``: 1 to 200 characters).
TriggerName = Annotated[str, StringConstraints(min_length=1, max_length=200)]

#: The create fields a declaration takes from the API's model as they are (``name`` is the map's
#: key; ``target_id`` is re-declared optional beside ``target``).
_FROM_CREATE = tuple(f for f in TriggerCreate.model_fields if f not in ("name", "target_id"))


class _DeclBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: TargetName | None = Field(None, description="A target of this file, by its name under `targets`.")
    target_id: str | None = Field(None, max_length=100, description="Or an existing target's id (not in the file).")
    paused: bool = Field(False, description="Keep the trigger paused (apply pauses or resumes it to match).")
    if TYPE_CHECKING:   # the create fields TriggerDecl adds (as TriggerCreate declares them)
        schedule: dict[str, Any]

    @model_validator(mode="after")
    def _one_target(self) -> _DeclBase:
        if (self.target is None) == (self.target_id is None):
            raise ValueError("give exactly one of `target` (a name under targets) and `target_id`")
        return self


if TYPE_CHECKING:
    TriggerDecl = _DeclBase
else:
    TriggerDecl = create_model(
        "TriggerDecl", __base__=_DeclBase, __doc__="One trigger: the body of POST /v1/triggers without `name` "
        "(the key) and `target_id` (`target` or `target_id`), plus `paused`.",
        **{f: (TriggerCreate.model_fields[f].annotation, TriggerCreate.model_fields[f]) for f in _FROM_CREATE},
    )


class TriggersFile(BaseModel):
    """A ``fireledger apply`` file: one tenant's targets and triggers, each under its name."""

    model_config = ConfigDict(extra="forbid", title="fireledger triggers file")

    version: Literal[1] = Field(1, description="The file format's version (1).")
    targets: dict[TargetName, TargetCreate] = Field(
        default_factory=dict, description="Targets by name: the body of POST /v1/targets. An http target is "
                                          "identified by its url, an internal one by its callable's name.")
    triggers: dict[TriggerName, TriggerDecl] = Field(
        default_factory=dict, description="Triggers by name (the identity: one trigger of the tenant per name).")


def triggers_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of :class:`TriggersFile`, as published."""
    doc = TriggersFile.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **doc}


router = APIRouter(tags=["management"])


@router.get(TRIGGERS_SCHEMA_PATH, summary="JSON Schema of a `fireledger apply` file (public: for editors)")
def get_triggers_schema() -> dict[str, Any]:
    return triggers_schema()


__all__ = ["FILE_VERSION", "TRIGGERS_SCHEMA_PATH", "TriggerDecl", "TriggersFile", "router", "triggers_schema"]
