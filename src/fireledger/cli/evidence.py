"""Operator commands: evidence from the store, as Rich tables (they talk to the store directly).

    fireledger triggers --db URL [--tenant ID]        every trigger: state, next instant, recent health
    fireledger fires TRIGGER_ID --db URL [filters]    one trigger's fires, newest first
    fireledger why FIRE_KEY --db URL                  the story of one fire
    fireledger status --db URL                        nodes, leases, ε, due age per partition, lanes

``--json`` prints the fire records of :mod:`fireledger.observe.records` (the history API's items):
never a payload. History retention (``history export|purge``) is :mod:`fireledger.cli.history`.

Bad input prints one line ``fireledger: <command>: <field>: <problem>`` and exits 2.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from fireledger.domain.keys import FireKey, from_us, to_us
from fireledger.recurrence import RecurrenceError, format_instant, parse_instant

from .common import DEFAULT_DB, Command, Db, fail
from .operator import open_existing

__all__ = ["COMMANDS", "instant_us", "now_us", "when"]

_STATE_STYLE = {"delivered": "green", "pending": "blue", "dispatching": "blue", "held": "cyan", "failed": "red",
                "unknown": "yellow", "expired": "bright_black", "skipped": "magenta"}

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def now_us() -> int:
    """The system clock's latest bound (µs)."""
    from fireledger.clock import SystemClock

    return SystemClock().now().latest_us


def when(us: int | None) -> str:
    """An instant for a table cell: RFC 3339, ``—`` for none, the raw µs when out of range."""
    if us is None:
        return "—"
    try:
        return format_instant(from_us(us))
    except (OverflowError, ValueError):
        return f"{us} µs (out of range)"


def instant_us(text: str, flag: str) -> int:
    """``text`` as µs since the epoch; a bad instant is a :func:`fail` naming ``flag``."""
    try:
        return to_us(parse_instant(text, flag))
    except RecurrenceError:
        fail(f"{flag}: must be an RFC 3339 instant with an offset, e.g. 2026-03-29T01:30:00Z")


def _secs(us: int | None) -> str:
    if us is None:
        return "—"
    s = us / 1e6
    return f"{s * 1000:.0f} ms" if abs(s) < 1 else f"{s:.2f} s"


def _state(s: str) -> str:
    style = _STATE_STYLE.get(s)
    return f"[{style}]{s}[/{style}]" if style else s


def _console() -> Any:
    from rich.console import Console

    return Console()


def triggers_cmd(
    db: Db = DEFAULT_DB,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's triggers.")] = None,
    as_json: AsJson = False,
) -> None:
    """List triggers of every tenant (or one): state, next instant and the health of recent fires."""
    store = open_existing(db)
    try:
        rows = []
        after = ""
        while True:
            page = store.history.ops_triggers(tenant, after=after, limit=1000)
            for t in page:
                recent = store.history.recent_states(t.tenant_id, t.id, 10)
                rows.append({"id": t.id, "tenant_id": t.tenant_id, "name": t.name, "state": t.state.value,
                             "partition": t.partition, "next_instant": None if t.next_us is None
                             else when(t.next_us), "recent": recent})
            if len(page) < 1000:
                break
            after = page[-1].id
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(rows))
        return
    _triggers_table(rows, tenant)


def _triggers_table(rows: list[dict[str, Any]], tenant: str | None) -> None:
    from rich.table import Table

    table = Table(title=f"{len(rows)} triggers" + (f" of tenant {tenant}" if tenant else ""))
    for col in ("trigger", "tenant", "name", "state", "partition", "next instant", "last 10 fires"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("name", "last 10 fires"))
    for r in rows:
        ok = sum(1 for s in r["recent"] if s == "delivered")
        health = f"{ok}/{len(r['recent'])} delivered" if r["recent"] else "no fires yet"
        bad = sorted({s for s in r["recent"] if s in ("failed", "unknown", "expired")})
        if bad:
            health += " · " + ", ".join(_state(s) for s in bad)
        table.add_row(r["id"], r["tenant_id"], r["name"], _state(r["state"]), str(r["partition"]),
                      r["next_instant"] or "—", health)
    _console().print(table)


def fires_cmd(
    trigger_id: Annotated[str, typer.Argument(help="Trigger id (tr_…).")],
    db: Db = DEFAULT_DB,
    from_: Annotated[str | None, typer.Option("--from", help="RFC 3339; scheduled ≥ from.")] = None,
    to: Annotated[str | None, typer.Option("--to", help="RFC 3339; scheduled < to.")] = None,
    state: Annotated[str | None, typer.Option("--state", help="A state or comma-separated states.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="How many, newest first (1-10000).")] = 50,
    as_json: AsJson = False,
) -> None:
    """Show a trigger's fires, newest first: scheduled, decided, dispatched, lateness, state, cause."""
    from fireledger.domain.history_records import ALL_STATES
    from fireledger.observe.records import fire_record

    if not 1 <= limit <= 10_000:
        fail(f"--limit: {limit} is out of range 1-10000")
    lo = instant_us(from_, "--from") if from_ else None
    hi = instant_us(to, "--to") if to else None
    if lo is not None and hi is not None and hi <= lo:
        fail("--to: must be later than --from")
    states = None
    if state is not None:
        states = [s.strip() for s in state.split(",")]
        if any(s not in ALL_STATES for s in states):
            fail(f"--state: must be one or more of {', '.join(ALL_STATES)}")
    store = open_existing(db)
    try:
        t = store.history.trigger_by_id(trigger_id)
        if t is None:
            fail(f"TRIGGER_ID: no trigger {trigger_id!r}")
        fires = store.history.history_fires(t.tenant_id, trigger_id=t.id, from_us=lo, to_us=hi, states=states,
                                    limit=limit, descending=True)
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps([fire_record(f) for f in fires]))
        return
    _fires_table(fires, t)


def _fires_table(fires: list[Any], t: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{len(fires)} fires of {t.name} ({t.id}), newest first")
    for col in ("scheduled", "state", "decided (by)", "dispatched", "lateness", "attempts", "cause"):
        table.add_column(col, overflow="fold", no_wrap=col in ("scheduled", "state", "lateness"))
    for f in fires:
        last = f.attempt_list[-1] if f.attempt_list else None
        att = "0" if last is None else f"{len(f.attempt_list)} · {last.result or 'running'}" + (
            f" ({last.http_status})" if last.http_status else "")
        table.add_row(when(f.scheduled_us), _state(f.state), f"{when(f.decided_us)}\n{f.decided_by}",
                      when(f.dispatched_us),
                      _secs(None if f.dispatched_us is None else f.dispatched_us - f.scheduled_us), att,
                      f.cause or "")
    _console().print(table)


def why_cmd(
    fire_key: Annotated[str, typer.Argument(help="Fire key: tenant.trigger.YYYYMMDDTHHMMSSZ.seq")],
    db: Db = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """The story of one fire: when it was due, who decided it, every attempt, why late/skipped/expired."""
    from rich.table import Table

    from fireledger.control.history import fire_story
    from fireledger.observe.records import fire_record

    try:
        key = FireKey.parse(fire_key)
    except ValueError:
        fail("FIRE_KEY: is not a fire key (tenant.trigger.YYYYMMDDTHHMMSSZ.seq)")
    store = open_existing(db)
    try:
        fire = store.history.get_fire(key)
        if fire is None:
            fail(f"FIRE_KEY: no fire {fire_key} in this store (purged, or never decided)")
        trigger = store.history.trigger_by_id(fire.trigger_id)
        version = store.registry.get_version(fire.trigger_id, fire.version)
        story = fire_story(fire, trigger, version, now_us=now_us())
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"fire": fire_record(fire), "story": [{"at": w, "text": t} for w, t in story]}))
        return
    table = Table(title=f"why: {fire_key} — {fire.state}", show_lines=False)
    table.add_column("when (UTC)", no_wrap=True)
    table.add_column("what happened", overflow="fold")
    for at, text in story:
        table.add_row(at or "", text)
    _console().print(table)


def status_cmd(db: Db = DEFAULT_DB, as_json: AsJson = False) -> None:
    """Cluster status: the store's role (primary, synchronous standby, promotions), nodes with ε and
    heartbeat, partition leases, due age per partition, lanes."""
    from fireledger.store.role import read_role

    store = open_existing(db)
    try:
        role = read_role(store)
        now = now_us()
        nodes = store.history.node_rows()
        leases = store.history.lease_rows()
        waiting = store.history.due_waiting_by_partition(now)
        depths = store.history.lane_depths()
    finally:
        store.close()
    ages = {p: (now - oldest) / 1e6 for p, oldest in waiting.items()}
    out = {
        "now": when(now),
        "store": role.as_dict(),
        "nodes": [{"id": n.id, "role": n.role, "eps_s": None if n.eps_us is None else n.eps_us / 1e6,
                   "eps_source": n.eps_source, "heartbeat_age_s": (now - n.heartbeat_us) / 1e6}
                  for n in nodes],
        "leases": [{"partition": r.partition, "owner": r.owner, "epoch": r.epoch,
                    "live": bool(r.owner) and r.expires_us > now, "expires": when(r.expires_us)}
                   for r in leases],
        "due_age_s": {str(p): a for p, a in sorted(ages.items())},
        "due_age_max_s": max(ages.values(), default=0.0),
        "lanes": [{"lane": lane, "state": s, "fires": n} for (lane, s), n in sorted(depths.items())],
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    _status_tables(out, ages)


def _store_line(st: dict[str, Any]) -> str:
    """One line on the store: role and server, whether commits wait for a standby, promotions."""
    if st["role"] == "embedded":
        return "[bold]store:[/bold] embedded (SQLite)"
    if st["role"] != "primary":
        return f"[bold]store:[/bold] [red]{st['role']}[/red] {st['server']}".rstrip()
    if st["synchronous"]:
        sync = f"[green]synchronous[/green] ({st['sync_standbys']} standby)"
    elif st["sync_required"]:
        sync = "[yellow]commits waiting: no synchronous standby streams[/yellow]"
    else:
        sync = "[red]asynchronous: one more loss loses committed fires[/red]"
    return (f"[bold]store:[/bold] primary {st['server']} · {sync} · timeline {st['timeline']} "
            f"({st['promotions']} promotion(s))")


def _status_tables(out: dict[str, Any], ages: dict[int, float]) -> None:
    from rich.table import Table

    c = _console()
    worst = out["due_age_max_s"]
    colour = "red" if worst > 60 else ("yellow" if worst > 5 else "green")
    c.print(f"[bold]oldest undispatched due age:[/bold] [{colour}]{worst:.1f} s[/{colour}] "
            f"(pages above 60 s) · {len(ages)} partition(s) waiting · as of {out['now']}")
    c.print(_store_line(out["store"]))
    t = Table(title="nodes")
    for col in ("node", "role", "ε", "ε source", "heartbeat age"):
        t.add_column(col)
    for n in out["nodes"]:
        t.add_row(n["id"], n["role"], "—" if n["eps_s"] is None else f"{n['eps_s'] * 1000:.1f} ms",
                  n["eps_source"] or "—", f"{n['heartbeat_age_s']:.1f} s")
    c.print(t if out["nodes"] else "nodes: none registered")
    held: dict[str, int] = {}
    for r in out["leases"]:
        if r["live"]:
            held[r["owner"]] = held.get(r["owner"], 0) + 1
    t = Table(title=f"leases: {sum(held.values())} of {len(out['leases'])} partitions held")
    t.add_column("owner")
    t.add_column("partitions held", justify="right")
    for owner, n in sorted(held.items()):
        t.add_row(owner, str(n))
    c.print(t if out["leases"] else "leases: none recorded")
    t = Table(title="due age per partition (oldest first, top 20)")
    t.add_column("partition", justify="right")
    t.add_column("age", justify="right")
    for p, a in sorted(ages.items(), key=lambda kv: -kv[1])[:20]:
        t.add_row(str(p), f"{a:.1f} s")
    c.print(t if ages else "due age: nothing is waiting")
    t = Table(title="lanes (live fires)")
    for col in ("lane", "state", "fires"):
        t.add_column(col)
    for row in out["lanes"]:
        t.add_row(row["lane"], row["state"], str(row["fires"]))
    c.print(t if out["lanes"] else "lanes: empty")


COMMANDS = (
    Command("triggers", triggers_cmd),
    Command("fires", fires_cmd),
    Command("why", why_cmd),
    Command("status", status_cmd),
)
