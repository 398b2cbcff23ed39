"""The ``fireledger`` command.

Bad input never produces a traceback: usage and input errors print one line,
``fireledger: <field>: <problem>``, and exit with code 2.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from typing import Annotated, NoReturn

import typer

# Typer vendors click; its exception classes are the ones raised by the parser.
from typer._click import exceptions as click_exc

from fireledger.recurrence import (
    TZDATA_VERSION,
    RecurrenceError,
    compile_cron,
    compile_interval,
    compile_once,
    format_instant,
    parse_instant,
    preview,
)
from fireledger.security import commands as _trust_commands
from fireledger.statedir import default_db_url

app = typer.Typer(
    name="fireledger",
    help="A durable, multi-tenant scheduled-trigger service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """fireledger: durable, multi-tenant scheduled triggers. Never early; a keyed record before delivery."""


class InputError(click_exc.UsageError):
    """Bad input at the CLI boundary (one line, exit 2)."""


def fail(message: str) -> NoReturn:
    raise InputError(message)


@app.command("preview")
def preview_cmd(
    expr: Annotated[str | None, typer.Option("--expr", help="Cron expression (5 or 6 fields).")] = None,
    every: Annotated[str | None, typer.Option("--every", help="Interval, e.g. 90s, 15m.")] = None,
    at: Annotated[str | None, typer.Option("--at", help="One-shot instant (RFC 3339).")] = None,
    zone: Annotated[str, typer.Option("--zone", help="IANA zone the wall time is read in.")] = "UTC",
    from_: Annotated[
        str | None, typer.Option("--from", help="Start after this RFC 3339 instant (default: now).")
    ] = None,
    count: Annotated[int, typer.Option("--count", help="How many instants (1-10000).")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False,
) -> None:
    """Show the next instants of a schedule, computed by the same code as the timing loop."""
    forms = [name for name, v in (("--expr", expr), ("--every", every), ("--at", at)) if v is not None]
    if len(forms) != 1:
        fail("give exactly one of --expr, --every, --at")
    if not 1 <= count <= 10_000:
        fail(f"--count: {count} is out of range 1-10000")
    try:
        start = parse_instant(from_, "--from") if from_ is not None else datetime.now(UTC)
        if expr is not None:
            rec = compile_cron(expr, zone)
        elif every is not None:
            rec = compile_interval(every, start, zone)
        else:
            assert at is not None
            rec = compile_once(at, zone)
        occurrences = preview(rec, start, count)
    except RecurrenceError as exc:
        flags = {"cron": "--expr", "zone": "--zone", "every": "--every", "at": "--at", "--from": "--from"}
        where = flags.get(exc.field, f"--expr: {exc.field}")
        fail(f"{where}: {exc.problem}")
    if as_json:
        items = []
        for occ in occurrences:
            item: dict[str, object] = {"instant": format_instant(occ.instant), "tzdata_version": TZDATA_VERSION}
            if occ.wall is not None:
                item["local"] = occ.wall.replace(tzinfo=None).isoformat()
            if occ.note:
                item["dst"] = occ.note
            items.append(item)
        typer.echo(json.dumps(items))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"next {len(occurrences)} instants ({zone}, tzdata {TZDATA_VERSION})")
    table.add_column("#", justify="right")
    table.add_column("instant (UTC)")
    table.add_column(f"wall time ({zone})")
    table.add_column("note")
    notes = {
        "gap": "wall time does not exist (DST gap): fires when the clock jumps",
        "fold": "wall time occurs twice (DST fold): first occurrence only",
    }
    for i, occ in enumerate(occurrences, 1):
        wall = occ.instant.astimezone(rec.zone if hasattr(rec, "zone") else UTC)
        table.add_row(str(i), format_instant(occ.instant), wall.strftime("%Y-%m-%d %H:%M:%S %Z"),
                      notes.get(occ.note or "", ""))
    Console().print(table)
    if not occurrences:
        typer.echo("the schedule has no instants after --from")


DB_HELP = "Store URL: sqlite:///PATH or postgresql://… (env FIRELEDGER_DB)."
DEFAULT_DB = default_db_url()   # sqlite:///<state dir>/fireledger.db (fireledger.statedir)


def _roles_command(roles: tuple[str, ...], db: str, listen: str | None) -> None:
    from fireledger import service
    from fireledger.store import StoreError

    if listen is not None:
        try:
            service.parse_listen(listen)
        except ValueError as exc:
            fail(str(exc))
    if "dispatch" in roles:   # lane settings (FIRELEDGER_LANE_*) and internal-target modules
        from fireledger.dispatch.internal import load_modules
        from fireledger.dispatch.runner import check_env

        try:
            check_env()
            load_modules(os.environ.get("FIRELEDGER_INTERNAL_MODULES"))
        except ValueError as exc:
            fail(str(exc))
    try:
        service.run(db, roles, listen)
    except (StoreError, ValueError) as exc:  # ValueError: a bad FIRELEDGER_* setting, named
        fail(str(exc))


@app.command("serve")
def serve_cmd(
    db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT for the HTTP API.")] = "127.0.0.1:8080",
) -> None:
    """Run control, timing and dispatch in one process."""
    _roles_command(("control", "timing", "dispatch"), db, listen)


@app.command("timing")
def timing_cmd(
    db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
) -> None:
    """Run the timing plane alone."""
    _roles_command(("timing",), db, None)


@app.command("dispatch")
def dispatch_cmd(
    db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
) -> None:
    """Run the dispatch plane alone."""
    _roles_command(("dispatch",), db, None)


@app.command("control")
def control_cmd(
    db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT for the HTTP API.")] = "127.0.0.1:8080",
) -> None:
    """Run the control plane (HTTP API) alone."""
    _roles_command(("control",), db, listen)


# --- operator commands: tenants and schema (talk to the store directly) -------------------------

tenant_app = typer.Typer(help="Tenants (operator commands; talk to the store directly).",
                         no_args_is_help=True, rich_markup_mode=None)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(tenant_app, name="tenant")
app.add_typer(db_app, name="db")
_trust_commands.register(app, tenant_app)  # audit verify|export, tenant delete|purge


@tenant_app.command("create")
def tenant_create_cmd(
    name: Annotated[str, typer.Argument(help="Tenant name (unique).")],
    db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"tenant_id": …, "token": …}.')] = False,
) -> None:
    """Create a tenant and a token carrying every role of it (the token is shown only once)."""
    from fireledger.control.operator import OperatorError, tenant_create

    try:
        tenant_id, token = tenant_create(db, name)
    except OperatorError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps({"tenant_id": tenant_id, "token": token}))
        return
    typer.echo(f"created tenant {name!r}: {tenant_id}")
    typer.echo(f"token (shown only once; send as 'Authorization: Bearer <token>'): {token}")


@db_app.command("upgrade")
def db_upgrade_cmd(
    db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
) -> None:
    """Apply every missing schema migration (PostgreSQL needs this; SQLite migrates on first use)."""
    from fireledger.control.operator import OperatorError, db_upgrade

    try:
        applied, version = db_upgrade(db)
    except OperatorError as exc:
        fail(str(exc))
    if applied:
        typer.echo(f"applied migrations {', '.join(str(v) for v in applied)}; schema at version {version}")
    else:
        typer.echo(f"schema already at version {version}; nothing to apply")


# Operator evidence commands (triggers, fires, why, status, history export|purge): fireledger.cli_ops.
from fireledger.cli_ops import register as _register_ops  # noqa: E402

_register_ops(app)

# The timing plane's operator commands (due-index rebuild|report, partitions show|set).
from fireledger.timing.commands import register as _register_timing  # noqa: E402

_register_timing(app)

# The dispatch plane's operator commands (tenant quota).
from fireledger.dispatch.commands import register as _register_dispatch  # noqa: E402

_register_dispatch(tenant_app)

# Backfill and the smearing report (fireledger backfill, fireledger report smearing).
from fireledger.cli_backfill import register as _register_backfill  # noqa: E402

_register_backfill(app)

# The state directory and the signing key ring (fireledger init, fireledger keys show|stage|rotate|prune).
from fireledger.cli_keys import register as _register_keys  # noqa: E402

_register_keys(app)


def main() -> None:
    """Entry point: run the app; turn usage and input errors into one line and exit code 2."""
    try:
        app(standalone_mode=False)
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)
        sys.exit(2)
    except click_exc.UsageError as exc:
        msg = exc.format_message().replace("\n", " ")
        if exc.ctx is not None and exc.ctx.command.name not in (None, "fireledger"):
            msg = f"{exc.ctx.command.name}: {msg}"
        print(f"fireledger: {msg}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("fireledger: aborted", file=sys.stderr)
        sys.exit(130)
    except click_exc.ClickException as exc:
        print(f"fireledger: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
