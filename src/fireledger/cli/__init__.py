"""The ``fireledger`` command: every command of the service, in one package.

Layout (one module per subject; each holds its command functions and a ``COMMANDS`` table):

* :mod:`.preview` — ``preview``; :mod:`.run` — ``serve``, ``control``, ``timing``, ``dispatch``;
* :mod:`.operator` — ``tenant create``, ``db upgrade`` and the store openers;
* :mod:`.evidence` — ``triggers``, ``fires``, ``why``, ``status``; :mod:`.history` — ``history export|purge``;
* :mod:`.backfill` — ``backfill``; :mod:`.reports` — ``report smearing``;
* :mod:`.keys` — ``init``, ``keys show|stage|rotate|prune``;
* :mod:`.trust` — ``audit verify|export|head``, ``tenant delete|purge``;
* :mod:`.timing_ops` — ``due-index rebuild|report``, ``partitions show|set``;
* :mod:`.dispatch_ops` — ``tenant quota``; :mod:`.backup` — ``restore``, ``backup`` (SQLite; decision 0126);
* :mod:`.apply` — ``apply -f FILE`` (triggers as code, through :mod:`fireledger.client`; decision 0185);
* :mod:`.common` — the one ``--db`` default, :func:`~.common.fail`, the store openers, :class:`~.common.Command`.

The planes export functions; only this package holds command-line surfaces (enforced by the
import-linter contracts in ``pyproject.toml``).

Bad input never produces a traceback: usage and input errors print one line,
``fireledger: <field>: <problem>``, and exit with code 2.
"""

from __future__ import annotations

import sys
from types import ModuleType

import typer

# Typer vendors click; its exception classes are the ones raised by the parser.
from typer._click import exceptions as click_exc

from . import (
    apply,
    backfill,
    backup,
    dispatch_ops,
    evidence,
    history,
    keys,
    operator,
    preview,
    reports,
    run,
    timing_ops,
    trust,
)
from .common import DEFAULT_DB, Command, InputError, fail

__all__ = ["DEFAULT_DB", "GROUPS", "MODULES", "InputError", "app", "build_app", "fail", "main"]

#: The command groups (``fireledger GROUP COMMAND``) and their help, in the order ``--help`` lists them.
GROUPS: dict[str, str] = {
    "tenant": "Tenants (operator commands; talk to the store directly).",
    "db": "Database schema.",
    "audit": "The hash-chained audit (operator commands).",
    "history": "History retention: export and purge fires past the retention window.",
    "due-index": "The due index (a projection of the registry): rebuild, shadow report.",
    "partitions": "The partition keyspace of the timing plane.",
    "report": "Reports computed from the ledger, off the fire path.",
    "keys": "The dispatch signing key ring (JWKS at /.well-known/jwks.json).",
}

#: Every module holding commands, in the order their commands are listed.
MODULES = (preview, run, trust, operator, evidence, history, timing_ops, dispatch_ops, backfill, reports, keys,
           backup, apply)


def _root() -> None:
    """fireledger: durable, multi-tenant scheduled triggers. Never early; a keyed record before delivery."""


def build_app(modules: tuple[ModuleType, ...] = MODULES) -> typer.Typer:
    """The ``fireledger`` Typer app: the groups of :data:`GROUPS`, then every :class:`Command` of each
    module's ``COMMANDS`` table on the app or its group."""
    root = typer.Typer(name="fireledger", help="A durable, multi-tenant scheduled-trigger service.",
                       no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                       rich_markup_mode=None)
    root.callback()(_root)
    groups = {name: typer.Typer(help=text, no_args_is_help=True, rich_markup_mode=None)
              for name, text in GROUPS.items()}
    for name, group in groups.items():
        root.add_typer(group, name=name)
    for module in modules:
        commands: tuple[Command, ...] = module.COMMANDS
        for c in commands:
            (root if c.group is None else groups[c.group]).command(c.name)(c.fn)
    return root


app = build_app()


def main() -> None:
    """Entry point: run the app; turn usage and input errors into one line and exit code 2."""
    try:
        app(standalone_mode=False)
    except click_exc.NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)
        sys.exit(2)
    except click_exc.UsageError as exc:
        msg = exc.format_message().replace("\n", " ")
        if exc.ctx is not None and exc.ctx.command.name not in (None, "fireledger"):
            msg = f"{exc.ctx.command.name}: {msg}"
        print(f"fireledger: {msg}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("fireledger: aborted", file=sys.stderr)
        sys.exit(130)
    except click_exc.ClickException as exc:
        print(f"fireledger: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
