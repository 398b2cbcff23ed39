"""Bulk-loading triggers for the benchmarks, fast and not through the API.

One *template* trigger is created through ``SqlStore.create_trigger`` (the call the API makes), then
cloned row by row — ``triggers``, ``trigger_versions`` and ``due`` — with ``executemany`` in large
transactions on the store's own engine: every column is copied from the template as the store wrote
it (so columns added by later migrations come along), with a new id, its partition, the schedule
and the due row's next instant substituted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from fireledger.definitions import next_us
from fireledger.domain.keys import from_us, new_id
from fireledger.domain.model import Policies, Target, Tenant, Trigger, TriggerState, TriggerVersion
from fireledger.domain.partition import partition_of
from fireledger.recurrence import TZDATA_VERSION, compile_spec
from fireledger.security.envelope import seal_payload
from fireledger.store import SqlStore


def tenant_and_target(store: SqlStore, url: str, secret: str, now_us: int) -> tuple[Tenant, Target]:
    """A tenant with its quota out of the way (the workload is the fire path, not the default quota of
    100 fires/s and 100 in flight) and one verified HTTP target."""
    from storekit import add_tenant

    tenant = add_tenant(store, "bench", now_us=now_us)
    store.set_tenant_quota(tenant.id, fires_per_s=1e9, inflight=1_000_000)
    target = Target(new_id("tg"), tenant.id, "http", url, secret, "verified", new_id("v"), now_us)
    store.create_target(target)
    return tenant, target


def compiled(specs: Iterable[dict[str, Any]], now_us: int) -> Iterator[tuple[dict[str, Any], int | None]]:
    """(normalised schedule, first instant after ``now_us``) per API schedule, by the product's compiler."""
    for spec in specs:
        rec = compile_spec(spec, default_anchor=from_us(now_us))
        yield rec.spec(), next_us(rec, now_us)


def _rows(c: Any, sql: str, params: tuple[Any, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    cur = c.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return cols, [tuple(r) for r in cur.fetchall()]


def load_triggers(store: SqlStore, tenant: Tenant, target: Target, items: Iterable[tuple[dict[str, Any], int | None]],
                  now_us: int, *, batch: int = 50_000) -> dict[str, Any]:
    """Create one trigger per (normalised schedule, next instant) in ``items``; returns count and time."""
    t0 = time.monotonic()
    it = iter(items)
    first = next(it, None)
    if first is None:
        return {"triggers": 0, "load_s": 0.0}
    spec0, next0 = first
    tid0 = new_id("tr")
    store.create_trigger(
        Trigger(tid0, tenant.id, "bench-0", TriggerState.ACTIVE, 1, partition_of(tid0), now_us, now_us),
        TriggerVersion(tid0, 1, tenant.id, spec0, target.id, seal_payload(store, tenant.id, tid0, 1, b"{}"),
                       Policies(), TZDATA_VERSION, now_us), next0)
    ph = "?" if store.engine_name == "sqlite" else "%s"
    with store.engine.read() as c:
        if store.engine_name == "sqlite":
            c.execute("PRAGMA cache_size = -262144")   # this loading connection only: 256 MiB of pages
        tcols, trows = _rows(c, f"SELECT * FROM triggers WHERE id = {ph}", (tid0,))
        vcols, vrows = _rows(c, f"SELECT * FROM trigger_versions WHERE trigger_id = {ph}", (tid0,))
        dcols, drows = _rows(c, f"SELECT * FROM due WHERE trigger_id = {ph}", (tid0,))
    trow, vrow, drow = list(trows[0]), list(vrows[0]), list(drows[0]) if drows else None
    ti = {c: i for i, c in enumerate(tcols)}
    vi = {c: i for i, c in enumerate(vcols)}
    di = {c: i for i, c in enumerate(dcols)}
    sql_t = f"INSERT INTO triggers ({', '.join(tcols)}) VALUES ({', '.join([ph] * len(tcols))})"
    sql_v = f"INSERT INTO trigger_versions ({', '.join(vcols)}) VALUES ({', '.join([ph] * len(vcols))})"
    sql_d = f"INSERT INTO due ({', '.join(dcols)}) VALUES ({', '.join([ph] * len(dcols))})"
    count = 1

    def flush(ts: list[tuple[Any, ...]], vs: list[tuple[Any, ...]], ds: list[tuple[Any, ...]]) -> None:
        with store.engine.write() as c:   # in key order: fewer B-tree pages touched per batch
            cur = c.cursor()
            cur.executemany(sql_t, sorted(ts, key=lambda r: r[ti["id"]]))
            cur.executemany(sql_v, sorted(vs, key=lambda r: r[vi["trigger_id"]]))
            if ds:
                cur.executemany(sql_d, sorted(ds, key=lambda r: r[di["trigger_id"]]))

    ts: list[tuple[Any, ...]] = []
    vs: list[tuple[Any, ...]] = []
    ds: list[tuple[Any, ...]] = []
    for spec, nxt in it:
        tid = new_id("tr")
        part = partition_of(tid)
        t = trow.copy()
        t[ti["id"]], t[ti["name"]], t[ti["partition"]] = tid, f"bench-{count}", part
        v = vrow.copy()
        v[vi["trigger_id"]], v[vi["schedule"]] = tid, json.dumps(spec, sort_keys=True)
        v[vi["payload"]] = seal_payload(store, tenant.id, tid, 1, b"{}")   # bound to its trigger: one each
        ts.append(tuple(t))
        vs.append(tuple(v))
        if drow is not None and nxt is not None:
            d = drow.copy()
            d[di["trigger_id"]], d[di["partition"]], d[di["next_us"]] = tid, part, nxt
            ds.append(tuple(d))
        count += 1
        if len(ts) >= batch:
            flush(ts, vs, ds)
            ts, vs, ds = [], [], []
    if ts:
        flush(ts, vs, ds)
    return {"triggers": count, "load_s": time.monotonic() - t0}
