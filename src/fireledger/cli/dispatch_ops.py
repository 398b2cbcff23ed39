"""Operator commands of the dispatch plane (they talk to the store directly):

* ``fireledger tenant quota TENANT_ID --db URL [--fires-per-s N] [--inflight N]
  [--catchup-fraction F] [--json]`` — show a tenant's dispatch quota, or change it (parts not given
  keep their value). A change takes effect at the next claim of every dispatch process and is
  written to the audit with the prior value (action ``tenant.quota``, actor ``operator``).

Bad input prints one line naming the flag and exits 2.
"""

from __future__ import annotations

import json
import math
from typing import Annotated

import typer

from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_any


def _view(q: tuple[float, int, float]) -> dict[str, float | int]:
    return {"fires_per_s": q[0], "inflight": q[1], "catchup_fraction": q[2],
            "catchup_per_s": round(q[0] * q[2], 6)}


def tenant_quota_cmd(
    tenant_id: Annotated[str, typer.Argument(help="The tenant's id (tn_…).")],
    db: Db = DEFAULT_DB,
    fires_per_s: Annotated[float | None, typer.Option("--fires-per-s", help="Attempts per second (> 0).")] = None,
    inflight: Annotated[int | None, typer.Option("--inflight", help="Attempts in flight at once (>= 1).")] = None,
    catchup_fraction: Annotated[float | None, typer.Option(
        "--catchup-fraction", help="Share of the quota the catch-up and backfill lanes drain at (0-1].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the quota as JSON.")] = False,
) -> None:
    """Show or change a tenant's dispatch quota (fires/s, in flight, catch-up fraction)."""
    from fireledger.clock import SystemClock

    if fires_per_s is not None and not (math.isfinite(fires_per_s) and fires_per_s > 0):
        fail("--fires-per-s: must be a number > 0")
    if inflight is not None and inflight < 1:
        fail("--inflight: must be an integer >= 1")
    if catchup_fraction is not None and not 0 < catchup_fraction <= 1:
        fail("--catchup-fraction: must be > 0 and <= 1")
    store = open_any(db)
    try:
        prior = store.dispatch.tenant_quota(tenant_id)
        if prior is None:
            fail(f"TENANT_ID: no live tenant {tenant_id!r}")
        changing = any(v is not None for v in (fires_per_s, inflight, catchup_fraction))
        if changing:
            store.dispatch.set_tenant_quota(tenant_id, fires_per_s=fires_per_s, inflight=inflight,
                                   catchup_fraction=catchup_fraction, actor="operator",
                                   now_us=SystemClock().now().latest_us)
        now = store.dispatch.tenant_quota(tenant_id)
    finally:
        store.close()
    assert now is not None
    if as_json:
        typer.echo(json.dumps({"tenant_id": tenant_id, **_view(now)}))
        return
    v = _view(now)
    typer.echo(f"tenant {tenant_id}: {v['fires_per_s']:g} fires/s, {v['inflight']} in flight, catch-up and "
               f"backfill at {v['catchup_fraction']:g} of the quota ({v['catchup_per_s']:g}/s each)"
               + (" (changed; audited)" if changing else ""))


COMMANDS = (Command("quota", tenant_quota_cmd, group="tenant"),)

__all__ = ["COMMANDS"]
