"""Operator commands of the timing plane (they talk to the store; the work is the plane's functions,
:func:`fireledger.timing.shadow.rebuild` and :func:`fireledger.timing.shadow.repartition`):

    fireledger due-index rebuild --db URL [--json]     replace the due index with what the registry implies
    fireledger due-index report  --db URL [--json]     the shadow rebuilder's latest findings
    fireledger partitions show   --db URL [--json]     partition count, lease holders, repartition state
    fireledger partitions set N  --db URL [--json]     change the partition count on a running cluster

``due-index rebuild`` computes every row with the same function as the shadow rebuilder
(:func:`fireledger.timing.shadow.expected_next`) and replaces the index one partition per
transaction (with a progress bar on stderr), so running timing nodes never see it empty; the fire key
makes a decision racing the rebuild harmless. ``partitions set`` records the count, resizes the lease
and shadow tables and rewrites every trigger's stored partition in batches (see docs/operations.md).

Bad input prints one line ``fireledger: <command>: <field>: <problem>`` and exits 2.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_existing

AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def _iso(us: int | None) -> str | None:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    return None if us is None else format_instant(from_us(us))


def _db_errors(exc: Exception) -> None:
    """Turn a store or database error into one line and exit 2 (never a traceback); re-raise others."""
    from fireledger.store import StoreError, is_database_error

    if isinstance(exc, StoreError):
        fail(str(exc))
    if is_database_error(exc):
        first = (str(exc).strip().splitlines() or [""])[0]
        fail(f"--db: the database refused the operation ({type(exc).__name__}: {first}); nothing was "
             "left half-done: run the command again")
    raise exc


def _progress() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


def rebuild_cmd(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """Replace the due index with the rows the registry and the ledger imply (one transaction per
    partition; safe while timing nodes run)."""
    from fireledger.timing.shadow import rebuild, rebuild_partitions

    store = open_existing(db)
    try:
        parts = rebuild_partitions(store)
        with _progress() as progress:
            task = progress.add_task("rebuilding the due index", total=len(parts))
            stats = rebuild(store, on_partition=lambda s: progress.advance(task))
    except Exception as exc:
        _db_errors(exc)
    finally:
        store.close()
    out = {"partitions": len(stats), "triggers": sum(s.triggers for s in stats), "rows": sum(s.rows for s in stats),
           "added": sum(s.added for s in stats), "removed": sum(s.removed for s in stats),
           "changed": sum(s.changed for s in stats)}
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"rebuilt the due index over {out['partitions']} partitions: {out['rows']} rows for "
               f"{out['triggers']} triggers ({out['added']} added, {out['removed']} removed, "
               f"{out['changed']} changed; every other row was already right)")


def report_cmd(db: Db = DEFAULT_DB, as_json: AsJson = False,
               limit: Annotated[int, typer.Option("--limit", help="Divergent rows to list (0-100000).")] = 50) -> None:
    """The shadow rebuilder's latest report: per partition when it was checked and what diverged."""
    from fireledger.domain.timing_records import DIVERGENCE_KINDS

    if not 0 <= limit <= 100_000:
        fail(f"--limit: {limit} is out of range 0-100000")
    store = open_existing(db)
    try:
        n = store.timing.partition_count()
        reports = [r for r in store.timing.shadow_reports() if r.partition < n]
        divs = store.timing.shadow_divergences()
    except Exception as exc:
        _db_errors(exc)
    finally:
        store.close()
    checked = [r for r in reports if r.reported_us]
    out: dict[str, Any] = {
        "partitions": n,
        "checked": len(checked),
        "never_checked": n - len(checked),
        "oldest_report": _iso(min((r.reported_us for r in checked), default=None)),
        "newest_report": _iso(max((r.reported_us for r in checked), default=None)),
        "triggers": sum(r.triggers for r in checked),
        "divergent": sum(r.divergent for r in checked),
        "by_kind": {k: sum(r.count(k) for r in checked) for k in DIVERGENCE_KINDS},
        "repartition_pending": sum(r.repartition_pending for r in checked),
        "divergences": [{"partition": d.partition, "trigger_id": d.trigger_id, "kind": d.kind,
                         "live_next": _iso(d.live_next_us), "live_version": d.live_version,
                         "expected_next": _iso(d.expected_next_us), "expected_version": d.expected_version,
                         "reported_at": _iso(d.reported_us), "node": d.node} for d in divs[:limit]],
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"shadow rebuilder: {out['checked']} of {n} partitions checked "
            f"(oldest report {out['oldest_report'] or '-'}, newest {out['newest_report'] or '-'}); "
            f"{out['triggers']} triggers, {out['divergent']} divergent rows"
            + (f", {out['repartition_pending']} awaiting repartition" if out["repartition_pending"] else ""))
    if divs:
        t = Table(title=f"divergent rows ({min(len(divs), limit)} of {len(divs)} listed)")
        for col in ("partition", "trigger", "kind", "live next", "expected next"):
            t.add_column(col)
        for d in divs[:limit]:
            t.add_row(str(d.partition), d.trigger_id, d.kind, f"{_iso(d.live_next_us) or '-'} v{d.live_version}",
                      f"{_iso(d.expected_next_us) or '-'} v{d.expected_version}")
        c.print(t)


def partitions_show_cmd(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """The partition count, who holds the leases, and how much is left to repartition."""
    from fireledger.clock import SystemClock

    store = open_existing(db)
    try:
        n = store.timing.partition_count()
        leases = [lease for lease in store.timing.lease_table() if lease.partition < n]
        out_of_range = store.timing.count_out_of_range(n)
        pending = sum(r.repartition_pending for r in store.timing.shadow_reports() if r.partition < n)
    except Exception as exc:
        _db_errors(exc)
    finally:
        store.close()
    now = SystemClock().now().earliest_us
    held: dict[str, int] = {}
    for lease in leases:
        if lease.owner is not None and lease.expires_us >= now:
            held[lease.owner] = held.get(lease.owner, 0) + 1
    out = {"partitions": n, "held": dict(sorted(held.items())), "unheld": n - sum(held.values()),
           "stored_out_of_range": out_of_range, "repartition_pending": pending}
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{n} partitions; {sum(held.values())} held by {len(held)} node(s), {out['unheld']} not held")
    for owner, k in sorted(held.items()):
        typer.echo(f"  {owner}: {k}")
    if out_of_range or pending:
        typer.echo(f"repartition unfinished: {out_of_range} triggers stored under a partition ≥ {n}, "
                   f"{pending} reported by the shadow rebuilder; run `fireledger partitions set {n}` again")


def partitions_set_cmd(count: Annotated[int, typer.Argument(help="The new partition count (1-65536).")],
                       db: Db = DEFAULT_DB, as_json: AsJson = False,
                       batch: Annotated[int, typer.Option(
                           "--batch", help="Triggers per transaction (1-10000).")] = 1000) -> None:
    """Change the partition count on a running cluster: record it, resize the lease and shadow
    tables, then rewrite every trigger's stored partition in batches (idempotent: run it again to
    finish an interrupted change)."""
    from fireledger.timing.shadow import repartition

    if not 1 <= count <= 65536:
        fail(f"COUNT: {count} is out of range 1-65536")
    if not 1 <= batch <= 10_000:
        fail(f"--batch: {batch} is out of range 1-10000")
    store = open_existing(db)
    try:
        with _progress() as progress:
            task = progress.add_task(f"repartitioning → {count}", total=None)

            def started(previous: int, total: int) -> None:
                progress.update(task, description=f"repartitioning {previous} → {count}", total=total)

            done = repartition(store, count, batch=batch, on_start=started,
                               on_batch=lambda walked: progress.advance(task, walked))
    except Exception as exc:
        _db_errors(exc)
    finally:
        store.close()
    old, seen, moved, left = done.previous, done.triggers, done.moved, done.stored_out_of_range
    out = {"previous": old, "partitions": count, "triggers": seen, "moved": moved, "stored_out_of_range": left}
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"partition count {old} → {count}: {moved} of {seen} triggers moved to their new partition"
               + (f"; {left} created meanwhile still out of range: run this command again" if left else ""))


COMMANDS = (
    Command("rebuild", rebuild_cmd, group="due-index"),
    Command("report", report_cmd, group="due-index"),
    Command("show", partitions_show_cmd, group="partitions"),
    Command("set", partitions_set_cmd, group="partitions"),
)

__all__ = ["COMMANDS"]
