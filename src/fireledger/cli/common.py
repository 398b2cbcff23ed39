"""What every ``fireledger`` command shares: the one ``--db`` default, the one-line input error, and
the :class:`Command` row that registers a command declaratively (the store openers are
:func:`fireledger.cli.operator.open_existing` and :func:`~fireledger.cli.operator.open_any`).

Contracts:

* :data:`DEFAULT_DB` is computed once, here, from :func:`fireledger.statedir.default_db_url`
  (``sqlite:///<state dir>/fireledger.db``); every command's ``--db`` defaults to it and reads
  ``FIRELEDGER_DB``.
* :func:`fail` raises :class:`InputError` (a usage error): :func:`fireledger.cli.main` prints it as
  one line ``fireledger: <command>: <field>: <problem>`` and exits 2 — never a traceback.
* Nothing here imports the web framework, the store or a plane at import time: ``fireledger preview``
  and ``--help`` start without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer

# Typer vendors click; its exception classes are the ones raised by the parser.
from typer._click import exceptions as click_exc

from fireledger.errors import FireledgerError
from fireledger.statedir import default_db_url

__all__ = ["DB_HELP", "DEFAULT_DB", "Command", "Db", "InputError", "fail"]

DB_HELP = "Store URL: sqlite:///PATH or postgresql://… (env FIRELEDGER_DB)."
DEFAULT_DB = default_db_url()   # sqlite:///<state dir>/fireledger.db (fireledger.statedir)
Db = Annotated[str, typer.Option("--db", help=DB_HELP, envvar="FIRELEDGER_DB")]


class InputError(FireledgerError, click_exc.UsageError):
    """Bad input at the CLI boundary (one line, exit 2)."""


def fail(message: str) -> NoReturn:
    """Stop the command with one line naming the field and the problem (exit 2)."""
    raise InputError(message)


@dataclass(frozen=True)
class Command:
    """One command of the CLI, registered declaratively by :func:`fireledger.cli.build_app`:
    ``fireledger NAME`` (``group`` None) or ``fireledger GROUP NAME``; ``fn`` is the Typer function
    (its parameters are the command's arguments and options, its docstring the help)."""

    name: str
    fn: Callable[..., Any]
    group: str | None = None
