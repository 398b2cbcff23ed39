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


def _roles_command(roles: tuple[str, ...], db: str, listen: str | None) -> None:
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
        service.run(db, roles, listen, settings)
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


COMMANDS = (
    Command("serve", serve_cmd),
    Command("timing", timing_cmd),
    Command("dispatch", dispatch_cmd),
    Command("control", control_cmd),
)
