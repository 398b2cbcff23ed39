"""``fireledger report smearing``: the avoided-peak report (:mod:`fireledger.observe.smearing`) over
every tenant (or one), default window the last hour (it talks to the store directly).
``fireledger report delivery``: the duplicate-delivery rate the ledger measures (decision 0167), over
every tenant (or one), same window.

    fireledger report smearing --db URL [--from T] [--to T] [--tenant ID] [--json]
    fireledger report delivery --db URL [--from T] [--to T] [--tenant ID] [--json]

Bad input prints one line ``fireledger: <command>: <field>: <problem>`` and exits 2.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .backfill import AsJson, instant_us
from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_existing

__all__ = ["COMMANDS"]


def _earliest_now() -> int:
    from fireledger.clock import SystemClock

    return SystemClock().now().earliest_us


FromOpt = Annotated[str | None, typer.Option("--from", help="RFC 3339; scheduled ≥ from (default: to − 1 h).")]
ToOpt = Annotated[str | None, typer.Option("--to", help="RFC 3339; scheduled < to (default: now).")]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Only this tenant's fires.")]


def _window(from_: str | None, to: str | None) -> tuple[int, int]:
    hi = instant_us(to, "--to") if to else _earliest_now()
    if hi <= 0:
        fail("--to: must be after 1970-01-01T00:00:00Z")
    lo = instant_us(from_, "--from") if from_ else max(0, hi - 3600 * 1_000_000)
    if lo < 0:
        fail("--from: must not be before 1970-01-01T00:00:00Z")
    if hi <= lo:
        fail("--to: must be later than --from")
    return lo, hi


def delivery_cmd(db: Db = DEFAULT_DB, from_: FromOpt = None, to: ToOpt = None, tenant: TenantOpt = None,
                 as_json: AsJson = False) -> None:
    """Duplicate deliveries the ledger measured: proven and possible, per million delivered fires."""
    from fireledger.domain.keys import from_us
    from fireledger.observe.lanes import cluster_delivery_counts
    from fireledger.recurrence import format_instant

    lo, hi = _window(from_, to)
    store = open_existing(db)
    try:
        c = (store.history.delivery_counts(tenant, lo, hi) if tenant
             else cluster_delivery_counts(store, lo, hi))
    finally:
        store.close()
    out = {"from": format_instant(from_us(lo)), "to": format_instant(from_us(hi)), "tenant_id": tenant,
           "delivered_fires": c.delivered_fires, "duplicate_attempts": c.duplicate_attempts,
           "possible_duplicate_attempts": c.possible_duplicate_attempts,
           "duplicates_per_million": c.duplicates_per_million,
           "possible_duplicates_per_million": c.possible_per_million}
    if as_json:
        typer.echo(json.dumps(out))
        return
    rate = "—" if c.duplicates_per_million is None else f"{c.duplicates_per_million:.1f}"
    possible = "—" if c.possible_per_million is None else f"{c.possible_per_million:.1f}"
    typer.echo(f"deliveries over [{out['from']}, {out['to']}) — {('tenant ' + tenant) if tenant else 'every tenant'}: "
               f"{c.delivered_fires} fires delivered; {c.duplicate_attempts} proven duplicate(s) ({rate} per "
               f"million), {c.possible_duplicate_attempts} possible ({possible} per million)")


def smearing_cmd(
    db: Db = DEFAULT_DB,
    from_: FromOpt = None,
    to: ToOpt = None,
    tenant: TenantOpt = None,
    as_json: AsJson = False,
) -> None:
    """The peak capacity avoided by jitter smearing (ADR-10): per-second peaks without and with it."""
    from fireledger.observe.smearing import smearing_report

    lo, hi = _window(from_, to)
    store = open_existing(db)
    try:
        rep = smearing_report(store, lo, hi, [tenant] if tenant else None)
    finally:
        store.close()
    out = rep.as_json()
    if as_json:
        typer.echo(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"jitter smearing over [{out['from']}, {out['to']})"
                        + (f" — tenant {tenant}" if tenant else " — every tenant"))
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("second (UTC)")
    table.add_row("on-time scheduled fires", str(rep.fires), "")
    table.add_row("  on whole minutes", str(rep.popular_fires), "")
    table.add_row("  smeared / opted out", f"{rep.smeared_fires} / {rep.opted_out_fires}", "")
    for label, key in (("peak without smearing (fires/s)", "peak_without_smearing"),
                       ("peak with smearing (fires/s)", "peak_with_smearing"),
                       ("peak dispatched, measured (fires/s)", "peak_dispatched")):
        table.add_row(label, str(out[key]["per_s"]), out[key]["at"] or "—")
    ratio = "—" if rep.avoided_ratio is None else f"{rep.avoided_ratio:.0%}"
    table.add_row("avoided peak (fires/s)", f"{rep.avoided_peak_per_s} ({ratio})", "")
    table.add_row("  capped below half the gap to the next instant", str(rep.capped_fires), "")
    late = out["smeared_lateness_s"]
    for label, key in (("smeared lateness raw p50 / p99 / max (s)", "raw"),
                       ("  net of the declared smear", "net_of_smear")):
        table.add_row(label, " / ".join("—" if late[key][q] is None else f"{late[key][q]:.3f}"
                                        for q in ("p50", "p99", "max")), "")
    Console().print(table)
    typer.echo(f"smear cap: {out['smear_cap']}")


COMMANDS = (Command("smearing", smearing_cmd, group="report"), Command("delivery", delivery_cmd, group="report"))
