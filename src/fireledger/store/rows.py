"""Row → record mapping and record → bind parameters, written once for every area store.

A row is a sequence in the column order of the named query that selected it (``queries.FIRE_COLS``,
``TRIGGER_COLS``, …); each mapper names the record it builds. Bind parameters are dicts keyed by the
queries' ``:name`` placeholders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from functools import lru_cache
from typing import Any

from fireledger.domain.keys import FireKey
from fireledger.domain.model import (
    Advance,
    Attempt,
    AttemptResult,
    Fire,
    FireKind,
    FireState,
    Lane,
    MissedFirePolicy,
    NewFire,
    OverlapPolicy,
    Policies,
    Principal,
    Target,
    TargetKind,
    Trigger,
    TriggerState,
    TriggerVersion,
    VerificationState,
)
from fireledger.domain.timing_records import DIVERGENCE_KINDS, ShadowReport, ShadowRow
from fireledger.domain.trust_records import AuditEntry, TargetTrust


@lru_cache(maxsize=1024)
def policies_to_json(p: Policies) -> str:
    """Encode policies (immutable values, few distinct ones: cached, which bulk creates rely on)."""
    return json.dumps(asdict(p), sort_keys=True)


_POLICIES: dict[str, Policies] = {}


def policies_from_json(text: str) -> Policies:
    """Decode stored policies. Policies are immutable values and most versions share a few distinct
    texts, so decoded values are shared (a bounded cache: a burst of new triggers is not a burst of
    JSON decoding)."""
    found = _POLICIES.get(text)
    if found is not None:
        return found
    d = json.loads(text)
    d["missed_fire"] = MissedFirePolicy(d["missed_fire"])
    d["overlap"] = OverlapPolicy(d["overlap"])
    p = Policies(**d)
    if len(_POLICIES) >= 10_000:
        _POLICIES.clear()
    _POLICIES[text] = p
    return p


_KINDS = {k.value: k for k in FireKind}
_LANES = {k.value: k for k in Lane}
_STATES = {k.value: k for k in FireState}
_RESULTS = {k.value: k for k in AttemptResult}
_TARGET_KINDS = {k.value: k for k in TargetKind}
_VERIFICATION = {k.value: k for k in VerificationState}


#: The slots of :class:`Fire` in field order, set directly by :func:`fire` (its frozen ``__init__``
#: makes one ``object.__setattr__`` call per field: ≈5 µs a fire, against ≈3.3; decision 0236). The
#: field order is checked here once; were it to change, :func:`fire` would be wrong, so it is asserted.
_FIRE_FIELDS = ("tenant_id", "trigger_id", "scheduled_us", "seq", "version", "kind", "lane", "state", "cause",
                "decided_us", "decided_by", "dispatched_us", "finished_us", "tzdata_version", "attempts",
                "next_attempt_us", "eps_us", "eps_source", "specs", "attempt_list", "attempt_base", "redriven_us",
                "dst")
assert tuple(f.name for f in fields(Fire)) == _FIRE_FIELDS and not hasattr(Fire, "__post_init__")
_FIRE_SET = tuple(Fire.__dict__[name].__set__ for name in _FIRE_FIELDS)
_new = object.__new__


def fire(row: Sequence[Any]) -> Fire:
    """A :class:`Fire` from a row of ``FIRE_COLS`` (or ``FIRE_COLS_EVIDENCE``; or the 16 written columns
    a ``RETURNING`` gives); kind, lane and state as their enums (a dict lookup: this runs for every fire
    a claim or a page reads). Equal to ``Fire(...)`` of the same values, built slot by slot."""
    n = len(row)
    f = _new(Fire)
    for put, value in zip(_FIRE_SET, (
            row[0], row[1], row[2], row[3], row[4], _KINDS[row[5]], _LANES[row[6]], _STATES[row[7]],
            row[8], row[9], row[10], row[11], row[12], row[13], row[14], row[15],
            row[18] if n > 18 else None, row[19] if n > 19 else None, row[21] if n > 21 else None, (),
            row[16] if n > 16 else 0, row[17] if n > 17 else None, row[20] if n > 20 else None), strict=True):
        put(f, value)
    return f


def attempt(row: Sequence[Any]) -> Attempt:
    """An :class:`Attempt` from ``attempt, started_us, finished_us, result, http_status, error, node``."""
    return Attempt(row[0], row[1], row[2], None if row[3] is None else _RESULTS[row[3]], *row[4:])


def target(row: Sequence[Any]) -> Target:
    """A :class:`Target` from a row of the target columns (its secret as stored: sealed)."""
    return Target(row[0], row[1], _TARGET_KINDS[row[2]], row[3], row[4], _VERIFICATION[row[5]], *row[6:])


def trigger(row: Sequence[Any]) -> Trigger:
    """A :class:`Trigger` from a row of ``TRIGGER_COLS`` (``pause_reason`` optional)."""
    return Trigger(row[0], row[1], row[2], TriggerState(row[3]), row[4], row[5], row[6], row[7], row[8],
                   row[9] if len(row) > 9 else None)


def version(row: Sequence[Any]) -> TriggerVersion:
    """A :class:`TriggerVersion` from a row of the version columns (payload as stored: sealed)."""
    return TriggerVersion(
        trigger_id=row[0], version=row[1], tenant_id=row[2], schedule=json.loads(row[3]),
        target_id=row[4], payload=bytes(row[5]), policies=policies_from_json(row[6]),
        tzdata_version=row[7], created_us=row[8],
    )


def target_trust(row: Sequence[Any]) -> TargetTrust:
    """A :class:`TargetTrust` from a row of ``trust_target``."""
    return TargetTrust(row[0], row[1], _TARGET_KINDS[row[2]], row[3], _VERIFICATION[row[4]], *row[5:])


def principal(row: Sequence[Any]) -> Principal:
    """A :class:`Principal` from ``id, tenant_id, name, roles, created_us, revoked_us``."""
    return Principal(row[0], row[1], row[2], frozenset(filter(None, str(row[3]).split(","))), row[4], row[5])


def audit(row: Sequence[Any]) -> AuditEntry:
    """An :class:`AuditEntry` from a row of the audit columns."""
    return AuditEntry(int(row[0]), row[1], row[2], row[3], int(row[4]), row[5], row[6], row[7], row[8])


def with_attempts(f: Fire, attempts: Sequence[Attempt]) -> Fire:
    """``f`` with its attempt rows attached."""
    return replace(f, attempt_list=tuple(attempts))


def key_params(f: Fire | FireKey | NewFire) -> dict[str, Any]:
    """The primary-key bind parameters of a fire."""
    return {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us, "seq": f.seq}


def fire_params(f: NewFire) -> dict[str, Any]:
    """Bind parameters of ``insert_fire`` for a decided fire (live fires get their first dispatch
    time — the smeared one when set — terminal ones their finish time)."""
    pending = f.state == FireState.PENDING
    return {
        "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
        "seq": f.seq, "version": f.version, "kind": f.kind.value, "lane": f.lane.value,
        "state": f.state.value, "cause": f.cause, "decided_us": f.decided_us, "decided_by": f.decided_by,
        "finished_us": None if pending or f.state == FireState.HELD else f.decided_us,
        "tzdata_version": f.tzdata_version,
        "next_attempt_us": (f.not_before_us if f.not_before_us is not None else f.decided_us) if pending else None,
        "eps_us": f.eps_us, "eps_source": f.eps_source, "dst": f.dst, "specs": f.specs,
    }


def advance_params(a: Advance) -> dict[str, Any]:
    """Bind parameters of ``advance_due`` / ``retire_due`` (the due row's compare-and-set)."""
    return {"trigger_id": a.trigger_id, "expected_next_us": a.expected_next_us,
            "expected_version": a.expected_version, "new_next_us": a.new_next_us, "new_version": a.new_version}


def version_params(v: TriggerVersion) -> dict[str, Any]:
    """Bind parameters of ``insert_version``."""
    return {"trigger_id": v.trigger_id, "version": v.version, "tenant_id": v.tenant_id,
            "schedule": json.dumps(v.schedule, sort_keys=True), "target_id": v.target_id,
            "payload": v.payload, "policies": policies_to_json(v.policies),
            "tzdata_version": v.tzdata_version, "created_us": v.created_us}


def trigger_params(t: Trigger, v: TriggerVersion) -> dict[str, Any]:
    """Bind parameters of ``insert_trigger`` (``v`` current)."""
    return {"id": t.id, "tenant_id": t.tenant_id, "name": t.name, "state": t.state.value,
            "current_version": v.version, "partition": t.partition, "created_us": t.created_us,
            "updated_us": t.updated_us}


def due_params(t: Trigger, version: int, next_us: int) -> dict[str, Any]:
    """Bind parameters of ``upsert_due``."""
    return {"trigger_id": t.id, "tenant_id": t.tenant_id, "partition": t.partition, "next_us": next_us,
            "version": version}


def target_params(t: Target, secret: str) -> dict[str, Any]:
    """Bind parameters of ``insert_target`` (``secret``: the sealed form)."""
    return {"id": t.id, "tenant_id": t.tenant_id, "kind": t.kind, "url": t.url, "secret": secret,
            "verification_state": t.verification_state, "verification_token": t.verification_token,
            "created_us": t.created_us}


def principal_params(p: Principal, token_hash: str) -> dict[str, Any]:
    """Bind parameters of ``insert_principal`` (the token only as its hash)."""
    return {"id": p.id, "tenant_id": p.tenant_id, "name": p.name, "token_hash": token_hash,
            "roles": ",".join(sorted(p.roles)), "created_us": p.created_us}


def opt_int(x: Any) -> int | None:
    """``x`` as an int, None staying None."""
    return None if x is None else int(x)


def shadow_report(r: Sequence[Any]) -> ShadowReport:
    """A :class:`ShadowReport` from a row of the shadow report columns."""
    counts = {k: int(r[7 + i] or 0) for i, k in enumerate(DIVERGENCE_KINDS)}
    return ShadowReport(partition=int(r[0]), node=str(r[3] or ""), reported_us=int(r[2] or 0),
                        triggers=int(r[4] or 0), live_rows=int(r[5] or 0), counts=counts,
                        repartition_pending=int(r[12] or 0), duration_us=int(r[13] or 0),
                        claimed_us=int(r[1] or 0))


def shadow_row(r: Sequence[Any]) -> ShadowRow:
    """A :class:`ShadowRow` from a row of the shadow snapshot (``_SHADOW_ROWS``)."""
    return ShadowRow(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), json.loads(r[5]), opt_int(r[6]),
                     opt_int(r[7]), opt_int(r[8]), opt_int(r[9]), opt_int(r[10]), opt_int(r[11]), opt_int(r[12]))


__all__ = ["advance_params", "attempt", "audit", "due_params", "fire", "fire_params", "key_params", "opt_int",
           "policies_from_json", "policies_to_json", "principal", "principal_params", "shadow_report",
           "shadow_row", "target", "target_params", "target_trust", "trigger", "trigger_params", "version",
           "version_params", "with_attempts"]
