"""What every area store shares: the engine and its named queries, and the one compare-and-set test.

Each area store (registry, timing, dispatch, trust, history) is an :class:`Area` over one
:class:`~fireledger.store.engine.Engine`: it reads ``self.engine`` (connections, transactions,
capability flags) and ``self.q`` (every named query in the engine's placeholder style). Areas never
call each other's private methods; a write that spans two areas in one transaction goes through a
function handed over at composition (:class:`fireledger.store.root.Store`), e.g. the trust area's
:meth:`~fireledger.store.trust.SqlTrust.append_in` for audit rows written with the change they record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fireledger.domain.trust_records import AuditEntry, AuditNote

from .engine import Engine, StoreError


class InvariantViolation(StoreError):
    """A compare-and-set matched more than one row: a bug, never a normal outcome."""


def expect_one(rowcount: int, what: str) -> bool:
    """The compare-and-set test: True when exactly one row matched, False for none (a normal
    outcome: "decided elsewhere", "moved meanwhile"); more than one raises
    :class:`InvariantViolation`, which rolls the caller's transaction back."""
    if rowcount > 1:
        raise InvariantViolation(f"{what} matched {rowcount} rows")
    return rowcount == 1


#: Append an audit row inside the caller's open write transaction (the connection is the first
#: argument); given to the areas whose acts are audited (:meth:`SqlTrust.append_in`).
AppendAudit = Callable[[Any, AuditNote], AuditEntry]


class Area:
    """The base of every area store: the engine it runs on and its named queries."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.q: dict[str, str] = engine.q


__all__ = ["AppendAudit", "Area", "InvariantViolation", "expect_one"]
