"""Bulk-loading triggers for the benchmarks, fast and not through the API.

The triggers are written by the definitions service (:meth:`fireledger.registry.Registry.create_many`:
the rows the API writes — trigger, version with its sealed payload, partition, due row — in large
transactions with ``executemany``), from schedules compiled by the product's compiler.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from fireledger.definitions import next_us
from fireledger.domain.keys import from_us, new_id
from fireledger.domain.model import Policies, Target, Tenant
from fireledger.recurrence import Recurrence, compile_spec
from fireledger.registry import Definition, Registry
from fireledger.security.envelope import sealed_target
from fireledger.store import Store


def tenant_and_target(store: Store, url: str, secret: str, now_us: int) -> tuple[Tenant, Target]:
    """A tenant with its quota out of the way (the workload is the fire path, not the default quota of
    100 fires/s and 100 in flight) and one verified HTTP target."""
    from storekit import add_tenant

    tenant = add_tenant(store, "bench", now_us=now_us)
    store.dispatch.set_tenant_quota(tenant.id, fires_per_s=1e9, inflight=1_000_000)
    target = Target(new_id("tg"), tenant.id, "http", url, secret, "verified", new_id("v"), now_us)
    store.registry.create_target(sealed_target(store, target))
    return tenant, target


def compiled(specs: Iterable[dict[str, Any]], now_us: int) -> Iterator[tuple[dict[str, Any], int | None]]:
    """(normalised schedule, first instant after ``now_us``) per API schedule, by the product's compiler."""
    for spec in specs:
        rec = compile_spec(spec, default_anchor=from_us(now_us))
        yield rec.spec(), next_us(rec, now_us)


def load_triggers(store: Store, tenant: Tenant, target: Target, items: Iterable[tuple[dict[str, Any], int | None]],
                  now_us: int, *, batch: int = 50_000) -> dict[str, Any]:
    """Create one trigger per (normalised schedule, next instant) in ``items`` through the definitions
    service's bulk create (one transaction per ``batch``); returns count and time."""
    t0 = time.monotonic()
    recs: dict[str, Recurrence] = {}

    def definitions() -> Iterator[Definition]:
        for i, (spec, nxt) in enumerate(items):
            key = json.dumps(spec, sort_keys=True)
            rec = recs.get(key)
            if rec is None:
                rec = recs[key] = compile_spec(spec)
            yield Definition(f"bench-{i}", rec, target.id, b"{}", Policies(), nxt)

    if store.engine_name == "sqlite":
        with store.engine.read() as c:   # this thread's connection (the loading one): 256 MiB of pages
            c.execute("PRAGMA cache_size = -262144")
    count = Registry(store).create_many(tenant.id, "bench", definitions(), now_us=now_us, batch=batch)
    return {"triggers": count, "load_s": time.monotonic() - t0}
