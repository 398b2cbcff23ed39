"""The store's role as this process sees it: which server answers, whether it is a primary, whether
its commits wait for a synchronous standby, and how many primary changes this process has seen
(issue 16: PostgreSQL with a synchronous standby and automatic failover).

:func:`read_role` asks the server this process's connection reaches (a multi-host URL with
``target_session_attrs=read-write`` reaches the primary; after a failover, the promoted one):

* ``role`` — ``primary``, ``standby`` (a read-only server: a URL without ``target_session_attrs``
  that reached a standby), ``embedded`` (SQLite) or ``unreachable``;
* ``sync_standbys`` — streaming standbys the primary counts as synchronous (``pg_stat_replication``
  ``sync_state`` ``sync`` or ``quorum``); ``synchronous`` — ``synchronous_standby_names`` is set and
  at least one such standby streams, so a commit returns only once a standby has it. pg_auto_failover
  clears the setting when the standby is lost (writes go on, asynchronously): ``synchronous`` false;
* ``sync_required`` — ``synchronous_standby_names`` is set: commits wait for a standby. Set while
  no standby streams (``synchronous`` false), commits *stall* until one is back or the monitor drops
  to asynchronous replication (the few seconds after a standby is lost);
* ``server`` — ``host:port`` of the answering server (never credentials); ``timeline`` — the WAL
  timeline of the primary, which every promotion (failover or switchover) increments: a cluster
  starts on timeline 1, so ``promotions`` (``timeline − 1``) counts the promotions it has been
  through, whichever process asks (``fireledger status``).

:class:`FailoverWatch` counts the primary changes one process observes (a new ``server`` or a higher
``timeline`` than the last reading): the ``fireledger_store_failovers_total`` counter of ``/metrics``.
Nothing here reconnects: the engine's connection pool replaces a broken connection on the next call
and libpq's multi-host URL picks the read-write server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: What one reading of the role asks PostgreSQL (one round trip).
ROLE_SQL = """
SELECT pg_is_in_recovery(),
       coalesce(host(inet_server_addr()), 'local'), coalesce(inet_server_port(), 0),
       current_setting('synchronous_standby_names'),
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
       CASE WHEN pg_is_in_recovery() THEN 0
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END
"""

ROLES = ("primary", "standby", "embedded", "unreachable")


@dataclass(frozen=True, slots=True)
class StoreRole:
    """One reading of the store's role (module docstring)."""

    role: str
    sync_standbys: int = 0
    synchronous: bool = False
    server: str = ""
    timeline: int = 0
    sync_required: bool = False

    @property
    def promotions(self) -> int:
        """Promotions the primary's history has been through (``timeline − 1``; 0 when unknown)."""
        return max(0, self.timeline - 1)

    def as_dict(self) -> dict[str, Any]:
        """The reading as ``fireledger status --json`` shows it."""
        return {"role": self.role, "server": self.server, "synchronous": self.synchronous,
                "sync_required": self.sync_required, "sync_standbys": self.sync_standbys,
                "timeline": self.timeline, "promotions": self.promotions}


def read_role(store: Any) -> StoreRole:
    """The role of the server ``store`` reaches now; ``unreachable`` when it cannot be read (the
    error is not raised: a scrape or a status line must answer while the store fails over)."""
    if getattr(store, "engine_name", "") != "postgres":
        return StoreRole("embedded", server="sqlite")
    try:
        with store.engine.read() as conn:
            row = conn.execute(ROLE_SQL).fetchone()
    except Exception:
        return StoreRole("unreachable")
    in_recovery, host, port, names, sync, timeline = row
    sync = int(sync or 0)
    required = bool(str(names or "").strip())
    return StoreRole("standby" if in_recovery else "primary", sync_standbys=sync, synchronous=required and sync > 0,
                     server=f"{host}:{int(port)}", timeline=int(timeline or 0), sync_required=required)


class FailoverWatch:
    """Counts the primary changes seen in successive readings (thread-safe): a primary on another
    server, or on a higher timeline, than the last primary seen. The first reading counts nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: StoreRole | None = None
        self.failovers = 0

    def observe(self, reading: StoreRole) -> int:
        """Take one reading into account; returns the count so far."""
        if reading.role != "primary":
            return self.failovers
        with self._lock:
            last = self._last
            if last is not None and (reading.server != last.server or reading.timeline > last.timeline):
                self.failovers += 1
            self._last = reading
            return self.failovers
