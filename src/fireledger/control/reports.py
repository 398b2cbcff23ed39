"""``GET /v1/reports/smearing`` (history surface, role ``reader``): the avoided-peak report of jitter
smearing over the tenant's own on-time scheduled fires (see :mod:`fireledger.observe.smearing`).

``GET /v1/reports/delivery`` (role ``reader``): the tenant's duplicate-delivery rate measured by the
ledger over its fires scheduled in the window (decision 0167): extra ``delivered`` attempts of an
already delivered fire, and attempts after one whose answer was never learned, per million
delivered fires.

``from`` / ``to`` (RFC 3339, half-open on the scheduled instant) default to the last hour; a window
may span at most 7 days.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from fireledger.domain.keys import from_us
from fireledger.domain.model import Principal
from fireledger.observe.smearing import smearing_report
from fireledger.recurrence import format_instant

from .auth import require
from .context import ApiContext, get_ctx
from .formats import InstantText, instant_query
from .history import parse_window
from .problems import invalid
from .schemas import Problem

router = APIRouter(prefix="/v1/reports", tags=["history"],
                   responses={401: {"model": Problem}, 403: {"model": Problem}, 422: {"model": Problem}})

HOUR_US = 3600 * 1_000_000
MAX_WINDOW_US = 7 * 24 * HOUR_US


class PeakView(BaseModel):
    per_s: int = Field(description="Fires in the busiest second.")
    at: str | None = Field(description="Start of that second (the first one on a tie); null without fires.")


class LatenessView(BaseModel):
    fires: int = Field(description="Smeared fires dispatched in the window.")
    p50: float | None = Field(description="Seconds (nearest rank); null without fires.")
    p99: float | None
    max: float | None


class SmearedLatenessView(BaseModel):
    raw: LatenessView = Field(description="Dispatched minus scheduled instant.")
    net_of_smear: LatenessView = Field(description="Dispatched minus dispatch not-before (net of the declared smear).")


class SmearingView(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    to: str
    fires: int = Field(description="On-time scheduled fires with a scheduled instant in the window.")
    popular_fires: int = Field(description="Of which on a whole-minute instant (the ones smearing applies to).")
    smeared_fires: int = Field(description="Of those, fires of triggers with a jitter window > 0.")
    opted_out_fires: int = Field(description="Of those, fires of triggers that opted out (jitter 0s).")
    dispatched_fires: int
    peak_without_smearing: PeakView = Field(description="Busiest second by scheduled instant.")
    peak_with_smearing: PeakView = Field(description="Busiest second by dispatch not-before instant.")
    peak_dispatched: PeakView = Field(description="Busiest second by first dispatch, as measured.")
    avoided_peak_per_s: int = Field(description="peak_without_smearing − peak_with_smearing.")
    avoided_ratio: float | None = Field(description="avoided_peak_per_s / peak_without_smearing.")
    peak_ratio: float | None = Field(description="peak_without_smearing / peak_with_smearing.")
    capped_fires: int = Field(description="Smeared fires whose trigger's next instant is closer than twice the "
                                          "window: the offset stays below half that gap (never reorders).")
    smear_cap: str = Field(description="The cap rule, in words.")
    smeared_lateness_s: SmearedLatenessView = Field(
        description="Lateness of smeared fires, raw beside net of the declared smear.")


def _window(from_: str | None, to: str | None, ctx: ApiContext) -> tuple[int, int]:
    """``[from, to)`` in µs: ``to`` defaults to now, ``from`` to an hour before it; at most 7 days,
    not before 1970 (422 naming the field otherwise)."""
    errors: list[tuple[str, str]] = []
    lo, hi = parse_window(from_, to, errors)
    if errors:
        raise invalid(errors)
    hi = hi if hi is not None else ctx.clock.now().latest_us
    if hi <= 0:
        raise invalid([("to", "must be after 1970-01-01T00:00:00Z")])
    if lo is not None and lo < 0:
        raise invalid([("from", "must not be before 1970-01-01T00:00:00Z")])
    lo = lo if lo is not None else max(0, hi - HOUR_US)
    if hi <= lo:
        raise invalid([("from", "must be earlier than `to` (default: now)")])
    if hi - lo > MAX_WINDOW_US:
        raise invalid([("from", "the window may span at most 7 days")])
    return lo, hi


def _from_query() -> Any:
    """The window's ``from`` query parameter, as every report declares it."""
    return instant_query("RFC 3339; scheduled instant ≥ from, not before 1970 (default: to − 1 h)", alias="from")


def _to_query() -> Any:
    """The window's ``to`` query parameter, as every report declares it."""
    return instant_query("RFC 3339; scheduled instant < to (default: now; later than from, at most 7 days after it)")


@router.get("/smearing", response_model=SmearingView, response_model_by_alias=True,
            summary="Avoided-peak report of jitter smearing over a window (default: the last hour)")
def smearing(from_: InstantText | None = _from_query(),
             to: InstantText | None = _to_query(),
             principal: Principal = Depends(require("reader")),
             ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    lo, hi = _window(from_, to, ctx)
    return smearing_report(ctx.store, lo, hi, [principal.tenant_id]).as_json()


class DeliveryView(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    to: str
    delivered_fires: int = Field(description="The tenant's fires scheduled in the window that were delivered.")
    duplicate_attempts: int = Field(description="Attempts the receiver answered 2xx for a fire an earlier attempt "
                                                "had already delivered (proven duplicates).")
    possible_duplicate_attempts: int = Field(
        description="Attempts of a delivered fire, other than its last, whose answer the ledger never learned "
                    "(result unknown, or none: the runner vanished): the receiver may have processed each.")
    duplicates_per_million: float | None = Field(
        description="duplicate_attempts per million delivered_fires (null without delivered fires).")
    possible_duplicates_per_million: float | None = Field(
        description="possible_duplicate_attempts per million delivered_fires (null without delivered fires).")
    definition: str = Field(description="What is counted, in words.")


DELIVERY_DEFINITION = ("Over fires scheduled in [from, to): an extra delivery is an attempt answered 2xx for a "
                       "fire an earlier attempt had already delivered; a possible one is an attempt of a "
                       "delivered fire, other than its last, whose answer was never learned. Rates are per "
                       "million delivered fires.")


@router.get("/delivery", response_model=DeliveryView, response_model_by_alias=True,
            summary="Duplicate-delivery rate measured by the ledger over a window (default: the last hour)")
def delivery(from_: InstantText | None = _from_query(),
             to: InstantText | None = _to_query(),
             principal: Principal = Depends(require("reader")),
             ctx: ApiContext = Depends(get_ctx)) -> dict[str, Any]:
    lo, hi = _window(from_, to, ctx)
    c = ctx.store.history.delivery_counts(principal.tenant_id, lo, hi)
    return {"from": format_instant(from_us(lo)), "to": format_instant(from_us(hi)),
            "delivered_fires": c.delivered_fires, "duplicate_attempts": c.duplicate_attempts,
            "possible_duplicate_attempts": c.possible_duplicate_attempts,
            "duplicates_per_million": c.duplicates_per_million,
            "possible_duplicates_per_million": c.possible_per_million, "definition": DELIVERY_DEFINITION}


__all__ = ["router"]
