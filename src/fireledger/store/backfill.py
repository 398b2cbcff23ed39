"""Backfill's store operations (SQL text; the methods are the registry area's).

* :meth:`RegistryGaps.backfill_window` — what the ledger already holds for one trigger over a
  window: the instants that have a backfill fire (the backfill sequence) and the instants that have
  a delivered fire of any sequence. One range of the primary key (tenant, trigger, instant, seq).
* :meth:`RegistryGaps.commit_backfill` — insert the backfill fires (``ON CONFLICT DO NOTHING``: a
  key already present is a normal outcome, reported as such) **and** the audit row of the act in ONE
  transaction, so no backfill fire exists without its audit record and a refused or failed commit
  leaves neither. ``progress`` is called between chunks (the operator command draws a progress bar);
  the transaction stays one.

The store never reads a clock: the caller passes the instant the fires are decided at.
"""

from __future__ import annotations

from . import queries

BACKFILL_QUERIES: dict[str, str] = {
    "bf_window": (
        "SELECT scheduled_us, seq, state FROM fires INDEXED BY fires_by_trigger "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us >= :lo AND scheduled_us < :hi AND (seq = :seq OR state = 'delivered')"
    ),
}

queries.register(BACKFILL_QUERIES)

#: Fires inserted between two progress callbacks.
PROGRESS_CHUNK = 200


__all__ = ["BACKFILL_QUERIES", "PROGRESS_CHUNK"]
