"""The state of record: registry, due index and fire ledger on SQLite or PostgreSQL."""

from .engine import SchemaError, StoreError, is_database_error
from .sql_store import InvariantViolation, Settlement, SqlStore

__all__ = ["InvariantViolation", "SchemaError", "Settlement", "SqlStore", "StoreError", "is_database_error"]
