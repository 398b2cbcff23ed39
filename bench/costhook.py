"""Runs a ``fireledger`` command with its store statements counted (the ``cost`` scenario, bench/cost.py).

    python bench/costhook.py <path of the fireledger entry point> serve --db … [--listen …]

Before handing over to the entry point it wraps the two drivers, in this process only:

* SQLite: every connection gets a trace callback (``set_trace_callback``: called once for each
  statement the library steps, an ``executemany`` row included) that counts the statement by its
  first word (SELECT, INSERT, UPDATE, DELETE, BEGIN, COMMIT, SAVEPOINT, …) and samples the
  connection's ``total_changes`` (rows inserted, updated or deleted by this connection so far);
* PostgreSQL (psycopg 3): ``Cursor.execute`` / ``executemany`` count the statements sent (one per
  parameter set for ``executemany``); rows written come from the server's ``pg_stat_database``.

Once its handler is installed, and on each ``SIGUSR1``, it writes the counters so far to
``$FIRELEDGER_BENCH_COST_DIR/<pid>.json`` (atomically, with a sequence number that the bench waits
for). The counting costs about a microsecond per
statement, charged to the process measured (docs/performance.md, "Cost per fire").
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from fireledger.store.sqlitelib import sqlite3

OUT_DIR = os.environ.get("FIRELEDGER_BENCH_COST_DIR", "")
_conns: list[tuple[Counter[str], list[int]]] = []   # per connection: statements by verb, [total_changes]
_pg: Counter[str] = Counter()
_lock = threading.Lock()
_seq = [0]


def _verb(sql: str) -> str:
    return sql.lstrip(" \n\t(").split(None, 1)[0].upper() if sql.strip() else "?"


_real_connect = sqlite3.connect


def _connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _real_connect(*args, **kwargs)
    counts: Counter[str] = Counter()
    changes = [0]

    def trace(sql: str) -> None:
        counts[_verb(sql)] += 1
        changes[0] = conn.total_changes   # rows written by the statements before this one

    conn.set_trace_callback(trace)
    with _lock:
        _conns.append((counts, changes))
    return conn


def _wrap_psycopg() -> None:
    try:
        import psycopg
    except ImportError:
        return
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else str(getattr(query, "as_string", lambda _c: query)(None))
        _pg[_verb(text)] += 1
        return execute(self, query, *args, **kwargs)

    def counted_executemany(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        params = list(params_seq)
        _pg[_verb(query if isinstance(query, str) else "?")] += len(params)
        return executemany(self, query, params, *args, **kwargs)

    psycopg.Cursor.execute = counted_execute   # type: ignore[method-assign]
    psycopg.Cursor.executemany = counted_executemany   # type: ignore[method-assign]


def snapshot() -> dict[str, Any]:
    """The counters so far: statements by verb (both drivers) and SQLite rows written."""
    stmts: Counter[str] = Counter()
    rows = 0
    with _lock:
        conns = list(_conns)
    for counts, changes in conns:
        stmts.update(dict(counts))
        rows += changes[0]
    stmts.update(dict(_pg))
    return {"statements": dict(stmts), "statements_total": sum(stmts.values()), "sqlite_rows_written": rows}


def _dump(_sig: int, _frame: FrameType | None) -> None:
    _seq[0] += 1
    path = Path(OUT_DIR) / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seq": _seq[0], "argv": sys.argv[1:], **snapshot()}))
    os.replace(tmp, path)


def main() -> None:
    sqlite3.connect = _connect   # the store opens its connections through the module attribute
    _wrap_psycopg()
    if OUT_DIR:
        signal.signal(signal.SIGUSR1, _dump)
        _seq[0] = -1
        _dump(signal.SIGUSR1, None)   # seq 0: the handler is installed (SIGUSR1 would kill before)
    entry = sys.argv[1]
    sys.argv = [entry, *sys.argv[2:]]
    runpy.run_path(entry, run_name="__main__")


if __name__ == "__main__":
    main()
