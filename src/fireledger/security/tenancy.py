"""Tenant deletion (crypto-shredding at once) and the purge job that follows (seed ADR-16).

* :func:`delete_tenant` — one store transaction: the tenant's wrapped data key is destroyed (its
  payloads can no longer be decrypted, by anyone), its principals are revoked, its triggers stopped
  and its live fires skipped with the cause ``skipped: the tenant was deleted``; audited.
* :func:`purge_loop` — runs in the control plane: every :data:`PURGE_EVERY_S` it purges tenants
  deleted at least :data:`PURGE_GRACE_S` ago — definitions, payloads, targets, principals and history
  — keeping only per-day fire counts per state (no names, URLs, payloads or keys). A deleted tenant
  is therefore purged within about two hours, well inside the 30 days promised.
  ``fireledger tenant purge --db URL`` runs the same job once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .envelope import cipher_for

log = logging.getLogger("fireledger.security")

PURGE_GRACE_S = 3600
PURGE_EVERY_S = 3600


def delete_tenant(store: Any, tenant_id: str, actor: str, now_us: int) -> dict[str, int] | None:
    """Delete a tenant now (see the module docstring); None when there is no such live tenant."""
    out: dict[str, int] | None = store.trust.delete_tenant(tenant_id, actor, now_us)
    cipher_for(store).forget(tenant_id)
    if out is not None:
        scrub(store)
    return out


def scrub(store: Any) -> bool:
    """After a key is destroyed or rows purged: on SQLite, checkpoint the WAL with TRUNCATE so the old
    pages (a wrapped key, purged rows) are in neither the WAL nor, with ``secure_delete``, free pages
    of the database. PostgreSQL: nothing to do here (see docs/operations.md, "What shredding
    reaches"). Never raises: a failure is logged and the next checkpoint finishes the job."""
    try:
        done: bool = store.engine.scrub_after_shred()
    except Exception as exc:
        log.warning("checkpoint after shredding failed (%s); the next checkpoint completes it", type(exc).__name__)
        return False
    if not done and store.engine_name == "sqlite":
        log.warning("checkpoint after shredding was held back by readers; the next checkpoint completes it")
    return done


def purge(store: Any, now_us: int, grace_s: float = PURGE_GRACE_S, batch: int = 10) -> list[dict[str, Any]]:
    """Purge every tenant deleted at least ``grace_s`` before ``now_us``; returns their summaries."""
    done: list[dict[str, Any]] = []
    while True:
        got = store.trust.purge_deleted_tenants(now_us - int(grace_s * 1_000_000), now_us, batch)
        done += got
        if len(got) < batch:
            if done:
                scrub(store)
            return done


async def purge_loop(store: Any, *, every_s: float = PURGE_EVERY_S, grace_s: float = PURGE_GRACE_S) -> None:
    """Run :func:`purge` now and then every ``every_s`` seconds until cancelled (errors are logged
    and retried at the next round)."""
    while True:
        try:
            summaries = await asyncio.to_thread(purge, store, time.time_ns() // 1000, grace_s)
            for s in summaries:
                log.info("purged deleted tenant %s: %d triggers, %d fires, %d other rows",
                         s["tenant_id"], s["triggers"], s["fires"], s["rows"])
        except Exception as exc:
            log.error("tenant purge failed (%s); retrying in %.0fs", type(exc).__name__, every_s)
        await asyncio.sleep(every_s)


__all__ = ["PURGE_EVERY_S", "PURGE_GRACE_S", "delete_tenant", "purge", "purge_loop", "scrub"]
