"""The console's verification badge: the state of a trigger's target at a glance (decision 0172).

``verified`` (until when), ``expiring`` (inside the renewal window: the automatic re-verification
has not renewed it yet, or fails — its error is shown), ``lapsed``/``failed``/``unverified`` (its
fires are not sent). Targets of other kinds (queues, internal) need no verification: no badge.
"""

from __future__ import annotations

from typing import Any

from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant
from fireledger.verifysettings import VerificationSettings

from ..context import ApiContext


def _when(us: int) -> str:
    return format_instant(from_us(us))


def target_badge(ctx: ApiContext, target_id: str, now_us: int) -> dict[str, Any] | None:
    """The badge of target ``target_id`` for the console (``kind``: ``ok``, ``warn`` or ``bad``;
    ``text``: one sentence), or None when the target needs no verification."""
    t = ctx.store.trust.target_trust(target_id)
    if t is None or t.kind != "http":
        return None
    vs = ctx.settings.verification if ctx.settings is not None else VerificationSettings()
    base = {"target_id": t.id, "state": str(t.state)}
    expired = t.expires_us is not None and t.expires_us <= now_us
    if t.state == "lapsed" or (t.state == "verified" and expired):
        when = _when(t.expires_us) if t.expires_us is not None else "its expiry"
        return {**base, "kind": "bad", "label": "verification lapsed",
                "text": f"ownership verification lapsed at {when}: its fires are not sent until it is verified again"}
    if t.state != "verified":
        why = f" ({t.error})" if t.error else ""
        return {**base, "kind": "bad", "label": f"target {t.state}",
                "text": f"ownership is not verified{why}: its fires are not sent"}
    if t.expires_us is None:
        return {**base, "kind": "ok", "label": "verified", "text": "ownership verified"}
    if t.expires_us - now_us <= int(vs.reverify_window_s * 1_000_000):
        why = f"; last try: {t.error}" if t.error else "; renewal pending"
        return {**base, "kind": "warn", "label": "verification expiring",
                "text": f"ownership verification expires at {_when(t.expires_us)}{why}"}
    return {**base, "kind": "ok", "label": "verified",
            "text": f"ownership verified until {_when(t.expires_us)} (renewed automatically)"}


__all__ = ["target_badge"]
