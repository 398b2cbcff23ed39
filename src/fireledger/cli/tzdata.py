"""``fireledger tzdata diff``: the live triggers whose instants change with the zone rules, and their
re-resolution (issue 18 item 8; :mod:`fireledger.registry.tzdata`, decisions 0162-0163).

    fireledger tzdata diff [--against DIR] [--count N] [--apply] [--json] --db URL

Lists every active cron trigger with a due row whose stored next instant is not what the running
rules (the pinned tzdata package) give — resolved under other rules, e.g. by a node that ran the
previous release — or, with ``--against DIR`` (a TZif tree such as ``/usr/share/zoneinfo`` or an
unpacked ``tzdata`` wheel's ``tzdata/zoneinfo``), whose next ``--count`` instants differ between
those rules and the running ones. ``--apply`` moves each listed
trigger's due row to the running rules' next instant and appends one audit row per trigger
(``trigger.tzdata_reresolve``, actor ``operator``: both rule versions and instants). A Rich progress
display follows the partitions on long runs; ``--json`` prints one object instead. Exit code 0.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_existing

__all__ = ["COMMANDS", "PROGRESS_FROM"]

#: Partitions from which the progress display is drawn (a scan of fewer is quick).
PROGRESS_FROM = 8


def diff_cmd(
    db: Db = DEFAULT_DB,
    against: Annotated[str | None, typer.Option(
        "--against",
        help="A TZif tree to compare the running rules with (e.g. the previous tzdata's zoneinfo directory).")] = None,
    count: Annotated[int, typer.Option("--count", help="Instants compared per trigger (1-100).")] = 5,
    apply_: Annotated[bool, typer.Option(
        "--apply", help="Re-resolve each listed trigger's next instant under the running rules; audited.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List live triggers whose next instants differ under other zone rules; --apply re-resolves them."""
    from fireledger.recurrence import TZDATA_VERSION
    from fireledger.registry import tzdata as tz

    if not 1 <= count <= tz.MAX_COUNT:
        fail(f"--count: {count} is out of range 1-{tz.MAX_COUNT}")
    rules = None
    if against:
        try:
            rules = tz.load_rules(against)
        except ValueError as exc:
            fail(f"--against: {exc}")
    store = open_existing(db)
    stats = tz.ScanStats()
    try:
        with _Progress(enabled=not as_json) as bar:
            changes = list(tz.scan(store, count=count, other=rules, progress=bar.update, stats=stats))
        applied = {c.trigger_id: tz.apply(store, c, actor="operator", now_us=tz.now_us(), other=rules)
                   for c in changes} if apply_ else {}
    finally:
        store.close()
    out: dict[str, Any] = {
        "running_tzdata": TZDATA_VERSION,
        "against": None if rules is None else {"path": rules.path, "version": rules.version},
        "partitions": stats.partitions, "live": stats.live, "unaffected": stats.unaffected,
        "uncompilable": stats.uncompilable, "count": count, "applied": apply_,
        "changes": [{**c.as_json(), "reresolved": applied.get(c.trigger_id) if apply_ else None}
                    for c in changes],
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    _table(out)


def _table(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    other = out["against"]
    title = f"tzdata diff: running {out['running_tzdata']}" + (
        f" vs {other['version'] or 'unversioned'} ({other['path']})" if other else " vs the stored next instants")
    table = Table(title=title)
    table.add_column("trigger", no_wrap=True)
    for col in ("schedule", "recorded", "stored next", "running", "other", "why"):
        table.add_column(col, overflow="fold")
    for c in out["changes"]:
        why = ", ".join(w for w, on in (("stored next is stale", c["stale"]), ("rules differ", c["differs"])) if on)
        if c["reresolved"] is not None:
            why += "; re-resolved" if c["reresolved"] else "; moved meanwhile, left alone"
        table.add_row(c["trigger_id"], f"{c['cron']} ({c['zone']})", c["recorded_tzdata"] or "—", c["stored_next"],
                      "\n".join(c["running"]), "\n".join(c["other"] or ["—"]), why)
    console = Console()
    console.print(table)
    console.print(f"{len(out['changes'])} of {out['live']} live triggers listed ({out['unaffected']} intervals "
                  f"and one-shots unaffected by zone rules, {out['uncompilable']} not compiling) across "
                  f"{out['partitions']} partitions" + ("; --apply: re-resolved and audited" if out["applied"] else ""))


class _Progress:
    """A Rich progress display over the partitions scanned (≥ :data:`PROGRESS_FROM`), never with --json."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total < PROGRESS_FROM:
            return
        if self._progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), transient=False)
            self._progress.start()
            self._task = self._progress.add_task("partitions scanned", total=total)
        self._progress.update(self._task, completed=done)


COMMANDS = (Command("diff", diff_cmd, group="tzdata"),)
