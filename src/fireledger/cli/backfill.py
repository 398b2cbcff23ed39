"""``fireledger backfill``: backfill one trigger over a past window (it talks to the store directly).

    fireledger backfill TRIGGER_ID --from T --to T [--dry-run] [--skip-delivered] [--max N] --db URL

``backfill`` follows exactly the API's rules (:mod:`fireledger.backfill`): the trigger's current
schedule's instants in ``[from, to)``, ``to`` not after now, at most ``FIRELEDGER_BACKFILL_MAX``
(or ``--max``) instants, keys with sequence 2, kind and lane ``backfill``, all fires and the audit row
(actor ``operator``) in one transaction. A Rich progress display follows the computation of the
instants and the commit; ``--dry-run`` lists the plan and stores nothing.

Bad input prints one line ``fireledger: <command>: <field>: <problem>`` and exits 2.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from fireledger.domain.keys import to_us
from fireledger.recurrence import RecurrenceError, parse_instant

from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_existing

__all__ = ["COMMANDS", "PROGRESS_FROM", "instant_us"]

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
_FLAGS = {"from": "--from", "to": "--to", "schedule": "TRIGGER_ID"}
#: Below this many instants the progress display is not worth drawing.
PROGRESS_FROM = 1000


def instant_us(text: str, flag: str) -> int:
    """``text`` as µs since the epoch; a bad or out-of-range instant is a :func:`fail` naming ``flag``."""
    try:
        return to_us(parse_instant(text, flag))
    except (RecurrenceError, OverflowError, ValueError):
        fail(f"{flag}: must be an RFC 3339 instant with an offset, e.g. 2026-03-29T01:30:00Z")


def backfill_cmd(
    trigger_id: Annotated[str, typer.Argument(help="Trigger id (tr_…).")],
    from_: Annotated[str, typer.Option("--from", help="RFC 3339: the window's start (included).")],
    to: Annotated[str, typer.Option("--to", help="RFC 3339: the window's end (excluded), not after now.")],
    db: Db = DEFAULT_DB,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be created; store nothing.")] = False,
    skip_delivered: Annotated[bool, typer.Option(
        "--skip-delivered", help="Leave out instants that already hold a delivered fire.")] = False,
    max_fires: Annotated[int | None, typer.Option(
        "--max", help="Maximum instants (default FIRELEDGER_BACKFILL_MAX, 1000; at most 100000).")] = None,
    as_json: AsJson = False,
) -> None:
    """Backfill one trigger over a past window: backfill fires in the backfill lane, audited."""
    from fireledger.clock import SystemClock
    from fireledger.registry import Conflict, Invalid, NotFound, Registry

    lo = instant_us(from_, "--from")
    hi = instant_us(to, "--to")
    limit = _max_fires(max_fires)
    store = open_existing(db)
    try:
        reg = Registry(store)
        try:
            found = reg.current_any(trigger_id)
        except NotFound as exc:
            fail(f"TRIGGER_ID: no trigger {trigger_id!r}" if exc.what == "trigger"
                 else f"TRIGGER_ID: trigger {trigger_id!r} has no current version")
        t = found.trigger
        with _Progress(enabled=not as_json) as bar:
            try:
                # The clock's earliest bound is "now"; its ε is recorded on every fire (invariant 18).
                res = reg.backfill(found, lo, hi, now=SystemClock().now(), actor="operator", decided_by="operator",
                                   dry_run=dry_run, skip_delivered=skip_delivered, max_fires=limit,
                                   on_instants=bar.instants, on_commit=bar.commit)
            except Conflict as exc:
                fail(f"TRIGGER_ID: {exc.detail}")
            except Invalid as exc:
                field, problem = exc.errors[0]
                fail(f"{_FLAGS.get(field, field)}: {problem}")
    finally:
        store.close()
    out = res.as_json()
    if as_json:
        typer.echo(json.dumps(out))
        return
    _backfill_table(t, res, out, dry_run)


def _max_fires(max_fires: int | None) -> int:
    from fireledger.backfill import HARD_MAX, max_fires_from_env

    if max_fires is None:
        try:
            return max_fires_from_env()
        except ValueError as exc:
            fail(str(exc))
    if not 1 <= max_fires <= HARD_MAX:
        fail(f"--max: {max_fires} is out of range 1-{HARD_MAX}")
    return max_fires


def _backfill_table(t: Any, res: Any, out: dict[str, Any], dry_run: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    verb = "would create" if dry_run else "created"
    table = Table(title=f"backfill of {t.name} ({t.id}) v{res.version} over [{out['from']}, {out['to']})"
                        + (" — dry run, nothing stored" if dry_run else ""))
    for col in ("instant", "key", "outcome"):
        table.add_column(col, overflow="fold")
    for item in out["items"]:
        table.add_row(item["instant"], item["key"], item["outcome"])
    console = Console()
    console.print(table)
    console.print(f"{res.instants} instants: {verb} {res.created}, already present {res.already_present}, "
                  f"skipped (delivered) {res.skipped_delivered}; lane backfill"
                  + (" (only the first 1000 listed)" if out["items_truncated"] else ""))


class _Progress:
    """A Rich progress display for a backfill: instants found, then fires committed. Drawn only for
    large windows (≥ 1000 instants) and never with ``--json``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._find: Any = None
        self._commit: Any = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _start(self) -> Any:
        if self._progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), transient=False)
            self._progress.start()
        return self._progress

    def instants(self, found: int) -> None:
        if not self.enabled or found < PROGRESS_FROM:
            return
        p = self._start()
        if self._find is None:
            self._find = p.add_task("computing instants", total=None)
        p.update(self._find, completed=found)

    def commit(self, done: int, total: int) -> None:
        if not self.enabled or total < PROGRESS_FROM:
            return
        p = self._start()
        if self._find is not None:
            p.update(self._find, total=p.tasks[self._find].completed, completed=p.tasks[self._find].completed)
        if self._commit is None:
            self._commit = p.add_task("committing backfill fires", total=total)
        p.update(self._commit, completed=done)


COMMANDS = (Command("backfill", backfill_cmd),)
