"""``fireledger preview``: the next instants of a schedule, computed by the same code as the timing loop.

``--explain`` first says the schedule in words, with what DST does to it in the year after
``--from`` (with ``--json``: an object ``{"explanation": …, "instants": […]}`` instead of the array).
``--schedule JSON`` takes a schedule object as the API does (several specs included: each instant then
names the specs that produce it, decision 0155). Bad input prints one line
``fireledger: preview: <flag>: <problem>`` and exits 2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, tzinfo
from typing import Annotated, Any

import typer

from fireledger.recurrence import (
    TZDATA_VERSION,
    Occurrence,
    Recurrence,
    RecurrenceError,
    compile_cron,
    compile_interval,
    compile_once,
    compile_spec,
    explain_schedule,
    format_instant,
    parse_instant,
    preview,
)

from .common import Command, fail

__all__ = ["COMMANDS", "preview_cmd"]

_NOTES = {
    "gap": "wall time does not exist (DST gap): fires when the clock jumps",
    "fold": "wall time occurs twice (DST fold): first occurrence only",
}


def preview_cmd(
    expr: Annotated[str | None, typer.Option(
        "--expr", help="Cron expression: 5 fields, 6 with leading seconds, 7 with seconds and a year.")] = None,
    every: Annotated[str | None, typer.Option("--every", help="Interval, e.g. 90s, 15m.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="One-shot instant (RFC 3339).")] = None,
    schedule: Annotated[str | None, typer.Option(
        "--schedule", help='A schedule object as the API takes it (JSON), e.g. several specs: '
                           '{"specs": [{"cron": "0 9 * * *"}, {"every": "6h"}]}; each instant names its specs.',
    )] = None,
    zone: Annotated[str, typer.Option("--zone", help="IANA zone the wall time is read in.")] = "UTC",
    from_: Annotated[
        str | None, typer.Option("--from", help="Start after this RFC 3339 instant (default: now).")
    ] = None,
    count: Annotated[int, typer.Option("--count", help="How many instants (1-10000).")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
    explain: Annotated[bool, typer.Option(
        "--explain", help="Say the schedule in words, with what DST does to it in the year after --from.")] = False,
) -> None:
    """Show the next instants of a schedule, computed by the same code as the timing loop."""
    forms = [name for name, v in (("--expr", expr), ("--every", every), ("--at", at), ("--schedule", schedule))
             if v is not None]
    if len(forms) != 1:
        fail("give exactly one of --expr, --every, --at, --schedule")
    if not 1 <= count <= 10_000:
        fail(f"--count: {count} is out of range 1-10000")
    rec: Recurrence
    try:
        start = parse_instant(from_, "--from") if from_ is not None else datetime.now(UTC)
        if schedule is not None:
            rec = compile_spec(_schedule_json(schedule), default_anchor=start)
        elif expr is not None:
            rec = compile_cron(expr, zone)
        elif every is not None:
            rec = compile_interval(every, start, zone)
        else:
            assert at is not None
            rec = compile_once(at, zone)
        occurrences = preview(rec, start, count)
    except RecurrenceError as exc:
        flags = {"cron": "--expr", "zone": "--zone", "every": "--every", "at": "--at", "--from": "--from"}
        where = (f"--schedule: {exc.field}" if schedule is not None and exc.field != "--from"
                 else flags.get(exc.field, f"--expr: {exc.field}"))
        fail(f"{where}: {exc.problem}")
    text = explain_schedule(rec, start) if explain else None
    if as_json:
        items = [_item(occ) for occ in occurrences]
        typer.echo(json.dumps(items if text is None else {"explanation": text, "instants": items}))
        return
    if text is not None:
        typer.echo(text)
    _table(occurrences, zone, getattr(rec, "zone", UTC))


def _schedule_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        fail("--schedule: is not JSON (a schedule object as the API takes it)")


def _item(occ: Occurrence) -> dict[str, object]:
    item: dict[str, object] = {"instant": format_instant(occ.instant), "tzdata_version": TZDATA_VERSION}
    if occ.wall is not None:
        item["local"] = occ.wall.replace(tzinfo=None).isoformat()
    if occ.note:
        item["dst"] = occ.note
    if occ.specs:
        item["specs"] = list(occ.specs)
    return item


def _table(occurrences: Sequence[Occurrence], zone: str, tz: tzinfo) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"next {len(occurrences)} instants ({zone}, tzdata {TZDATA_VERSION})")
    table.add_column("#", justify="right")
    table.add_column("instant (UTC)")
    table.add_column(f"wall time ({zone})")
    table.add_column("note")
    for i, occ in enumerate(occurrences, 1):
        wall = occ.instant.astimezone(tz)
        specs = f"specs {', '.join(map(str, occ.specs))}" if occ.specs else ""
        note = "; ".join(p for p in (specs, _NOTES.get(occ.note or "", "")) if p)
        table.add_row(str(i), format_instant(occ.instant), wall.strftime("%Y-%m-%d %H:%M:%S %Z"), note)
    Console().print(table)
    if not occurrences:
        typer.echo("the schedule has no instants after --from")


COMMANDS = (Command("preview", preview_cmd),)
