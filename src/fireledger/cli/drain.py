"""The declared drain (decision 0166; operator commands that talk to the store directly):

* ``fireledger drain start --for 2h --reason TEXT [--db URL] [--json]`` — declare that a backlog is
  draining on purpose (after planned maintenance, a known outage, a large backfill): the shipped
  page on the due age (``FireledgerDueAgeHigh``) is suppressed until ``drain stop`` or the expiry,
  whichever is first. A drain already in force is superseded (declare again to extend or shorten).
  ``--for`` is ``<n>s|m|h|d``, at most 7 d. Audited (action ``drain.start``, actor ``operator``).
* ``fireledger drain stop [--db URL] [--json]`` — end the drain in force (audited: ``drain.stop``);
  exit 1 when none is in force.
* ``fireledger drain status [--db URL] [--json] [--page-threshold-s S]`` — the drain in force (or
  the latest one, ended), the due age per lane, the page's due age and whether the page fires now
  (due age over the threshold, default 60 s as shipped, and no drain in force).

Bad input prints one line naming the flag and exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from fireledger.domain.lane_records import PAGE_THRESHOLD_S, age_s, page_due_age_s, page_firing, parse_duration_s
from fireledger.domain.lane_records import validate_reason as check_reason

from .common import DEFAULT_DB, Command, Db, fail
from .evidence import AsJson, now_us, when
from .operator import open_existing

ACTOR = "operator"
T = TypeVar("T")
LANES = ("on-time", "catch-up", "backfill")


def _drain_line(d: dict[str, Any] | None) -> str:
    if d is None:
        return "drain: none declared"
    if d["in_force"]:
        state = f"in force, {d['remaining_s']:.0f} s left"
    else:
        state = f"ended {when(d['ended_us'] or d['expires_us'])}"
    return (f"drain {d['id']}: {state} · declared {when(d['started_us'])} by {d['actor']} · until "
            f"{when(d['expires_us'])} · reason: {d['reason']}")


def _audited(act: Callable[[], T]) -> T:
    """Run an audited act; a missing key-encryption key (the audit chain is keyed) is one line."""
    from fireledger.security.envelope import KekError

    try:
        return act()
    except KekError as exc:
        fail(str(exc))


def drain_start_cmd(
    for_: Annotated[str, typer.Option("--for", help="How long the drain holds: <n>s|m|h|d (at most 7d).")],
    reason: Annotated[str, typer.Option("--reason", help="Why the backlog drains on purpose (audited).")],
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """Declare a drain: the due-age page is suppressed until `drain stop` or the expiry (audited)."""
    try:
        seconds = parse_duration_s(for_)
    except ValueError as exc:
        fail(f"--for: {exc}")
    try:
        text = check_reason(reason)
    except ValueError as exc:
        fail(f"--reason: {exc}")
    store = open_existing(db)
    try:
        now = now_us()
        drain = _audited(lambda: store.dispatch.drain_start(now + seconds * 1_000_000, text, ACTOR, now))
    finally:
        store.close()
    view = drain.as_json(now)
    typer.echo(json.dumps(view) if as_json else _drain_line(view) + " (audited)")


def drain_stop_cmd(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """End the drain in force (audited); exit 1 when none is."""
    store = open_existing(db)
    try:
        now = now_us()
        drain = _audited(lambda: store.dispatch.drain_stop(ACTOR, now))
    finally:
        store.close()
    if drain is None:
        typer.echo(json.dumps({"stopped": None}) if as_json else "drain: none in force")
        sys.exit(1)   # nothing to stop is a finding, not a usage error (2)
    view = drain.as_json(now)
    typer.echo(json.dumps({"stopped": view}) if as_json else _drain_line(view) + " (stopped; audited)")


def drain_status_cmd(
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
    page_threshold_s: Annotated[float, typer.Option(
        "--page-threshold-s", help="The page's threshold to evaluate (the shipped rule: 60).")] = PAGE_THRESHOLD_S,
) -> None:
    """The drain, the due age per lane and whether the due-age page fires now."""
    if not page_threshold_s > 0:
        fail("--page-threshold-s: must be a number > 0")
    store = open_existing(db)
    try:
        now = now_us()
        in_force = store.dispatch.drain_in_force(now)
        latest = in_force or store.dispatch.drain_latest()
        since = store.history.lane_due_since(LANES)
        undecided = store.history.undecided_since()
    finally:
        store.close()
    page_age = page_due_age_s(now, undecided, since)
    ages = {lane: age_s(now, since.get(lane)) for lane in LANES}
    drain_view = None if latest is None else latest.as_json(now)
    page: dict[str, Any] = {
        "due_age_s": page_age, "threshold_s": page_threshold_s, "over_threshold": page_age > page_threshold_s,
        "firing": page_firing(page_age, in_force, now, page_threshold_s),
        "suppressed_by_drain": page_age > page_threshold_s and in_force is not None}
    out: dict[str, Any] = {
        "now": when(now),
        "drain": drain_view,
        "lane_due_age_s": ages,
        "undecided_due_age_s": age_s(now, undecided),
        "page": page,
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    verdict = "FIRING" if page["firing"] else ("suppressed by the drain" if page["suppressed_by_drain"] else "quiet")
    typer.echo(f"page: {verdict} (due age {page_age:.1f} s, threshold {page_threshold_s:g} s) · as of {out['now']}")
    typer.echo(_drain_line(drain_view))
    typer.echo("due age per lane: " + ", ".join(f"{lane} {ages[lane]:.1f} s" for lane in LANES)
               + f" · undecided {out['undecided_due_age_s']:.1f} s")


COMMANDS = (
    Command("start", drain_start_cmd, group="drain"),
    Command("stop", drain_stop_cmd, group="drain"),
    Command("status", drain_status_cmd, group="drain"),
)

__all__ = ["COMMANDS"]
