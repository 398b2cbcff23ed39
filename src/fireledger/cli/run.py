"""The commands that run the service: ``serve`` (every role in one process), ``control``, ``timing``
and ``dispatch`` (one role each). They check their settings, then hand over to
:func:`fireledger.service.run`.

A bad ``--listen``, ``FIRELEDGER_*`` setting or store prints one line and exits 2.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .common import DEFAULT_DB, Command, Db, fail

__all__ = ["COMMANDS"]

Listen = Annotated[str, typer.Option("--listen", help="HOST:PORT for the HTTP API.")]


def _roles_command(roles: tuple[str, ...], db: str, listen: str | None, *, supervised: bool = False) -> None:
    from fireledger import service
    from fireledger.settings import Settings
    from fireledger.store import StoreError

    if listen is not None:
        try:
            service.parse_listen(listen)
        except ValueError as exc:
            fail(str(exc))
    try:   # the one read of the environment: every FIRELEDGER_* setting, checked, then passed down
        settings = Settings.from_env()
    except ValueError as exc:
        fail(str(exc))
    if "dispatch" in roles:   # internal-target modules
        from fireledger.dispatch.internal import load_modules

        try:
            load_modules(settings.internal_modules)
        except ValueError as exc:
            fail(str(exc))
    try:
        service.run(db, roles, listen, settings, supervised=supervised)
    except (StoreError, ValueError) as exc:  # ValueError: a bad FIRELEDGER_* setting, named
        fail(str(exc))


def serve_cmd(db: Db = DEFAULT_DB, listen: Listen = "127.0.0.1:8080") -> None:
    """Run control, timing and dispatch in one process."""
    _roles_command(("control", "timing", "dispatch"), db, listen)


def timing_cmd(db: Db = DEFAULT_DB) -> None:
    """Run the timing plane alone."""
    _roles_command(("timing",), db, None)


def dispatch_cmd(db: Db = DEFAULT_DB) -> None:
    """Run the dispatch plane alone."""
    _roles_command(("dispatch",), db, None)


def control_cmd(db: Db = DEFAULT_DB, listen: Listen = "127.0.0.1:8080") -> None:
    """Run the control plane (HTTP API) alone."""
    _roles_command(("control",), db, listen)


def dispatch_child() -> None:
    """Entry of ``serve``'s extra dispatch processes (``FIRELEDGER_DISPATCH_PROCESSES``, started by
    :func:`fireledger.service.dispatch_child_command` as ``python -c ... PARENT_PID DB``): the dispatch
    plane alone, as ``fireledger dispatch --db DB``, that ends with ``serve`` — SIGTERM when the parent
    dies, ``kill -9`` included (decision 0240) — and leaves WAL checkpoints to it."""
    import sys

    from click import ClickException

    from fireledger import service

    parent, db = int(sys.argv[1]), sys.argv[2]
    service.end_with_parent(parent)
    try:
        _roles_command(("dispatch",), db, None, supervised=True)
    except ClickException as exc:   # one line, as `fireledger dispatch` prints it
        print(f"fireledger: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)


COMMANDS = (
    Command("serve", serve_cmd),
    Command("timing", timing_cmd),
    Command("dispatch", dispatch_cmd),
    Command("control", control_cmd),
)
