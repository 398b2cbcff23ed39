"""Operator commands of the trust boundary (the functions they run live in :mod:`fireledger.security`):

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
from typing import Annotated

import typer

from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_any


def _now_us() -> int:
    from fireledger.clock import SystemClock

    return SystemClock().now().latest_us


def audit_verify_cmd(
    db: Db = DEFAULT_DB,
    anchor: Annotated[str | None, typer.Option(
        "--anchor", help="An earlier `audit export` or saved `audit head` lines (JSON lines with seq "
                         "and hash) that the chain must still contain.")] = None,
) -> None:
    """Recompute the keyed audit chain; name the first edited, unkeyed, deleted or reordered row (exit 1)."""
    from fireledger.security.auditlog import AnchorError, check_anchor, read_anchor, verify_chain
    from fireledger.security.envelope import KekError

    anchored = None
    if anchor is not None:
        try:
            with open(anchor, encoding="utf-8") as f:
                anchored = read_anchor(f)
        except OSError as exc:
            fail(f"--anchor: cannot read {anchor} ({type(exc).__name__})")
        except (AnchorError, UnicodeDecodeError) as exc:
            fail(str(exc) if isinstance(exc, AnchorError) else f"--anchor: {anchor} is not UTF-8 text")
    store = open_any(db)
    try:
        report = verify_chain(store)
        if report.ok and anchored is not None:
            report = check_anchor(store, anchored) or report
    except KekError as exc:
        fail(f"the audit chain is keyed by the key-encryption key: {exc}")
    finally:
        store.close()
    if report.ok:
        typer.echo(report.line() + (f"; anchor of {len(anchored)} rows matches" if anchored else ""))
        return
    print(f"fireledger: {report.line()}", file=sys.stderr)
    sys.exit(1)  # a broken chain is a finding, not a usage error (2)


def audit_export_cmd(
    db: Db = DEFAULT_DB,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's rows.")] = None,
) -> None:
    """Print every audit row as JSON lines (seq order), with its hashes."""
    from fireledger.security.auditlog import export_rows

    if tenant is not None and (not tenant or len(tenant) > 100):
        fail("--tenant: must be a tenant id (1-100 characters)")
    store = open_any(db)
    try:
        export_rows(store, sys.stdout, tenant)
    finally:
        store.close()


def audit_head_cmd(
    db: Db = DEFAULT_DB,
) -> None:
    """Print the chain's head (seq, hash, at) as one JSON line: an anchor for `verify --anchor`."""
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    store = open_any(db)
    try:
        seq, h = store.trust.audit_head()
    finally:
        store.close()
    typer.echo(json.dumps({"seq": seq, "hash": h, "at": format_instant(from_us(_now_us()))},
                          separators=(",", ":")))


def tenant_delete_cmd(
    tenant_id: Annotated[str, typer.Argument(help="The tenant's id (tn_…) or its name.")],
    db: Db = DEFAULT_DB,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: this cannot be undone.")] = False,
) -> None:
    """Delete a tenant: its key is destroyed at once (payloads unreadable); a purge follows."""
    from fireledger.security.tenancy import delete_tenant

    if not yes:
        fail("refusing to delete without --yes: the tenant's payloads become unreadable at once")
    if not tenant_id.strip() or len(tenant_id) > 200:
        fail("TENANT_ID: must be a tenant id or name (1-200 characters)")
    store = open_any(db)
    try:
        resolved = tenant_id if store.registry.tenant_state(tenant_id) else store.registry.tenant_id_by_name(tenant_id)
        state = store.registry.tenant_state(resolved) if resolved else None
        if state is None:
            fail(f"TENANT_ID: no tenant {tenant_id!r}")
        if state["deleted_us"] is not None:
            fail(f"TENANT_ID: tenant {resolved} is already deleted")
        out = delete_tenant(store, state["id"], "operator", _now_us())
    finally:
        store.close()
    if out is None:
        fail(f"TENANT_ID: tenant {tenant_id!r} is already deleted")
    typer.echo(json.dumps({"tenant_id": state["id"], "deleted": True, "data_key": "destroyed", **out}))


def tenant_purge_cmd(
    db: Db = DEFAULT_DB,
    grace: Annotated[str, typer.Option("--grace", help="Only tenants deleted at least this long ago.")] = "1h",
) -> None:
    """Purge deleted tenants now (definitions, payloads, history; per-day fire counts are kept)."""
    from datetime import timedelta

    from fireledger.recurrence import RecurrenceError, parse_duration
    from fireledger.security.tenancy import purge

    try:
        grace_td = parse_duration(grace, "--grace", minimum=timedelta(0), maximum=timedelta(days=30))
    except RecurrenceError as exc:
        fail(f"--grace: {exc.problem}")
    store = open_any(db)
    try:
        done = purge(store, _now_us(), grace_td.total_seconds())
    finally:
        store.close()
    for s in done:
        typer.echo(json.dumps(s))
    if not done:
        typer.echo(json.dumps({"purged": 0}))


COMMANDS = (
    Command("verify", audit_verify_cmd, group="audit"),
    Command("export", audit_export_cmd, group="audit"),
    Command("head", audit_head_cmd, group="audit"),
    Command("delete", tenant_delete_cmd, group="tenant"),
    Command("purge", tenant_purge_cmd, group="tenant"),
)

__all__ = ["COMMANDS"]
