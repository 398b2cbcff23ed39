"""``fireledger apply -f FILE [--plan] [--prune] [--json]``: triggers as code (decision 0185).

Talks to the API with a tenant's token (``--token`` / ``FIRELEDGER_TOKEN``; ``--url`` /
``FIRELEDGER_URL``, default ``http://127.0.0.1:8080``) through :mod:`fireledger.client`. The file
(:mod:`fireledger.control.declared`; JSON Schema at ``/v1/schemas/triggers.json``) is read and
checked whole — locally by the API's models, then by the server's dry runs — before anything is
written; a bad file prints one line per problem, ``FILE:LINE:COLUMN: field.path: problem``, and
exits 2 having changed nothing. ``--plan`` prints the plan (:mod:`.declplan`) and changes nothing.
Otherwise the plan is carried out: targets first (a new target's signing secret and ownership
challenge are printed once), then the plan is made again with the targets' new ids and states, and
the trigger actions run. Exit codes: 0 done (or planned), 1 the API refused an act midway (the
output says what was done), 2 a bad file or flag, 3 done except triggers waiting for a target to
prove ownership (serve the printed response, then apply again).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import Command, fail

__all__ = ["COMMANDS", "EXIT_WAITING"]

EXIT_REFUSED = 1
EXIT_WAITING = 3
DEFAULT_URL = "http://127.0.0.1:8080"


def _client(url: str, token: str | None) -> Any:
    from fireledger.client import Client

    if not token:
        fail("--token: a tenant's API token is required (or set FIRELEDGER_TOKEN)")
    if not url.startswith(("http://", "https://")):
        fail(f"--url: {url!r} must be an http:// or https:// origin")
    return Client(url.rstrip("/"), token)


def _run(client: Any, action: Any) -> dict[str, Any]:
    """Carry out one action; the result shown for it (a created target's secret and challenge)."""
    kind, verb = action.kind, action.verb
    if kind == "target" and verb == "create":
        t = client.create_target(body=action.body)
        return {"id": t.id, "secret": t.secret, "verification": {
            "state": t.verification.state, "challenge_path": t.verification.challenge_path,
            "response": t.verification.response}}
    if kind == "target" and verb == "verify":
        t = client.verify_target(action.id)
        return {"id": t.id, "verification": {"state": t.verification.state, "error": t.verification.error}}
    if kind == "target" and verb == "delete":
        client.delete_target(action.id)
        return {"id": action.id}
    if verb == "create":
        action.id = client.create_trigger(body=action.body).id
    elif verb == "amend":
        client.amend_trigger(action.id, body=action.body)
    elif verb == "pause":
        client.pause_trigger(action.id)
    elif verb == "resume":
        client.resume_trigger(action.id)
    elif verb == "delete":
        client.delete_trigger(action.id)
    return {"id": action.id}


def _carry_out(client: Any, loaded: Any, prune: bool, done: list[dict[str, Any]]) -> Any:
    """Targets, then a fresh plan's trigger and prune actions; returns the second plan."""
    from .declplan import plan

    first = plan(client, loaded, prune=prune)
    known: dict[str, str] = {}
    for a in first.actions:
        if a.kind == "target" and a.verb in ("create", "verify"):
            result = _run(client, a)
            done.append({**a.as_json(), "id": result["id"], "result": result})
            known[a.name] = result["id"]
    second = plan(client, loaded, prune=prune, known=known)
    created: dict[str, str] = {}
    for a in second.actions:
        if a.verb == "wait" or (a.kind == "target" and a.verb in ("create", "verify")):
            continue
        if a.verb == "pause" and a.id is None:
            a.id = created.get(a.name)
        done.append({**a.as_json(), "result": _run(client, a)})
        if a.verb == "create" and a.id:
            created[a.name] = a.id
    return second


def _render(plan: Any, *, title: str, done: list[dict[str, Any]] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("action", "kind", "name", "changes"):
        table.add_column(col)
    rows = done if done is not None else [a.as_json() for a in plan.actions]
    for a in rows:
        lines = [f"{f}: {_short(c['from'])} → {_short(c['to'])}" for f, c in (a.get("changes") or {}).items()]
        if a.get("note"):
            lines.append(f"({a['note']})")
        result = a.get("result") or {}
        if "secret" in result:
            v = result["verification"]
            lines.append(f"secret (shown once): {result['secret']}")
            lines.append(f"serve {v['response']} at {v['challenge_path']}")
        table.add_row(a["action"], a["kind"], a["name"], "\n".join(lines))
    console = Console()
    console.print(table if rows else f"{title}: nothing to do")
    for u in plan.unmanaged:
        console.print(f"unmanaged {u.kind} {u.name} ({u.id}): not in the file (--prune deletes it)")


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def apply_cmd(
    file: Annotated[Path, typer.Option("--file", "-f", help="The declaration (YAML or JSON).", dir_okay=False)],
    plan_only: Annotated[bool, typer.Option("--plan", help="Print the changes; make none.")] = False,
    prune: Annotated[bool, typer.Option("--prune", help="Delete triggers and targets the file does not name.")]
    = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    url: Annotated[str, typer.Option("--url", envvar="FIRELEDGER_URL", help="The API's origin.")] = DEFAULT_URL,
    token: Annotated[str | None, typer.Option("--token", envvar="FIRELEDGER_TOKEN",
                                              help="A tenant's API token (env FIRELEDGER_TOKEN).")] = None,
) -> None:
    """Make the tenant's targets and triggers match FILE (names are the identity); --plan shows the diff."""
    import httpx2 as httpx

    from fireledger.client import ApiError

    from .declfile import FileProblems, load
    from .declplan import plan

    client = _client(url, token)
    done: list[dict[str, Any]] = []
    try:
        loaded = load(file)
        result = plan(client, loaded, prune=prune) if plan_only else _carry_out(client, loaded, prune, done)
    except FileProblems as exc:
        for p in exc.problems:
            typer.echo(f"fireledger: apply: {p.render(exc.filename)}", err=True)
        sys.exit(2)
    except ApiError as exc:
        for d in done:
            typer.echo(f"done: {d['action']} {d['kind']} {d['name']}", err=True)
        typer.echo(f"fireledger: apply: the API refused: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    except httpx.TransportError as exc:   # the API cannot be reached: the url, not a traceback
        typer.echo(f"fireledger: apply: --url: cannot reach {url}: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    finally:
        client.close()
    waiting = [a for a in result.actions if a.verb == "wait"]
    if as_json:
        out = {"file": str(file), "applied": not plan_only,
               "actions": done if not plan_only else [a.as_json() for a in result.actions],
               "waiting": [a.as_json() for a in waiting] if not plan_only else [],
               "unmanaged": [a.as_json() for a in result.unmanaged]}
        typer.echo(json.dumps(out))
    else:
        _render(result, title=f"{'plan' if plan_only else 'applied'}: {file}", done=None if plan_only else done)
        for a in waiting if not plan_only else []:
            typer.echo(f"waiting: trigger {a.name}: {a.note}")
    if waiting and not plan_only:
        sys.exit(EXIT_WAITING)   # typer.Exit would be swallowed (standalone_mode=False)


COMMANDS = [Command("apply", apply_cmd)]
