"""Operator commands of the trust boundary, registered on the ``fireledger`` CLI by :func:`register`:

* ``fireledger audit verify --db URL [--anchor FILE]`` — recompute the keyed audit chain (the key is
  derived from the KEK: ``FIRELEDGER_KEK`` / ``FIRELEDGER_KEK_FILE``); exit 0 and one line when it is
  intact, exit 1 and a line naming the first row that does not check (edited, unkeyed, deleted,
  reordered) otherwise. ``--anchor`` also checks every ``(seq, hash)`` of an earlier export (or saved
  ``audit head`` lines) against the chain: the check that survives an attacker holding the key.
* ``fireledger audit export --db URL [--tenant ID]`` — every audit row as one JSON object per line.
* ``fireledger audit head --db URL`` — the chain's head as one JSON line (``seq``, ``hash``, ``at``):
  ship it regularly to write-once storage, and pass those lines back as ``verify --anchor``.
* ``fireledger tenant delete TENANT_ID --db URL --yes`` — destroy the tenant's key at once (payloads
  unreadable), revoke its tokens, stop its triggers; prints a JSON summary.
* ``fireledger tenant purge --db URL [--grace DURATION]`` — run the purge job once.

Bad input prints one line and exits 2 (like every command); a store that cannot be opened too.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, NoReturn

import typer
from typer._click import exceptions as click_exc

from fireledger.statedir import default_db_url

DB_HELP = "Store URL: sqlite:///PATH or postgresql://… (env FIRELEDGER_DB)."
DEFAULT_DB = default_db_url()   # sqlite:///<state dir>/fireledger.db (fireledger.statedir)


def _fail(message: str) -> NoReturn:
    raise click_exc.UsageError(message)


def _open(db: str):  # type: ignore[no-untyped-def]
    from fireledger.control.operator import OperatorError, open_store

    try:
        return open_store(db)
    except OperatorError as exc:
        _fail(str(exc))


def _now_us() -> int:
    from fireledger.clock import SystemClock

    return SystemClock().now().latest_us


def register(app: typer.Typer, tenant_app: typer.Typer) -> None:
    """Add ``audit verify|export`` and ``tenant delete|purge`` to the CLI."""
    audit_app = typer.Typer(help="The hash-chained audit (operator commands).", no_args_is_help=True,
                            rich_markup_mode=None)
    app.add_typer(audit_app, name="audit")

    @audit_app.command("verify")
    def audit_verify_cmd(
        db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
        anchor: Annotated[str | None, typer.Option(
            "--anchor", help="An earlier `audit export` or saved `audit head` lines (JSON lines with seq "
                             "and hash) that the chain must still contain.")] = None,
    ) -> None:
        """Recompute the keyed audit chain; name the first edited, unkeyed, deleted or reordered row (exit 1)."""
        from .auditlog import AnchorError, check_anchor, read_anchor, verify_chain
        from .envelope import KekError

        anchored = None
        if anchor is not None:
            try:
                with open(anchor, encoding="utf-8") as f:
                    anchored = read_anchor(f)
            except OSError as exc:
                _fail(f"--anchor: cannot read {anchor} ({type(exc).__name__})")
            except (AnchorError, UnicodeDecodeError) as exc:
                _fail(str(exc) if isinstance(exc, AnchorError) else f"--anchor: {anchor} is not UTF-8 text")
        store = _open(db)
        try:
            report = verify_chain(store)
            if report.ok and anchored is not None:
                report = check_anchor(store, anchored) or report
        except KekError as exc:
            _fail(f"the audit chain is keyed by the key-encryption key: {exc}")
        finally:
            store.close()
        if report.ok:
            typer.echo(report.line() + (f"; anchor of {len(anchored)} rows matches" if anchored else ""))
            return
        print(f"fireledger: {report.line()}", file=sys.stderr)
        sys.exit(1)  # a broken chain is a finding, not a usage error (2)

    @audit_app.command("export")
    def audit_export_cmd(
        db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
        tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's rows.")] = None,
    ) -> None:
        """Print every audit row as JSON lines (seq order), with its hashes."""
        from .auditlog import export_rows

        if tenant is not None and (not tenant or len(tenant) > 100):
            _fail("--tenant: must be a tenant id (1-100 characters)")
        store = _open(db)
        try:
            export_rows(store, sys.stdout, tenant)
        finally:
            store.close()

    @audit_app.command("head")
    def audit_head_cmd(
        db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
    ) -> None:
        """Print the chain's head (seq, hash, at) as one JSON line: an anchor for `verify --anchor`."""
        from fireledger.domain.keys import from_us
        from fireledger.recurrence import format_instant

        store = _open(db)
        try:
            seq, h = store.audit_head()
        finally:
            store.close()
        typer.echo(json.dumps({"seq": seq, "hash": h, "at": format_instant(from_us(_now_us()))},
                              separators=(",", ":")))

    @tenant_app.command("delete")
    def tenant_delete_cmd(
        tenant_id: Annotated[str, typer.Argument(help="The tenant's id (tn_…) or its name.")],
        db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
        yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be undone.")] = False,
    ) -> None:
        """Delete a tenant: its key is destroyed at once (payloads unreadable); a purge follows."""
        from .tenancy import delete_tenant

        if not yes:
            _fail("refusing to delete without --yes: the tenant's payloads become unreadable at once")
        if not tenant_id.strip() or len(tenant_id) > 200:
            _fail("TENANT_ID: must be a tenant id or name (1-200 characters)")
        store = _open(db)
        try:
            resolved = tenant_id if store.tenant_state(tenant_id) else store.tenant_id_by_name(tenant_id)
            state = store.tenant_state(resolved) if resolved else None
            if state is None:
                _fail(f"TENANT_ID: no tenant {tenant_id!r}")
            if state["deleted_us"] is not None:
                _fail(f"TENANT_ID: tenant {resolved} is already deleted")
            out = delete_tenant(store, state["id"], "operator", _now_us())
        finally:
            store.close()
        if out is None:
            _fail(f"TENANT_ID: tenant {tenant_id!r} is already deleted")
        typer.echo(json.dumps({"tenant_id": state["id"], "deleted": True, "data_key": "destroyed", **out}))

    @tenant_app.command("purge")
    def tenant_purge_cmd(
        db: Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")] = DEFAULT_DB,
        grace: Annotated[str, typer.Option("--grace", help="Only tenants deleted at least this long ago.")] = "1h",
    ) -> None:
        """Purge deleted tenants now (definitions, payloads, history; per-day fire counts are kept)."""
        from datetime import timedelta

        from fireledger.recurrence import RecurrenceError, parse_duration

        from .tenancy import purge

        try:
            grace_td = parse_duration(grace, "--grace", minimum=timedelta(0), maximum=timedelta(days=30))
        except RecurrenceError as exc:
            _fail(f"--grace: {exc.problem}")
        store = _open(db)
        try:
            done = purge(store, _now_us(), grace_td.total_seconds())
        finally:
            store.close()
        for s in done:
            typer.echo(json.dumps(s))
        if not done:
            typer.echo(json.dumps({"purged": 0}))


__all__ = ["register"]
