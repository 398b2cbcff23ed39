"""Issue 14 (the house), item 5: every exception the package defines derives from one root.

Walks every module of ``fireledger`` (``pkgutil.walk_packages`` + ``importlib``) and collects each
``BaseException`` subclass *defined* in a fireledger module; each must derive from
``fireledger.errors.FireledgerError``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import fireledger
from fireledger.errors import FireledgerError


def _project_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(fireledger.__path__, prefix="fireledger."):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(value, BaseException)
                and value.__module__.startswith("fireledger")
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_walk_finds_the_project_exceptions() -> None:
    found = _project_exceptions()
    # The walk really reaches the subpackages (a guard against an empty walk passing vacuously).
    assert "fireledger.errors.FireledgerError" in found
    assert "fireledger.store.engine.StoreError" in found
    assert "fireledger.recurrence.errors.RecurrenceError" in found
    assert len(found) >= 20


def test_every_project_exception_derives_from_the_root() -> None:
    strays = sorted(name for name, cls in _project_exceptions().items() if not issubclass(cls, FireledgerError))
    assert strays == [], f"exceptions without FireledgerError as an ancestor: {strays}"


def test_the_standard_bases_are_kept() -> None:
    """Callers catch by the standard bases; the root is added, never substituted."""
    from fireledger.backfill import BackfillRefused
    from fireledger.recurrence.errors import RecurrenceError
    from fireledger.security.egress import EgressRefused
    from fireledger.statedir import StateDirError
    from fireledger.store.engine import StoreError

    assert issubclass(RecurrenceError, ValueError)
    assert issubclass(BackfillRefused, ValueError)
    assert issubclass(EgressRefused, ValueError)
    assert issubclass(StoreError, RuntimeError)
    assert issubclass(StateDirError, RuntimeError)
