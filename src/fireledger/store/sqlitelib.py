"""The SQLite library every fireledger connection goes through (decision 0260).

SQLite 3.7.0 to 3.51.2 have the *WAL-reset bug* (sqlite.org/wal.html#walresetbug, fixed in 3.51.3,
backported to 3.44.6 and 3.50.7): a checkpoint that starts while another connection commits the
transaction that resets the WAL can leave a wrong WAL-index header, and a later checkpoint then
skips pages — the database file is corrupt ("database disk image is malformed") or committed
transactions are lost. Its conditions are fireledger's normal running: WAL mode, connections in
several threads and processes committing, and a checkpointer thread (``start_checkpointer``)
checkpointing every 0.2 s. CPython's ``sqlite3`` links whatever SQLite the host or the build
bundles (3.40.1 in the Python this project pins), so it cannot be relied on.

``sqlite3`` here is ``pysqlite3``'s DB-API module (a pinned dependency whose wheel bundles SQLite
3.53.4), the same API as the standard library's; the standard library's module only where
``pysqlite3`` is not installed. :func:`connect` opens a connection and refuses, with an error that
says what to install, a library with the bug. Use this module's ``sqlite3`` everywhere a fireledger
database is opened or its errors are caught: two SQLite libraries in one process on one file do not
see each other's POSIX locks, which is itself a way to corrupt it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fireledger.errors import FireledgerError

if TYPE_CHECKING:   # the same API: checked against the standard library's annotations
    import sqlite3
else:
    try:
        from pysqlite3 import dbapi2 as sqlite3
    except ImportError:  # pragma: no cover - where pysqlite3 has no wheel
        import sqlite3

__all__ = ["UnsafeSqliteError", "connect", "sqlite3", "wal_reset_fixed"]

#: The first SQLite release free of the WAL-reset bug, and the maintenance releases that have the fix.
FIXED_IN = (3, 51, 3)
BACKPORTS = {(3, 44): 6, (3, 50): 7}


class UnsafeSqliteError(FireledgerError, RuntimeError):
    """The SQLite library has the WAL-reset bug: fireledger does not open a database with it."""


def wal_reset_fixed(version: str) -> bool:
    """Whether SQLite ``version`` (``"3.53.4"``) is free of the WAL-reset bug: below 3.7.0 there is
    no WAL-reset code, 3.51.3 and later have the fix, and so do 3.44.6+ and 3.50.7+."""
    parts = tuple(int(p) for p in version.split(".")[:3])
    major, minor, patch = (*parts, 0, 0, 0)[:3]
    if (major, minor, patch) < (3, 7, 0) or (major, minor, patch) >= FIXED_IN:
        return True
    fixed_patch = BACKPORTS.get((major, minor))
    return fixed_patch is not None and patch >= fixed_patch


def connect(path: str | os.PathLike[str], **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect(path, **kwargs)`` on this module's library, after checking that the library
    is free of the WAL-reset bug; raises :class:`UnsafeSqliteError` naming the version and the fix
    otherwise (connections are pooled per thread: the check is not on the fire path)."""
    version = sqlite3.sqlite_version
    if not wal_reset_fixed(version):
        raise UnsafeSqliteError(
            f"SQLite {version} has the WAL-reset bug (database corruption under concurrent commits "
            f"and checkpoints; fixed in 3.51.3): install fireledger's pinned pysqlite3 "
            f"(pip install 'pysqlite3==0.6.1') or run on a Python linked against SQLite >= 3.51.3")
    conn: sqlite3.Connection = sqlite3.connect(path, **kwargs)
    return conn
