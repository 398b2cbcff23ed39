"""Domain records → API JSON, and opaque list cursors.

Views never include a payload (DESIGN.md invariant 14) and show a target's secret only in the
create response.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import timedelta
from typing import Any

from fireledger.domain.model import Fire, Policies, Target, Trigger, TriggerVersion
from fireledger.observe.records import fire_record, instant
from fireledger.recurrence import format_duration

from .problems import ProblemError, invalid


def duration_s(seconds: float) -> str:
    return format_duration(timedelta(seconds=seconds))


def target_view(t: Target, *, with_secret: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": t.id,
        "kind": t.kind,
        "url": t.url,
        "verification": {"state": t.verification_state, "token": t.verification_token},
        "created_at": instant(t.created_us),
    }
    if with_secret:
        out["secret"] = t.secret
    return out


def policy_fields(p: Policies) -> dict[str, Any]:
    return {
        "missed_fire_policy": p.missed_fire.value,
        "catchup_horizon": duration_s(p.catchup_horizon_s),
        "overlap_policy": p.overlap.value,
        "outcome_window": duration_s(p.outcome_window_s),
        "jitter": duration_s(p.jitter_s),
        "timeout": duration_s(p.timeout_s),
        "retry": retry_fields(p),
    }


def retry_fields(p: Policies) -> dict[str, Any]:
    """A version's retry policy as the API writes it (decision 0147)."""
    return {"max_attempts": p.max_attempts, "min_backoff": duration_s(p.min_backoff_s),
            "max_backoff": duration_s(p.max_backoff_s),
            "max_event_age": None if p.max_event_age_s is None else duration_s(p.max_event_age_s)}


def trigger_view(t: Trigger, v: TriggerVersion) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "state": t.state.value,
        "version": t.current_version,
        "schedule": v.schedule,
        "target_id": v.target_id,
        **policy_fields(v.policies),
        "next_instant": instant(t.next_us),
        "pause_reason": t.pause_reason,
        "tzdata_version": v.tzdata_version,
        "created_at": instant(t.created_us),
        "updated_at": instant(t.updated_us),
    }


def fire_view(f: Fire) -> dict[str, Any]:
    """The API's view of a fire: the fire record of :mod:`fireledger.observe.records` (never a payload)."""
    return fire_record(f)


# --- cursors ----------------------------------------------------------------------------------
# Opaque to clients: urlsafe base64 (no padding) of "i:<id>" (id-ordered lists) or
# "f:<scheduled_us>:<seq>" (fire history).

_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_FIRE = re.compile(r"^(-?\d{1,19}):(\d{1,9})$")


def _enc(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def _dec(cursor: str) -> str:
    bad = invalid([("cursor", "is not a cursor returned by this list (pass `next` back unchanged)")])
    if not cursor or len(cursor) > 300 or not re.fullmatch(r"[A-Za-z0-9_-]+", cursor):
        raise bad
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None


def id_cursor(last_id: str) -> str:
    return _enc(f"i:{last_id}")


def parse_id_cursor(cursor: str | None) -> str:
    if cursor is None:
        return ""
    text = _dec(cursor)
    if not text.startswith("i:") or not _ID.match(text[2:]):
        raise invalid([("cursor", "is not a cursor returned by this list (pass `next` back unchanged)")])
    return text[2:]


def fire_cursor(f: Fire) -> str:
    return _enc(f"f:{f.scheduled_us}:{f.seq}")


def parse_fire_cursor(cursor: str | None) -> tuple[int, int] | None:
    if cursor is None:
        return None
    text = _dec(cursor)
    m = _FIRE.match(text[2:]) if text.startswith("f:") else None
    if not m:
        raise invalid([("cursor", "is not a cursor returned by this list (pass `next` back unchanged)")])
    return int(m.group(1)), int(m.group(2))


__all__ = [
    "ProblemError",
    "fire_cursor",
    "fire_view",
    "id_cursor",
    "instant",
    "parse_fire_cursor",
    "parse_id_cursor",
    "target_view",
    "trigger_view",
]
