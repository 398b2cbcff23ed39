"""``fireledger init`` and ``fireledger keys show|stage|rotate|prune`` (operator commands on the state
directory; see :mod:`fireledger.statedir`).

* ``fireledger init [--json]`` — create the state directory (0700), the key-encryption key file
  (0600) and the signing key ring (0600) where they are missing. Idempotent: a second run changes
  nothing and says so. The only command that creates a KEK: ``serve``, ``control`` and ``dispatch``
  refuse to start without one.
* ``fireledger keys show [--json]`` — the ring's keys (kid, state, times; never private parts) and
  which of them the JWKS publishes now.
* ``fireledger keys stage`` — publish a next key that does not sign yet (receivers that cache the
  JWKS learn it before it signs).
* ``fireledger keys rotate [--overlap DURATION]`` — the staged (or a fresh) key signs from now on;
  the previous key stays published for ``--overlap`` (default 24h; at least the longest token
  lifetime, :data:`MIN_OVERLAP_S`), so tokens it signed keep verifying.
* ``fireledger keys prune`` — drop retired keys whose publication window has ended.

Every running control and dispatch process sees a change at its next look at the file (the ring is
reloaded when the file changes). Bad input prints one line naming the flag and exits 2.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from .common import DEFAULT_DB, Command, fail

#: Longest lifetime of a per-attempt token: the largest attempt timeout (15 min) plus the 2 s the
#: runner adds (``expires_s = now + ceil(timeout) + 1``), plus receivers' leeway (at most 5 s).
MAX_TOKEN_LIFETIME_S = 15 * 60 + 2 + 5
MIN_OVERLAP_S = MAX_TOKEN_LIFETIME_S

AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def _iso(s: int | None) -> str | None:
    from datetime import UTC, datetime

    return None if s is None else datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ring_file() -> Any:
    """The deployment's key ring file, checked like ``serve`` checks it (one line and exit 2 otherwise)."""
    from pathlib import Path

    from fireledger.service import keyring_path, open_keyring

    path = keyring_path()
    if not Path(path).exists():
        fail(f"{path}: no key ring; run `fireledger init` first (or set FIRELEDGER_KEYRING)")
    try:
        return open_keyring()
    except ValueError as exc:
        fail(str(exc))


def _now_s() -> int:
    return int(time.time())


def init_state(db: str | None = None) -> dict[str, Any]:
    """Create what is missing of the state directory, the KEK file and the key ring; report what
    was created (``created``: list of paths) and what was already there. Raises ``ValueError`` (one
    line) when something cannot be created or is refused (a KEK at an old place, open modes)."""
    from pathlib import Path

    from fireledger.dispatch.credentials import KeyRingFile
    from fireledger.security.envelope import KEK_ENV, KekError, create_kek, kek_file_path
    from fireledger.service import keyring_path
    from fireledger.settings import process_env
    from fireledger.statedir import StateDirError, ensure_state_dir, is_in_state_dir, private_file_problem

    created: list[str] = []
    present: list[str] = []
    try:
        d = ensure_state_dir()   # always: the default store lives here
    except StateDirError as exc:
        raise ValueError(str(exc)) from None
    store = None
    if db and db.startswith("sqlite:"):
        from fireledger.store.engine import engine_for_url

        store = type("_S", (), {"engine": engine_for_url(db)})()   # only its path: old KEK places
    if process_env().get(KEK_ENV):
        present.append(f"{KEK_ENV} (the key-encryption key is given in the environment)")
    else:
        kek = kek_file_path(store)
        problem = private_file_problem(kek, "key-encryption key file")
        if problem is not None:
            raise ValueError(problem)
        try:
            (created if create_kek(kek, store) else present).append(str(kek))
        except KekError as exc:
            raise ValueError(str(exc)) from None
    ring = Path(keyring_path())
    if is_in_state_dir(ring):
        ensure_state_dir()
    problem = private_file_problem(ring, "key ring")
    if problem is not None:
        raise ValueError(problem)
    existed = ring.exists()
    KeyRingFile(ring, _now_s())   # creates it exclusively (mode 0600) when missing, else loads it
    (present if existed else created).append(str(ring))
    return {"state_dir": str(d), "created": created, "present": present, "changed": bool(created)}


def init_cmd(
    db: Annotated[str, typer.Option("--db", help="The store whose old KEK places are checked "
                                    "(env FIRELEDGER_DB).", envvar="FIRELEDGER_DB")] = DEFAULT_DB,
    as_json: AsJson = False,
) -> None:
    """Create the state directory (0700), the key-encryption key (0600) and the signing key ring
    where missing. Idempotent: a second run changes nothing and says so."""
    try:
        out = init_state(db)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(out))
        return
    for path in out["created"]:
        typer.echo(f"created {path}")
    if out["created"]:
        typer.echo("keep a copy of the key-encryption key somewhere safe: losing it makes every payload "
                   "unreadable; every control and dispatch process must use the same one")
    for path in out["present"]:
        typer.echo(f"already there: {path}")
    if not out["changed"]:
        typer.echo(f"nothing to do: the state in {out['state_dir']} is complete")


def show_cmd(as_json: AsJson = False) -> None:
    """The ring's keys: kid, state, created/retired/published-until (never private parts)."""
    rf = _ring_file()
    ring = rf.ring()
    now = _now_s()
    published = {k["kid"] for k in ring.jwks(now)["keys"]}
    items = [{"kid": k.kid, "state": k.state, "created_at": _iso(k.created_s), "retired_at": _iso(k.retired_s),
              "published_until": _iso(k.publish_until_s), "published": k.kid in published,
              "signs": k.state == "current"} for k in ring.keys]
    if as_json:
        typer.echo(json.dumps({"path": str(rf.path), "keys": items}))
        return
    typer.echo(f"key ring {rf.path}")
    for it in items:
        until = f", published until {it['published_until']}" if it["published_until"] else ""
        typer.echo(f"  {it['kid']}  {it['state']}{' (signs)' if it['signs'] else ''}"
                   f"{'' if it['published'] else ' (no longer published)'}{until}")


def stage_cmd() -> None:
    """Publish a next key that does not sign yet (idempotent); `keys rotate` promotes it."""
    kid = _ring_file().stage(_now_s())
    typer.echo(f"staged {kid}: published now, signs after `fireledger keys rotate`")


def rotate_cmd(
    overlap: Annotated[str, typer.Option(
        "--overlap", help="How long the previous key stays published (at least 15m7s; default 24h).")] = "24h",
    as_json: AsJson = False,
) -> None:
    """The staged (or a new) key signs from now on; the previous key stays in the JWKS for --overlap."""
    from fireledger.recurrence import RecurrenceError
    from fireledger.recurrence.instants import parse_duration

    try:
        secs = int(parse_duration(overlap, "--overlap").total_seconds())
    except RecurrenceError as exc:
        fail(f"--overlap: {exc.problem}")
    if secs < MIN_OVERLAP_S:
        fail(f"--overlap: {overlap} is shorter than the longest token lifetime ({MIN_OVERLAP_S}s): tokens "
              "signed by the previous key would stop verifying")
    rf = _ring_file()
    old = rf.ring().current.kid
    now = _now_s()
    new = rf.rotate(now, secs)
    if as_json:
        typer.echo(json.dumps({"current": new, "retired": old, "published_until": _iso(now + secs)}))
        return
    typer.echo(f"rotated: {new} signs now; {old} stays published until {_iso(now + secs)} "
               "(`fireledger keys prune` drops it afterwards)")


def prune_cmd(as_json: AsJson = False) -> None:
    """Drop retired keys whose publication window has ended."""
    gone = _ring_file().prune(_now_s())
    if as_json:
        typer.echo(json.dumps({"pruned": gone}))
        return
    typer.echo(f"pruned {', '.join(gone)}" if gone else "nothing to prune: every retired key is still published")


COMMANDS = (
    Command("init", init_cmd),
    Command("show", show_cmd, group="keys"),
    Command("stage", stage_cmd, group="keys"),
    Command("rotate", rotate_cmd, group="keys"),
    Command("prune", prune_cmd, group="keys"),
)

__all__ = ["COMMANDS", "MAX_TOKEN_LIFETIME_S", "MIN_OVERLAP_S", "init_state"]
