"""The fire record: the one JSON shape of a decided fire, as operators and tenants see it.

Contract:

* :func:`fire_record` is a fire's public shape — key, instants (RFC 3339, UTC), state, cause, kind,
  lane, version, tzdata version, who decided it and the clock bound ε, its DST label (``dst``:
  ``{"kind": "gap"|"fold", "wall": …}`` or null, decision 0160), lateness, and every attempt
  with its duration. It is the history API's item (``control.views.fire_view``), the CLI's
  ``--json`` of ``fires``/``why``, and the body of every retention archive line. It never carries a
  payload, a target secret or request data.
* :func:`archive_record` is one line of a history archive (``fireledger history export|purge`` and
  the control plane's retention pass): :func:`fire_record` plus ``tenant_id`` and ``work_outcome``.
  Archives outlive the API, so this shape changes only additively.

Pure: no I/O, no clock reads. Lives below the control plane so that retention (and any other
writer of fire records) does not depend on the HTTP API.
"""

from __future__ import annotations

from typing import Any

from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import Fire
from fireledger.recurrence import format_instant, parse_dst_label, parse_specs

__all__ = ["archive_record", "fire_record", "instant"]


def instant(us: int | None) -> str | None:
    """``us`` (µs since the epoch, UTC) as an RFC 3339 instant; ``None`` stays ``None``."""
    return None if us is None else format_instant(from_us(us))


def fire_record(f: Fire) -> dict[str, Any]:
    """The public record of fire ``f`` (see the module contract). Never a payload."""
    return {
        "key": str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq)),
        "trigger_id": f.trigger_id,
        "scheduled_instant": instant(f.scheduled_us),
        "decided_at": instant(f.decided_us),
        "dispatched_at": instant(f.dispatched_us),
        "finished_at": instant(f.finished_us),
        "state": f.state,
        "cause": f.cause,
        "kind": f.kind,
        "lane": f.lane,
        "version": f.version,
        "tzdata_version": f.tzdata_version,
        "decided_by": f.decided_by,
        "eps_s": None if f.eps_us is None else f.eps_us / 1e6,
        "eps_source": f.eps_source,
        "dst": parse_dst_label(f.dst),
        "specs": parse_specs(f.specs),
        "lateness_s": None if f.dispatched_us is None else (f.dispatched_us - f.scheduled_us) / 1e6,
        "redriven_at": instant(f.redriven_us),
        "attempts": [
            {"attempt": a.number, "started_at": instant(a.started_us), "finished_at": instant(a.finished_us),
             "result": a.result, "http_status": a.http_status, "error": a.error,
             "duration_s": None if a.finished_us is None else (a.finished_us - a.started_us) / 1e6}
            for a in f.attempt_list
        ],
    }


def archive_record(f: Fire, work_outcome: str | None) -> dict[str, Any]:
    """One history archive line: :func:`fire_record` plus ``tenant_id`` and ``work_outcome``."""
    item = fire_record(f)
    item["tenant_id"] = f.tenant_id
    item["work_outcome"] = work_outcome
    return item
