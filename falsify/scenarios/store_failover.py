"""``store-…`` scenarios: the PostgreSQL store under pg_auto_failover loses a node, or swaps its
primary and standby, while fires flow (issue 16).

Real processes throughout (falsify/ha_load.py): a pg_auto_failover cluster on this machine (monitor,
primary, synchronous standby; the monitor's health checks tightened so a lost node is acted on in
seconds), ``fireledger control``, ``dispatch`` and two ``timing`` processes on the multi-host URL
(``target_session_attrs=read-write``), a real HTTP sink that records every delivery. Load: triggers
of 1 s over three tenants sharing them and one tenant with as many of its own (no jitter).

Every scenario requires of the ledger read from the primary afterwards: every delivery the sink saw
has its fire record (RPO 0 for anything dispatched), every instant of every trigger in the window has
exactly one record, no delivery arrived before its instant, everything committed settled. Then:

* ``store-failover-primary-kill`` — the primary's node is lost (``kill -9`` of its ``pg_autoctl``
  supervisor and its postmaster at once: a killed postmaster alone is restarted by its keeper, which
  is no failover); the standby must be promoted and a fire decided on it within ``RTO_LIMIT_S`` of the
  kill (``rto_decided_s``; the seed asks 5 min). Reported: ``promotion_s`` (kill → the monitor logs
  the standby reporting ``wait_primary``/``primary``: the cluster's share of the RTO),
  ``rto_on_time_s`` (the first delivery within 1 s of its instant), ``on_time_again_s`` (from which
  instant on every delivery was within 1 s), ``backlog_drained_s``, ``extra_attempts_per_fire``.
* ``store-failover-switchover`` — a planned ``pg_autoctl perform switchover``: no delivery more than
  ``SWITCHOVER_LATE_LIMIT_S`` late or, when the cluster itself refused commits for longer than that
  leaves room for (``store_unwritable_s``, an independent probe), more than
  ``SWITCHOVER_RECOVERY_LIMIT_S`` after it (decision 0263), every instant of the window delivered,
  the other node primary afterwards, and ``fireledger status`` reporting it synchronous with one more promotion.
* ``store-standby-loss`` — the standby's node is lost: the primary stays primary, writes continue
  (``write_stall_s`` — the longest gap between two decisions — within ``RTO_LIMIT_S``, and fires are
  decided while replication is asynchronous), ``/metrics`` says so (``fireledger_store_sync_required``
  0: async declared), the node is started again, rejoins, ``fireledger_store_synchronous`` is 1 again,
  and the standby holds every fire of the primary (caught up).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from falsify.ha_load import Loaded, S, figures, finish, loaded_cluster, records_failures

RTO_LIMIT_S = 30.0
SWITCHOVER_LATE_LIMIT_S = 5.0
#: After the store accepts writes again, how long fireledger may take to catch up (decision 0263).
SWITCHOVER_RECOVERY_LIMIT_S = 2.0
PROMOTED = ("wait_primary", "primary")


def _unavailable() -> dict[str, Any] | None:
    from hacluster import HaCluster

    reason = HaCluster.available()
    return None if reason is None else {"passed": False, "error": reason}


def _status(url: str) -> dict[str, Any]:
    """``fireledger status --json``'s store section (a real CLI process)."""
    from e2e import cli

    return dict(json.loads(cli("status", "--db", url, "--json").stdout)["store"])


def _caught_up_at(url: str, since: float, until: float) -> float | None:
    """When (wall clock) the ledger on the read-write node first showed every trigger deciding again:
    a fire decided after ``since``, and each trigger's latest decided instant within
    :data:`CAUGHT_UP_LAG_S` of now (polled every 0.25 s; None if not by ``until``)."""
    import psycopg

    while time.time() < until:
        try:
            with psycopg.connect(url, connect_timeout=2) as c:
                row = c.execute("SELECT (SELECT max(decided_us) FROM fires), "
                                "(SELECT min(m) FROM (SELECT max(scheduled_us) AS m FROM fires GROUP BY trigger_id) t)"
                                ).fetchone()
            now = time.time()
            if row is not None and row[0] is not None and int(row[0]) > since * S \
                    and int(row[1]) >= (now - CAUGHT_UP_LAG_S) * S:
                return now
        except psycopg.Error:
            pass            # no read-write node yet: the failover is under way
        time.sleep(0.25)    # polling interval, bounded by ``until``
    return None


#: How far behind now each trigger's latest decided instant may be for the run to count as caught up.
CAUGHT_UP_LAG_S = 1.5


def primary_kill(shared: int, own: int, warmup_s: float, after_s: float,
                 steady_s: float | None = None) -> dict[str, Any]:
    """The primary's node lost; the run goes on ``after_s`` past the kill — or, with ``steady_s``, ends
    ``steady_s`` after every trigger is deciding current instants on the new primary again
    (:func:`_caught_up_at`), ``after_s`` being then the upper bound (quick form, decision 0223)."""
    if (skip := _unavailable()) is not None:
        return skip
    with loaded_cluster(shared, own, warmup_s, "store-failover-") as run:
        out = _run_phases(run, [_primary_kill(run, run.started, after_s, steady_s)])
    out["passed"] = not out["failures"]
    return out


def _primary_kill(run: Loaded, since: float, after_s: float, steady_s: float | None) -> _Phase:
    """Lose the primary's node now (see :func:`primary_kill`); judged on ``since + 2 … end − 2``."""
    out: dict[str, Any] = {"killed_node": run.cluster.primary()}
    killed_at = run.cluster.lose_node(str(out["killed_node"]))
    end = killed_at + after_s
    if steady_s is not None:
        caught_up = _caught_up_at(run.url, killed_at, end - steady_s)
        out["caught_up_s"] = None if caught_up is None else round(caught_up - killed_at, 2)
        end = min(end, caught_up + steady_s) if caught_up is not None else end
    run.wait(end)
    out["promoted"] = promoted = run.cluster.primary()
    at = run.cluster.reached(str(promoted), PROMOTED, killed_at) if promoted else None
    out["promotion_s"] = None if at is None else round(at - killed_at, 2)

    def settle(fires: list[tuple[Any, ...]]) -> None:
        out["logs_mention_store_loss"] = sum(p.log_text().count("store") for p in run.procs)

    return _Phase(killed_at, (since + 2, end - 2), out, settle, _primary_kill_failures)


def _primary_kill_failures(out: dict[str, Any]) -> list[str]:
    failures = []
    if out["rto_decided_s"] is None or out["rto_decided_s"] > RTO_LIMIT_S:
        failures.append(f"no fire decided on the new primary within {RTO_LIMIT_S} s ({out['rto_decided_s']})")
    if out.get("promoted") in (None, out.get("killed_node")):
        failures.append(f"the standby was not promoted (primary after: {out.get('promoted')})")
    return failures


@dataclass
class _Phase:
    """One event of a run: its instant, the window of instants judged, its own figures, and what
    is computed once the ledger is read (``settle(fires)``) and what it requires (``judge(out)``)."""

    began: float
    window: tuple[float, float]
    out: dict[str, Any]
    settle: Callable[[list[tuple[Any, ...]]], None]
    judge: Callable[[dict[str, Any]], list[str]]


def _switchover(run: Loaded, since: float, after_s: float) -> _Phase:
    """``pg_autoctl perform switchover`` now; the run goes on ``after_s`` past its start."""
    out: dict[str, Any] = {"primary_before": run.cluster.primary()}
    began = time.time()
    run.cluster.switchover()
    out["switchover_s"] = round(time.time() - began, 2)   # the command, until primary + secondary again
    end = began + after_s
    run.wait(end)
    out["primary_after"] = promoted = run.cluster.primary()
    at = run.cluster.reached(str(promoted), PROMOTED, began) if promoted else None
    out["promotion_s"] = None if at is None else round(at - began, 2)
    out["store_unwritable_s"] = run.probe.unwritable_s(began, end) if run.probe is not None else None
    return _Phase(began, (since + 2, end - 2), out, lambda fires: None, _switchover_failures)


def switchover_late_limit_s(store_unwritable_s: float) -> float:
    """The latest a delivery may be in a switchover (decision 0263): ``SWITCHOVER_LATE_LIMIT_S``, or —
    when the cluster itself refused commits for longer than that leaves room for — the store's own
    outage plus ``SWITCHOVER_RECOVERY_LIMIT_S`` (no fire can be delivered before its record commits)."""
    return max(SWITCHOVER_LATE_LIMIT_S, store_unwritable_s + SWITCHOVER_RECOVERY_LIMIT_S)


def _switchover_failures(out: dict[str, Any]) -> list[str]:
    failures = []
    unwritable = out["store_unwritable_s"]
    if unwritable is None or unwritable > RTO_LIMIT_S:
        failures.append(f"the store did not accept commits again within {RTO_LIMIT_S} s ({unwritable})")
    else:
        out["late_limit_s"] = limit = round(switchover_late_limit_s(unwritable), 2)
        out["lateness_after_store_back_s"] = (None if out["max_lateness_s"] is None
                                              else round(out["max_lateness_s"] - unwritable, 3))
        if out["max_lateness_s"] is None or out["max_lateness_s"] > limit:
            failures.append(f"a delivery {out['max_lateness_s']} s late, over the limit of {limit} s "
                            f"(the store refused commits for {unwritable} s)")
    if out["undelivered_in_window"]:
        failures.append(f"{out['undelivered_in_window']} fires of the window were not delivered")
    if out.get("primary_after") in (None, out.get("primary_before")):
        failures.append(f"the primary did not change ({out.get('primary_before')} → {out.get('primary_after')})")
    st = out["status"]
    if not (st["role"] == "primary" and st["synchronous"] and st["promotions"] >= 1):
        failures.append(f"fireledger status after the switchover: {st}")
    return failures


def _caught_up(cluster: Any, standby: str, timeout_s: float) -> bool:
    """Whether the rejoined standby comes to hold as many fires as the other data node (with the same
    latest decision) within ``timeout_s``: nothing is being written any more when this is asked. The
    other node is named, not reached through the read-write address: in the quick forms a switchover
    follows, after which that address leads to the rejoined node itself (a check of a node against
    itself, which passed whatever it held)."""
    import psycopg

    from e2e import wait_until

    sql = "SELECT count(*), max(decided_us) FROM fires"
    others = [n for n in cluster.ports if n not in (standby, "monitor")]
    assert len(others) == 1, f"expected one other data node beside {standby}: {sorted(cluster.ports)}"
    other = cluster.node_url(others[0])

    def same() -> bool:
        try:
            with psycopg.connect(other) as p, psycopg.connect(cluster.node_url(standby)) as s:
                return bool(p.execute(sql).fetchone() == s.execute(sql).fetchone())
        except psycopg.Error:
            return False

    try:
        return bool(wait_until(same, timeout_s, "the standby to catch up", interval_s=0.5))
    except TimeoutError:
        return False


#: How long the standby stays lost after asynchronous commits were declared (several 1 s instants).
ASYNC_HELD_S = 3.0


def _standby_loss(run: Loaded, since: float, lost_s: float, after_s: float) -> _Phase:
    """Lose the standby's node now, start it again ``lost_s`` later; the run goes on ``after_s``
    past the restart."""
    from e2e import wait_until

    watch = run.watch
    standby = run.cluster.secondary()
    out: dict[str, Any] = {"primary_before": run.cluster.primary(), "lost_node": standby,
                           "synchronous_before": watch.last("fireledger_store_synchronous")}
    killed_at = run.cluster.lose_node(str(standby))
    # Down for ``lost_s`` and, whatever the monitor's timing, for ASYNC_HELD_S after /metrics declared
    # asynchronous commits (bounded): the run must see writes continue in that state, not only its edge.
    try:
        wait_until(lambda: watch.first(killed_at, "fireledger_store_sync_required", 0.0) is not None,
                   lost_s + 30, "/metrics to declare asynchronous commits", interval_s=0.25)
    except TimeoutError:
        pass
    async_seen = watch.first(killed_at, "fireledger_store_sync_required", 0.0)
    run.wait(max(killed_at + lost_s, (async_seen or 0.0) + ASYNC_HELD_S))
    rejoin_at = time.time()
    run.cluster.rejoin()
    out["rejoin_s"] = round(time.time() - rejoin_at, 2)   # `up`: started, caught up, secondary again
    try:
        wait_until(lambda: watch.first(rejoin_at, "fireledger_store_synchronous", 1.0), 30,
                   "/metrics to say synchronous again", interval_s=0.25)
    except TimeoutError:
        pass
    end = rejoin_at + after_s
    run.wait(end)
    out["primary_after"] = run.cluster.primary()
    async_at = watch.first(killed_at, "fireledger_store_sync_required", 0.0)
    out["not_synchronous_after_s"] = _since(watch.first(killed_at, "fireledger_store_synchronous", 0.0), killed_at)
    out["async_declared_after_s"] = _since(async_at, killed_at)
    out["synchronous_again_after_rejoin_s"] = _since(watch.first(rejoin_at, "fireledger_store_synchronous", 1.0),
                                                     rejoin_at)

    def settle(fires: list[tuple[Any, ...]]) -> None:
        lo, hi = (async_at or rejoin_at) * S, rejoin_at * S
        out["decided_while_async"] = sum(1 for r in fires if lo < int(r[6]) < hi)
        out["standby_caught_up"] = _caught_up(run.cluster, str(standby), 60)

    return _Phase(killed_at, (since + 2, end - 2), out, settle, _standby_failures)


def _run_phases(run: Loaded, phases: list[_Phase]) -> dict[str, Any]:
    """Read the ledger once the phases ran; each phase's figures and failures (a list when several)."""
    fires = finish(run)
    records = run.sink.records()
    status = _status(run.url)
    done = []
    for ph in phases:
        ph.settle(fires)
        ph.out.update(figures(fires, records, ph.began, ph.window, run.triggers))
        ph.out["status"] = status
        ph.out["settled"] = run.out["settled"]
        ph.out["failures"] = records_failures(ph.out) + ph.judge(ph.out)
        done.append(ph.out)
    return {**run.out, **done[0]} if len(done) == 1 else {**run.out, "phases": done,
                                                           "failures": [f for d in done for f in d["failures"]]}


def switchover(shared: int, own: int, warmup_s: float, after_s: float) -> dict[str, Any]:
    if (skip := _unavailable()) is not None:
        return skip
    with loaded_cluster(shared, own, warmup_s, "store-switchover-") as run:
        out = _run_phases(run, [_switchover(run, run.started, after_s)])
    out["passed"] = not out["failures"]
    return out


def standby_loss(shared: int, own: int, warmup_s: float, lost_s: float, after_s: float) -> dict[str, Any]:
    if (skip := _unavailable()) is not None:
        return skip
    with loaded_cluster(shared, own, warmup_s, "store-standby-loss-") as run:
        out = _run_phases(run, [_standby_loss(run, run.started, lost_s, after_s)])
    out["passed"] = not out["failures"]
    return out


def quick_forms_on_one_cluster(shared: int, own: int) -> dict[str, Any]:
    """The quick forms of the three scenarios on one loaded cluster (``make test``, decision 0238):
    the primary's node killed, the killed node started again (it rejoins as the standby) and the
    same warm-up as a fresh cluster, the standby lost and back, then a switchover — each judged as its
    own scenario on its own window (``phases``: kill, standby loss, switchover)."""
    from e2e import wait_until

    if (skip := _unavailable()) is not None:
        return skip
    with loaded_cluster(shared, own, 3.0, "store-quick-forms-") as run:
        kill = _primary_kill(run, run.started, 20.0, 4.0)
        rejoin_at = time.time()
        run.cluster.rejoin()
        wait_until(lambda: run.watch.first(rejoin_at, "fireledger_store_synchronous", 1.0), 30,
                   "/metrics to say synchronous once the killed node rejoined", interval_s=0.25)
        since = time.time()
        kill.out["killed_node_rejoined_s"] = round(since - rejoin_at, 2)
        run.wait(since + 3.0)                  # the warm-up a fresh cluster gets before its event
        lost = _standby_loss(run, since, 6.0, 3.0)
        switched = _switchover(run, time.time(), 8.0)
        out = _run_phases(run, [kill, lost, switched])
    out["passed"] = not out["failures"]
    return out


def _since(at: float | None, since: float) -> float | None:
    return None if at is None else round(at - since, 2)


def _standby_failures(out: dict[str, Any]) -> list[str]:
    failures = []
    if out.get("primary_after") != out.get("primary_before"):
        failures.append(f"the primary changed ({out.get('primary_before')} → {out.get('primary_after')})")
    if out["synchronous_before"] != 1.0:
        failures.append(f"/metrics did not say synchronous before the loss ({out['synchronous_before']})")
    if out["async_declared_after_s"] is None:
        failures.append("/metrics never said that commits stopped waiting for a standby (async not declared)")
    if not out.get("decided_while_async"):
        failures.append("no fire was decided while replication was asynchronous: writes did not continue")
    if out["write_stall_s"] > RTO_LIMIT_S:
        failures.append(f"writes stalled for {out['write_stall_s']} s (limit {RTO_LIMIT_S} s)")
    if out["synchronous_again_after_rejoin_s"] is None:
        failures.append("/metrics never said synchronous again after the standby rejoined")
    if not out.get("standby_caught_up"):
        failures.append("the rejoined standby does not hold every fire of the primary")
    if out["undelivered_in_window"]:
        failures.append(f"{out['undelivered_in_window']} fires of the window were not delivered")
    if not (out["status"]["synchronous"] and out["status"]["role"] == "primary"):
        failures.append(f"fireledger status after the rejoin: {out['status']}")
    return failures


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    if quick:
        yield "store-failover-primary-kill", lambda: primary_kill(30, 30, 3.0, 20.0, steady_s=4.0)
        yield "store-failover-switchover", lambda: switchover(30, 30, 3.0, 15.0)
        yield "store-standby-loss", lambda: standby_loss(30, 30, 3.0, 8.0, 8.0)
    else:
        yield "store-failover-primary-kill", lambda: primary_kill(300, 300, 20.0, 60.0)
        yield "store-failover-switchover", lambda: switchover(300, 300, 20.0, 60.0)
        yield "store-standby-loss", lambda: standby_loss(300, 300, 20.0, 30.0, 30.0)
