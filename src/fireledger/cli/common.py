"""What every ``fireledger`` command shares: the one ``--db`` default, the one-line input error, the
store openers, and the :class:`Command` row that registers a command declaratively.

Contracts:

* :data:`DEFAULT_DB` is computed once, here, from :func:`fireledger.statedir.default_db_url`
  (``sqlite:///<state dir>/fireledger.db``); every command's ``--db`` defaults to it and reads
  ``FIRELEDGER_DB``.
* :func:`fail` raises :class:`InputError` (a usage error): :func:`fireledger.cli.main` prints it as
  one line ``fireledger: <command>: <field>: <problem>`` and exits 2 — never a traceback.
* :func:`open_existing` opens the store of an existing deployment (a SQLite URL must name an existing
  file); :func:`open_any` opens (and, on SQLite, creates) it. Both turn every failure into :func:`fail`.
* Nothing here imports the web framework, the store or a plane at import time: ``fireledger preview``
  and ``--help`` start without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

# Typer vendors click; its exception classes are the ones raised by the parser.
from typer._click import exceptions as click_exc

from fireledger.statedir import default_db_url

if TYPE_CHECKING:
    from fireledger.store import SqlStore

__all__ = ["DB_HELP", "DEFAULT_DB", "Command", "Db", "InputError", "fail", "open_any", "open_existing"]

DB_HELP = "Store URL: sqlite:///PATH or postgresql://… (env FIRELEDGER_DB)."
DEFAULT_DB = default_db_url()   # sqlite:///<state dir>/fireledger.db (fireledger.statedir)
Db = Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")]


class InputError(click_exc.UsageError):
    """Bad input at the CLI boundary (one line, exit 2)."""


def fail(message: str) -> NoReturn:
    """Stop the command with one line naming the field and the problem (exit 2)."""
    raise InputError(message)


def open_existing(db: str) -> SqlStore:
    """The store of an existing deployment, for commands that read or repair it (never creates a
    SQLite file by a mistyped path); any problem is a :func:`fail`."""
    from .operator import open_existing_store

    return open_existing_store(db, fail)


def open_any(db: str) -> SqlStore:
    """The store at ``db`` (SQLite creates and migrates it on first use); any problem is a :func:`fail`."""
    from .operator import OperatorError, open_store

    try:
        return open_store(db)
    except OperatorError as exc:
        fail(str(exc))


@dataclass(frozen=True)
class Command:
    """One command of the CLI, registered declaratively by :func:`fireledger.cli.build_app`:
    ``fireledger NAME`` (``group`` None) or ``fireledger GROUP NAME``; ``fn`` is the Typer function
    (its parameters are the command's arguments and options, its docstring the help)."""

    name: str
    fn: Callable[..., Any]
    group: str | None = None
