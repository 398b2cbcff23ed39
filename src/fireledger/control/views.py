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

from .formats import CURSOR_HINT, FIRE_CURSOR_PATTERN, ID_CURSOR_PATTERN
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
        "dead_letter_target_id": p.dead_letter_target_id,
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
# What a list issues as ``next``: "i.<id>" (id-ordered lists), "f.<scheduled_us>.<seq>" (one
# trigger's fires), "g.<scheduled_us>.<trigger_id>.<seq>" (the tenant's fires) — the patterns
# /openapi.json declares (:mod:`.formats`), so every string of that form is a position the list can
# start after. Clients pass ``next`` back unchanged. Cursors issued before decision 0141 (urlsafe
# base64, no padding, of "i:<id>" / "f:<us>:<seq>" / "g:<us>:<trigger>:<seq>") are still honoured.

_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_NEW_ID = re.compile(ID_CURSOR_PATTERN)
_NEW_FIRE = re.compile(FIRE_CURSOR_PATTERN)
_FIRE = re.compile(r"^(-?\d{1,18}):(\d{1,9})$", re.ASCII)
_BAD_CURSOR = ("cursor", CURSOR_HINT)


def _enc(text: str) -> str:
    """The earlier (base64url) cursor form; kept for tests of the legacy path."""
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def _dec(cursor: str) -> str:
    """A legacy cursor's text (problem ``cursor`` when it is not one)."""
    bad = invalid([_BAD_CURSOR])
    if not cursor or len(cursor) > 300 or not re.fullmatch(r"[A-Za-z0-9_-]+", cursor):
        raise bad
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None


def id_cursor(last_id: str) -> str:
    return f"i.{last_id}"


def parse_id_cursor(cursor: str | None) -> str:
    """The id a list continues after ("" for the first page); problem ``cursor`` when not a cursor."""
    if cursor is None:
        return ""
    if _NEW_ID.match(cursor):
        return cursor[2:]
    text = _dec(cursor)
    if not text.startswith("i:") or not _ID.match(text[2:]):
        raise invalid([_BAD_CURSOR])
    return text[2:]


def fire_cursor(f: Fire) -> str:
    return f"f.{f.scheduled_us}.{f.seq}"


def parse_fire_cursor(cursor: str | None, *, legacy_only: bool = False) -> tuple[int, int] | None:
    """``(scheduled_us, seq)`` one trigger's fire list continues after (None: the first page);
    ``legacy_only``: only the earlier base64url form (a list that now issues another form)."""
    if cursor is None:
        return None
    if not legacy_only and _NEW_FIRE.match(cursor):
        us, seq = cursor[2:].split(".")
        return int(us), int(seq)
    text = _dec(cursor)
    m = _FIRE.match(text[2:]) if text.startswith("f:") else None
    if not m:
        raise invalid([_BAD_CURSOR])
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
