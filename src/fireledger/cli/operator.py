"""Operator commands that talk to the store directly: ``fireledger tenant create`` and
``fireledger db upgrade``, and the store openers every operator command uses (:func:`open_existing`
for commands on an existing deployment, :func:`open_any` otherwise).

Every failure of the functions here is an :class:`OperatorError` carrying one line for the CLI to
print. The store, the database drivers and the control plane's tenant code are imported when a
command runs, not when the CLI starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

import fireledger.security  # noqa: F401  (installs the audit chain's key source: decision 0111)
from fireledger.errors import FireledgerError

from .common import DEFAULT_DB, Command, Db, fail

if TYPE_CHECKING:
    from fireledger.store import Store


class OperatorError(FireledgerError):
    """A one-line, operator-actionable failure."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _is_duplicate(exc: BaseException) -> bool:
    from fireledger.store.sqlitelib import sqlite3

    if isinstance(exc, sqlite3.IntegrityError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, psycopg.IntegrityError)


def _is_db_error(exc: BaseException) -> bool:
    from fireledger.store import is_database_error

    return is_database_error(exc)


def open_store(url: str, *, migrate: bool | None = None) -> Store:
    """Open the store at ``url`` (SQLite creates and migrates it on first use)."""
    from fireledger.settings import SettingError, Settings
    from fireledger.store import Store, StoreError

    try:
        return Store.open(url, settings=Settings.from_env(), migrate=migrate)
    except SettingError as exc:
        raise OperatorError(str(exc)) from None
    except StoreError as exc:
        raise OperatorError(str(exc)) from None
    except Exception as exc:
        if _is_db_error(exc):
            raise OperatorError(f"--db: cannot open the database: {_one_line(exc)}") from None
        raise


def tenant_create(url: str, name: str) -> tuple[str, str]:
    """Create tenant ``name`` with one principal holding every role; return ``(tenant_id, token)``."""
    from fireledger.clock import SystemClock
    from fireledger.control.tenants import create_tenant, validate_tenant_name

    try:
        name = validate_tenant_name(name)
    except ValueError as exc:
        raise OperatorError(str(exc)) from None
    store = open_store(url)
    try:
        return create_tenant(store, name, SystemClock().now().latest_us)
    except Exception as exc:
        if _is_duplicate(exc):
            raise OperatorError(f"NAME: a tenant named {name!r} already exists") from None
        if _is_db_error(exc):
            raise OperatorError(f"--db: {_one_line(exc)}") from None
        raise
    finally:
        store.close()


def db_upgrade(url: str) -> tuple[list[int], int]:
    """Apply every missing migration; return ``(applied versions, resulting schema version)``."""
    from fireledger.clock import SystemClock
    from fireledger.settings import SettingError, Settings
    from fireledger.store import Store, StoreError
    from fireledger.store.engine import engine_for_url

    try:
        store = Store(engine_for_url(url, Settings.from_env()))
    except (StoreError, SettingError) as exc:
        raise OperatorError(str(exc)) from None
    try:
        applied = store.migrate(SystemClock().now().latest_us)
        return applied, store.schema_version()
    except StoreError as exc:
        raise OperatorError(str(exc)) from None
    except Exception as exc:
        if _is_db_error(exc):
            raise OperatorError(f"--db: cannot migrate the database: {_one_line(exc)}") from None
        raise
    finally:
        store.close()


def open_existing_store(url: str, fail: Callable[[str], Any]) -> Store:
    """Open the store for an operator command that reads or repairs an existing deployment: a
    SQLite URL must name an existing file (never create an empty database by mistyping a path).
    Problems go to ``fail`` (the CLI's one-line, exit-2 error)."""
    if url.startswith("sqlite:"):
        from pathlib import Path

        from fireledger.store.engine import engine_for_url

        try:
            path = engine_for_url(url).path  # type: ignore[attr-defined]
        except Exception as exc:
            fail(str(exc))
        if not Path(path).exists():
            fail(f"--db: no database at {path} (start the service once, or check the path)")
    try:
        return open_store(url)
    except OperatorError as exc:
        fail(str(exc))
        raise


def open_existing(db: str) -> Store:
    """The store of an existing deployment, for commands that read or repair it (never creates a
    SQLite file by a mistyped path); any problem is a :func:`~fireledger.cli.common.fail`."""
    return open_existing_store(db, fail)


def open_any(db: str) -> Store:
    """The store at ``db`` (SQLite creates and migrates it on first use); any problem is a
    :func:`~fireledger.cli.common.fail`."""
    try:
        return open_store(db)
    except OperatorError as exc:
        fail(str(exc))


def tenant_create_cmd(
    name: Annotated[str, typer.Argument(help="Tenant name (unique).")],
    db: Db = DEFAULT_DB,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"tenant_id": …, "token": …}.')] = False,
) -> None:
    """Create a tenant and a token carrying every role of it (the token is shown only once)."""
    try:
        tenant_id, token = tenant_create(db, name)
    except OperatorError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps({"tenant_id": tenant_id, "token": token}))
        return
    typer.echo(f"created tenant {name!r}: {tenant_id}")
    typer.echo(f"token (shown only once; send as 'Authorization: Bearer <token>'): {token}")


def db_upgrade_cmd(db: Db = DEFAULT_DB) -> None:
    """Apply every missing schema migration (PostgreSQL needs this; SQLite migrates on first use)."""
    try:
        applied, version = db_upgrade(db)
    except OperatorError as exc:
        fail(str(exc))
    if applied:
        typer.echo(f"applied migrations {', '.join(str(v) for v in applied)}; schema at version {version}")
    else:
        typer.echo(f"schema already at version {version}; nothing to apply")


COMMANDS = (
    Command("create", tenant_create_cmd, group="tenant"),
    Command("upgrade", db_upgrade_cmd, group="db"),
)

__all__ = ["COMMANDS", "OperatorError", "db_upgrade", "open_any", "open_existing", "open_existing_store", "open_store",
           "tenant_create"]
