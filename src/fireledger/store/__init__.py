"""The state of record on SQLite or PostgreSQL: a :class:`Store` of five area stores
(registry, timing, dispatch, trust, history; :mod:`fireledger.store.protocols`)."""

from .core import InvariantViolation
from .dispatch import OutcomeRejected
from .engine import SchemaError, StoreError, is_database_error
from .root import Store

__all__ = ["InvariantViolation", "OutcomeRejected", "SchemaError", "Store", "StoreError", "is_database_error"]
