"""``store-failover-primary-kill``: the PostgreSQL primary's machine is lost mid-run and
pg_auto_failover promotes the synchronous standby (issue 16).

Real processes throughout: a pg_auto_failover cluster on this machine (``scripts/ha-cluster.sh``:
monitor, primary, synchronous standby; the monitor's health checks tightened so a lost node is
failed over in seconds), ``fireledger control``, ``fireledger dispatch`` and two ``fireledger
timing`` processes on the multi-host URL (``target_session_attrs=read-write``), and a real HTTP sink
that records every delivery. Load: triggers of 1 s spread over three tenants sharing them, and one
tenant with as many of its own (no jitter). Mid-run the primary's node is killed (``kill -9`` of its
``pg_autoctl`` supervisor and its postmaster at once: a killed postmaster alone is restarted by its
keeper on the same node, which is no failover).

Figures and what passing requires:

* ``deliveries_without_record`` = 0: every delivery the sink saw has its fire record on the promoted
  primary (RPO 0 for anything dispatched: a fire is dispatched only after its commit, and a commit
  returns only once the synchronous standby has it);
* ``instants_without_record`` = 0 and ``instants_with_two_records`` = 0: every instant of every
  trigger between the first instant after the warm-up and the last before the end has exactly one
  record (instants of the outage are decided late, or by the missed-fire policy with their cause);
* ``early_deliveries`` = 0 (arrival before the instant);
* ``rto_decided_s``: kill → the first fire decided on the new primary (required ≤ 30 s; the seed
  asks 5 min); ``rto_on_time_s``: kill → the first delivery within 1 s of its instant;
* ``extra_attempts_per_fire``; the stores' role metrics before and after.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
RTO_LIMIT_S = 30.0
S = 1_000_000


def _load(store: Any, sink: Any, shared: int, own: int) -> list[str]:
    """Three tenants sharing ``shared`` triggers of 1 s, one tenant with ``own``; their trigger ids."""
    from fireledger.clock import SystemClock
    from fireledger.domain.model import Policies
    from storekit import add_target, add_tenant, add_trigger

    now = SystemClock().now().latest_us
    ids = []
    tenants = [add_tenant(store, f"shared{i}") for i in range(3)]
    targets = [add_target(store, t, url=f"{sink.base_url}/ok", secret=SECRET) for t in tenants]
    for i in range(shared):
        t, tg = tenants[i % 3], targets[i % 3]
        ids.append(add_trigger(store, t, tg, {"every": "1s"}, now_us=now, policies=Policies(timeout_s=5.0))[0].id)
    big = add_tenant(store, "big")
    big_target = add_target(store, big, url=f"{sink.base_url}/ok", secret=SECRET)
    for _ in range(own):
        ids.append(add_trigger(store, big, big_target, {"every": "1s"}, now_us=now,
                               policies=Policies(timeout_s=5.0))[0].id)
    return ids


def _read_ledger(url: str) -> dict[str, Any]:
    """Fires and attempts as the promoted primary holds them (a fresh connection on the URL)."""
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as c:
        fires = c.execute("SELECT tenant_id, trigger_id, scheduled_us, seq, state, cause, decided_us, attempts "
                          "FROM fires").fetchall()
        port = c.info.port
    return {"fires": fires, "port": port}


def _wait_settled(url: str, timeout_s: float) -> bool:
    import psycopg

    from e2e import wait_until

    def settled() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=5) as c:
                row = c.execute("SELECT COUNT(*) FROM fires WHERE state IN ('pending', 'dispatching')").fetchone()
                return row is not None and row[0] == 0
        except psycopg.Error:
            return False

    try:
        wait_until(settled, timeout_s, "every committed fire to settle", interval_s=0.5)
        return True
    except TimeoutError:
        return False


def _figures(ledger: dict[str, Any], records: list[dict[str, Any]], killed_at: float,
             window: tuple[float, float], triggers: list[str]) -> dict[str, Any]:
    """The scenario's figures from the promoted primary's ledger and the sink's deliveries."""
    from fireledger.domain.keys import FireKey

    fires = ledger["fires"]
    by_key = {(r[0], r[1], int(r[2]), int(r[3])): r for r in fires}
    out: dict[str, Any] = {"fires": len(fires), "states": dict(Counter(r[4] for r in fires)),
                           "causes": dict(Counter(r[5] for r in fires if r[5]))}
    delivered_keys = []
    early = 0
    for rec in records:
        k = FireKey.parse(rec["fire_key"])
        delivered_keys.append((k.tenant_id, k.trigger_id, k.scheduled_us, k.seq))
        if rec["arrived_at"] * S < k.scheduled_us:
            early += 1
    out["deliveries"] = len(records)
    out["deliveries_without_record"] = sum(1 for k in set(delivered_keys) if k not in by_key)
    out["early_deliveries"] = early
    lo, hi = int(window[0] * S), int(window[1] * S)
    per_instant = Counter((r[1], int(r[2])) for r in fires if lo <= int(r[2]) <= hi)
    missing = 0
    wanted = set(triggers)
    grid: dict[str, list[int]] = {}
    for (trig, at) in per_instant:
        grid.setdefault(trig, []).append(at)
    for trig in wanted:
        ats = sorted(grid.get(trig, []))
        if not ats:
            missing += int((hi - lo) / S)
            continue
        # Each trigger's instants are 1 s apart: count the holes between its first and last in the window.
        missing += sum((b - a) // S - 1 for a, b in pairwise(ats))
    out["instants_checked"] = sum(per_instant.values())
    out["instants_without_record"] = missing
    out["instants_with_two_records"] = sum(1 for n in per_instant.values() if n > 1)
    after = [int(r[6]) for r in fires if int(r[6]) > killed_at * S]
    out["rto_decided_s"] = round((min(after) - killed_at * S) / S, 2) if after else None
    on_time = [rec["arrived_at"] for rec in records if rec["arrived_at"] > killed_at
               and rec["arrived_at"] * S - FireKey.parse(rec["fire_key"]).scheduled_us <= S]
    out["rto_on_time_s"] = round(min(on_time) - killed_at, 2) if on_time else None
    tail = sorted(rec["arrived_at"] - FireKey.parse(rec["fire_key"]).scheduled_us / S for rec in records
                  if window[1] - 3 <= rec["arrived_at"] <= window[1])
    out["lateness_at_end_p50_s"] = round(tail[len(tail) // 2], 3) if tail else None
    before = sorted(rec["arrived_at"] - FireKey.parse(rec["fire_key"]).scheduled_us / S for rec in records
                    if window[0] <= rec["arrived_at"] <= killed_at)
    out["lateness_before_kill_p50_s"] = round(before[len(before) // 2], 3) if before else None
    out.update(_recovery(records, killed_at, window[1]))
    extra = [int(r[7]) - 1 for r in fires if r[4] == "delivered"]
    out["extra_attempts_per_fire"] = round(sum(extra) / max(1, len(extra)), 4)
    out["max_extra_attempts"] = max(extra, default=0)
    out["duplicate_deliveries"] = sum(n - 1 for n in Counter(delivered_keys).values())
    return out


def _recovery(records: list[dict[str, Any]], killed_at: float, end: float) -> dict[str, Any]:
    """How soon delivery was on time again for good: ``on_time_again_s`` — kill → the instant after
    which every delivered instant (up to ``end``) arrived within 1 s of it; ``backlog_drained_s`` —
    kill → the arrival of the last delivery of an instant scheduled before that point (the backlog
    of the outage delivered)."""
    from fireledger.domain.keys import FireKey

    seen = [(FireKey.parse(r["fire_key"]).scheduled_us / S, r["arrived_at"]) for r in records]
    late = [at for at, arrived in seen if killed_at - 1 <= at <= end and arrived - at > 1.0]
    again = max(late, default=killed_at)
    backlog = [arrived for at, arrived in seen if killed_at - 1 <= at <= again]
    return {"on_time_again_s": round(again - killed_at, 2),
            "backlog_drained_s": round(max(backlog) - killed_at, 2) if backlog else 0.0}


def _judge(out: dict[str, Any]) -> list[str]:
    failures = []
    if out["deliveries_without_record"]:
        failures.append(f"{out['deliveries_without_record']} deliveries have no record on the promoted primary")
    if out["instants_without_record"]:
        failures.append(f"{out['instants_without_record']} instants have no record")
    if out["instants_with_two_records"]:
        failures.append(f"{out['instants_with_two_records']} instants have two records")
    if out["early_deliveries"]:
        failures.append(f"{out['early_deliveries']} deliveries arrived before their instant")
    if out["rto_decided_s"] is None or out["rto_decided_s"] > RTO_LIMIT_S:
        failures.append(f"no fire decided on the new primary within {RTO_LIMIT_S} s ({out['rto_decided_s']})")
    if out.get("promoted") in (None, out.get("killed_node")):
        failures.append(f"the standby was not promoted (primary after: {out.get('promoted')})")
    if not out.get("settled"):
        failures.append("committed fires did not settle after the run")
    return failures


def primary_kill(shared: int, own: int, warmup_s: float, after_s: float) -> dict[str, Any]:
    from e2e import Service, cli, wait_until
    from fireledger.store import SqlStore
    from hacluster import HaCluster
    from sink import SinkServer

    reason = HaCluster.available()
    if reason is not None:
        return {"passed": False, "error": reason}
    work = Path(tempfile.mkdtemp(prefix="store-failover-"))
    cluster = HaCluster()
    sink = SinkServer(secrets=[SECRET])
    sink.start_in_thread()
    procs: list[Any] = []
    out: dict[str, Any] = {"triggers": shared + own}
    try:
        t0 = time.monotonic()
        url = cluster.up()
        out["cluster_up_s"] = round(time.monotonic() - t0, 1)
        cli("db", "upgrade", "--db", url)
        store = SqlStore.open(url)
        try:
            triggers = _load(store, sink, shared, own)
        finally:
            store.close()
        env = {"FIRELEDGER_KEYRING": str(work / "keys.json")}
        control = Service(url, work, command="control", env=env).start(timeout_s=60)
        procs += [control, Service(url, work, command="dispatch", env=env).start()]
        procs += [Service(url, work, command="timing", env=env).start() for _ in range(2)]
        wait_until(lambda: len(sink.records()) >= len(triggers), 60, "deliveries to flow", interval_s=0.2)
        start = time.time()
        wait_until(lambda: time.time() >= start + warmup_s, warmup_s + 5, "the warm-up", interval_s=0.2)
        out["killed_node"] = cluster.primary()
        killed_at = cluster.lose_node(str(out["killed_node"]))
        end = killed_at + after_s
        wait_until(lambda: time.time() >= end, after_s + 5, "the run after the kill", interval_s=0.2)
        out["promoted"] = cluster.primary()
        for p in procs[2:]:
            p.stop()   # the timing processes: nothing new is decided; dispatch settles what is committed
        out["settled"] = _wait_settled(url, 60)
        ledger = _read_ledger(url)
        out.update(_figures(ledger, sink.records(), killed_at, (start + 2, end - 2), triggers))
        out["logs_mention_store_loss"] = sum(p.log_text().count("store") for p in procs)
    finally:
        for p in procs:
            p.stop()
        sink.stop()
        cluster.down()
    out["failures"] = _judge(out)
    out["passed"] = not out["failures"]
    return out


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    if quick:
        yield "store-failover-primary-kill", lambda: primary_kill(30, 30, 3.0, 20.0)
    else:
        yield "store-failover-primary-kill", lambda: primary_kill(300, 300, 20.0, 60.0)
