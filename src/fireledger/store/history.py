"""The history area: history, evidence, report, console page and ops queries, and retention.

Everything here only *reads* the ledger, the due index, ``leases`` and ``nodes`` — except the
retention purge, which deletes terminal fires (and their attempts and outcomes) older than a cutoff
in small, separate transactions. Nothing here is on the fire path.

Contracts:

* Ranges are half-open on the scheduled instant: ``from_us <= scheduled_us < to_us``.
* Pages are keyset-paged: per trigger by ``(scheduled_us, seq)``, per tenant by
  ``(scheduled_us, trigger_id, seq)``, ascending or descending. The per-tenant range is the
  primary key (tenant, instant, trigger, seq; migration 0021); the per-trigger range is index
  ``fires_by_trigger`` (named with ``INDEXED BY`` on SQLite, decision 0210).
* The paging signal (:meth:`SqlHistory.due_waiting_by_partition`) counts, per partition, due-index
  rows whose instant has passed (not yet decided: the timing plane) and fires never attempted whose
  dispatch time has passed (decided, not dispatched: the dispatch plane). Retries of a fire already
  attempted are the target's problem, not a stall, and the recovery lanes (catch-up, backfill) drain
  at their capped rates by design: neither counts (decisions 0051, 0165).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from fireledger.domain.history_records import ALL_STATES, TERMINAL, ExpiringFire, TenantCursor
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Attempt, Fire, Trigger, TriggerVersion
from fireledger.domain.timing_records import LeaseRow, NodeRow

from . import queries
from . import rows as rec
from .lanes import HistoryLanes
from .reports import SmearRow

_STATE_SLOTS = ", ".join(f":s{i}" for i in range(len(ALL_STATES)))
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in TERMINAL)
_F = queries.FIRE_COLS_EVIDENCE
_LOW = -(2**62)
_HIGH = 2**62

_TRIGGER_RANGE = (
    f"SELECT {_F} FROM fires INDEXED BY fires_by_trigger WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
    "AND scheduled_us >= :lo AND scheduled_us < :hi AND state IN ({states}) "
)
_TENANT_RANGE = (
    f"SELECT {_F} FROM fires WHERE tenant_id = :tenant_id "
    "AND scheduled_us >= :lo AND scheduled_us < :hi AND state IN ({states}) "
)

HISTORY_QUERIES: dict[str, str] = {
    "hist_trigger_asc": _TRIGGER_RANGE.format(states=_STATE_SLOTS)
    + "AND (scheduled_us, seq) > (:c_us, :c_seq) ORDER BY scheduled_us, seq LIMIT :limit",
    "hist_trigger_desc": _TRIGGER_RANGE.format(states=_STATE_SLOTS)
    + "AND (scheduled_us, seq) < (:c_us, :c_seq) ORDER BY scheduled_us DESC, seq DESC LIMIT :limit",
    "hist_tenant_asc": _TENANT_RANGE.format(states=_STATE_SLOTS)
    + "AND (scheduled_us, trigger_id, seq) > (:c_us, :c_tr, :c_seq) "
      "ORDER BY scheduled_us, trigger_id, seq LIMIT :limit",
    "hist_tenant_desc": _TENANT_RANGE.format(states=_STATE_SLOTS)
    + "AND (scheduled_us, trigger_id, seq) < (:c_us, :c_tr, :c_seq) "
      "ORDER BY scheduled_us DESC, trigger_id DESC, seq DESC LIMIT :limit",
    "hist_attempts_of_fires": (   # keys: a JSON array of [tenant_id, trigger_id, scheduled_us, seq]
        "SELECT a.tenant_id, a.trigger_id, a.scheduled_us, a.seq, a.attempt, a.started_us, a.finished_us, "
        "a.result, a.http_status, a.error, a.node FROM json_each(:keys) j JOIN attempts a "
        "ON a.tenant_id = json_extract(j.value, '$[0]') AND a.trigger_id = json_extract(j.value, '$[1]') "
        "AND a.scheduled_us = json_extract(j.value, '$[2]') AND a.seq = json_extract(j.value, '$[3]') "
        "ORDER BY a.tenant_id, a.trigger_id, a.scheduled_us, a.seq, a.attempt"
    ),
    "hist_lateness": (
        "SELECT dispatched_us - scheduled_us FROM fires INDEXED BY fires_by_trigger WHERE tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us >= :lo AND scheduled_us < :hi "
        "AND dispatched_us IS NOT NULL ORDER BY scheduled_us DESC, seq DESC LIMIT :cap"
    ),
    "hist_trigger_state_counts": (
        "SELECT state, COUNT(*) FROM fires INDEXED BY fires_by_trigger "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us >= :lo AND scheduled_us < :hi GROUP BY state"
    ),
    "hist_tenant_state_counts": (
        "SELECT state, COUNT(*) FROM fires WHERE tenant_id = :tenant_id "
        "AND scheduled_us >= :lo AND scheduled_us < :hi GROUP BY state"
    ),
    "hist_recent_states": (
        "SELECT state FROM fires INDEXED BY fires_by_trigger WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us < :hi ORDER BY scheduled_us DESC, seq DESC LIMIT :n"
    ),
    "hist_ops_triggers": (
        f"SELECT {queries.TRIGGER_COLS} FROM triggers t LEFT JOIN due d ON d.trigger_id = t.id "
        "WHERE t.state <> 'deleted' AND (:tenant_id = '' OR t.tenant_id = :tenant_id) AND t.id > :after "
        "ORDER BY t.id LIMIT :limit"
    ),
    "hist_trigger_any": (
        f"SELECT {queries.TRIGGER_COLS} FROM triggers t LEFT JOIN due d ON d.trigger_id = t.id "
        "WHERE t.id = :id"
    ),
    # --- the paging signal and cluster state (read only) --------------------------------------
    "hist_due_by_partition": (
        "SELECT partition, MIN(next_us) FROM due WHERE next_us <= :now_us GROUP BY partition"
    ),
    "hist_undispatched_by_partition": (
        "SELECT t.partition, MIN(f.next_attempt_us) FROM fires f JOIN triggers t ON t.id = f.trigger_id "
        # Index fires_never_attempted (0017): a leased fire always has dispatched_us set, so
        # "live and never dispatched" is "pending and never dispatched" (decision 0194).
        "WHERE f.state = 'pending' AND f.dispatched_us IS NULL "
        "AND f.lane = 'on-time' AND f.next_attempt_us <= :now_us GROUP BY t.partition"
    ),
    "hist_lane_depths": (
        "SELECT lane, state, COUNT(*) FROM fires WHERE state IN ('pending', 'dispatching', 'held') "
        "GROUP BY lane, state"
    ),
    "hist_leases": "SELECT partition, owner, epoch, expires_us, eps_us FROM leases ORDER BY partition",
    "hist_nodes": (
        "SELECT id, role, started_us, heartbeat_us, eps_us, eps_source, shedding FROM nodes "
        "WHERE stopped_us IS NULL ORDER BY id"
    ),
    # --- retention ----------------------------------------------------------------------------
    "hist_tenant_ids": "SELECT id FROM tenants ORDER BY id",
    "hist_expiring": (
        f"SELECT {_F} FROM fires WHERE tenant_id = :tenant_id AND scheduled_us < :before_us "
        f"AND state IN ({_TERMINAL_SQL}) AND (scheduled_us, trigger_id, seq) > (:c_us, :c_tr, :c_seq) "
        "ORDER BY scheduled_us, trigger_id, seq LIMIT :limit"
    ),
    "hist_count_expiring": (
        "SELECT COUNT(*) FROM fires WHERE tenant_id = :tenant_id AND scheduled_us < :before_us "
        f"AND state IN ({_TERMINAL_SQL})"
    ),
    "hist_count_live_before": (
        "SELECT COUNT(*) FROM fires WHERE tenant_id = :tenant_id AND scheduled_us < :before_us "
        "AND state IN ('pending', 'dispatching', 'held')"
    ),
    "hist_outcome": (
        "SELECT outcome, reported_us FROM work_outcomes WHERE tenant_id = :tenant_id "
        "AND trigger_id = :trigger_id AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "hist_delete_fire": (
        "DELETE FROM fires WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        f"AND scheduled_us = :scheduled_us AND seq = :seq AND state IN ({_TERMINAL_SQL})"
    ),
    "hist_delete_attempts": (
        "DELETE FROM attempts WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
    "hist_delete_outcome": (
        "DELETE FROM work_outcomes WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us = :scheduled_us AND seq = :seq"
    ),
}

#: SQLite would otherwise scan the whole due index grouped by partition; the unary ``+`` makes it
#: take the (normally tiny) range of rows already due instead. PostgreSQL plans this by itself.
_OVERRIDES = {"sqlite": {"hist_due_by_partition": (
    "SELECT partition, MIN(next_us) FROM due WHERE next_us <= :now_us GROUP BY +partition")},
    "postgres": {"hist_attempts_of_fires": (
        "SELECT a.tenant_id, a.trigger_id, a.scheduled_us, a.seq, a.attempt, a.started_us, a.finished_us, "
        "a.result, a.http_status, a.error, a.node FROM jsonb_array_elements(CAST(:keys AS jsonb)) j "
        "JOIN attempts a ON a.tenant_id = j->>0 AND a.trigger_id = j->>1 "
        "AND a.scheduled_us = CAST(j->>2 AS bigint) AND a.seq = CAST(j->>3 AS bigint) "
        "ORDER BY a.tenant_id, a.trigger_id, a.scheduled_us, a.seq, a.attempt")}}

queries.register(HISTORY_QUERIES, _OVERRIDES)


def _states(states: Iterable[str] | None) -> dict[str, str]:
    chosen = list(dict.fromkeys(states)) if states else list(ALL_STATES)
    unknown = [s for s in chosen if s not in ALL_STATES]
    if unknown or not chosen:
        raise ValueError(f"unknown fire state {unknown[0]!r}" if unknown else "no state given")
    padded = chosen + [chosen[0]] * (len(ALL_STATES) - len(chosen))
    return {f"s{i}": s for i, s in enumerate(padded)}


class SqlHistory(HistoryLanes):
    """History, evidence, report, console page and retention queries (see the module docstring)."""

    def list_fires(self, tenant_id: str, trigger_id: str, after: tuple[int, int] | None = None,
                   limit: int = 100) -> list[Fire]:
        """Fires of one trigger, oldest first, after the cursor (scheduled_us, seq), with attempts."""
        after_us, after_seq = after if after is not None else (-(2**62), -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["list_fires"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                    "after_us": after_us, "after_seq": after_seq,
                                                    "limit": limit}).fetchall()
            fires = [rec.fire(r) for r in rows]
            if not fires:
                return []
            arows = c.execute(self.q["attempts_of_trigger_range"], {
                "tenant_id": tenant_id, "trigger_id": trigger_id, "from_us": fires[0].scheduled_us,
                "to_us": fires[-1].scheduled_us}).fetchall()
        by_key: dict[tuple[int, int], list[Attempt]] = {}
        for r in arows:
            by_key.setdefault((r[0], r[1]), []).append(rec.attempt(r[2:]))
        return [rec.with_attempts(f, by_key.get((f.scheduled_us, f.seq), [])) for f in fires]

    def get_fire(self, key: FireKey) -> Fire | None:
        """One fire with its attempts, or None."""
        params = {"tenant_id": key.tenant_id, "trigger_id": key.trigger_id,
                  "scheduled_us": key.scheduled_us, "seq": key.seq}
        with self.engine.read() as c:
            row = c.execute(self.q["get_fire"], params).fetchone()
            if not row:
                return None
            arows = c.execute(self.q["attempts_of_trigger_range"], {
                "tenant_id": key.tenant_id, "trigger_id": key.trigger_id, "from_us": key.scheduled_us,
                "to_us": key.scheduled_us}).fetchall()
        attempts = [rec.attempt(r[2:]) for r in arows if r[1] == key.seq]
        return rec.with_attempts(rec.fire(row), attempts)

    def history_fires(self, tenant_id: str, *, trigger_id: str | None = None, from_us: int | None = None,
                      to_us: int | None = None, states: Iterable[str] | None = None,
                      after: tuple[Any, ...] | None = None, limit: int = 100,
                      descending: bool = False) -> list[Fire]:
        """One page of a tenant's fires (of one trigger when ``trigger_id``), with their attempts.

        ``after`` is the last row of the previous page: ``(scheduled_us, seq)`` for one trigger,
        ``(scheduled_us, trigger_id, seq)`` for the tenant. ``states`` filters (default: every
        state; an unknown state raises ``ValueError``).
        """
        lo = _LOW if from_us is None else from_us
        hi = _HIGH if to_us is None else to_us
        params: dict[str, Any] = {"tenant_id": tenant_id, "lo": lo, "hi": hi, "limit": limit, **_states(states)}
        direction = "desc" if descending else "asc"
        if trigger_id is not None:
            c_us, c_seq = (after[0], after[-1]) if after else ((_HIGH, 0) if descending else (_LOW, -1))
            params.update(trigger_id=trigger_id, c_us=c_us, c_seq=c_seq)
            name = f"hist_trigger_{direction}"
        else:
            if after:
                if len(after) != 3:
                    raise ValueError("a tenant history cursor is (scheduled_us, trigger_id, seq)")
                c_us, c_tr, c_seq = after
            else:
                c_us, c_tr, c_seq = (_HIGH, "", 0) if descending else (_LOW, "", -1)
            params.update(c_us=c_us, c_tr=c_tr, c_seq=c_seq)
            name = f"hist_tenant_{direction}"
        # The row comparison is where the index scan starts: make it the tighter of the cursor and
        # the range bound (seq ≥ 0 and ids > '' make these bounds exact), so every page costs the same.
        if trigger_id is not None:
            if descending:
                params["c_us"], params["c_seq"] = min((params["c_us"], params["c_seq"]), (hi, -1))
            else:
                params["c_us"], params["c_seq"] = max((params["c_us"], params["c_seq"]), (lo, -1))
        elif descending:
            params["c_us"], params["c_tr"], params["c_seq"] = min(
                (params["c_us"], params["c_tr"], params["c_seq"]), (hi, "", -1))
        else:
            params["c_us"], params["c_tr"], params["c_seq"] = max(
                (params["c_us"], params["c_tr"], params["c_seq"]), (lo, "", -1))
        with self.engine.read() as c:
            fires = [rec.fire(r) for r in c.execute(self.q[name], params).fetchall()]
            return self._attach_attempts(c, fires, sparse=states is not None)

    def _attach_attempts(self, c: Any, fires: list[Fire], *, sparse: bool = False) -> list[Fire]:
        """Attach attempts: one range query per trigger on the page, or, for a ``sparse`` page (a
        state filter skips most fires in between), one query for the attempted fires by their keys."""
        if sparse:   # one statement for the page's attempted fires, by their keys
            keys = [[f.tenant_id, f.trigger_id, f.scheduled_us, f.seq] for f in fires
                    if f.attempts or f.dispatched_us is not None]
            found: dict[tuple[str, str, int, int], list[Attempt]] = {}
            if keys:
                for r in c.execute(self.q["hist_attempts_of_fires"], {"keys": json.dumps(keys)}).fetchall():
                    found.setdefault((str(r[0]), str(r[1]), int(r[2]), int(r[3])), []).append(rec.attempt(r[4:]))
            return [replace(f, attempt_list=tuple(found.get((f.tenant_id, f.trigger_id, f.scheduled_us, f.seq), ())))
                    if (f.attempts or f.dispatched_us is not None) else f for f in fires]
        spans: dict[tuple[str, str], list[int]] = {}
        for f in fires:
            if f.attempts or f.dispatched_us is not None:
                lo_hi = spans.setdefault((f.tenant_id, f.trigger_id), [f.scheduled_us, f.scheduled_us])
                lo_hi[0] = min(lo_hi[0], f.scheduled_us)
                lo_hi[1] = max(lo_hi[1], f.scheduled_us)
        by_key: dict[tuple[str, int, int], list[Attempt]] = {}
        for (tenant_id, trigger_id), (lo, hi) in spans.items():
            rows = c.execute(self.q["attempts_of_trigger_range"], {
                "tenant_id": tenant_id, "trigger_id": trigger_id, "from_us": lo, "to_us": hi}).fetchall()
            for r in rows:
                by_key.setdefault((trigger_id, r[0], r[1]), []).append(rec.attempt(r[2:]))
        return [replace(f, attempt_list=tuple(by_key.get((f.trigger_id, f.scheduled_us, f.seq), ())))
                for f in fires]

    def lateness_us(self, tenant_id: str, trigger_id: str, from_us: int, to_us: int,
                    cap: int = 200_000) -> list[int]:
        """Dispatched minus scheduled (µs) of the trigger's dispatched fires in the range, most recent
        first, at most ``cap`` of them."""
        with self.engine.read() as c:
            rows = c.execute(self.q["hist_lateness"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                       "lo": from_us, "hi": to_us, "cap": cap}).fetchall()
        return [int(r[0]) for r in rows]

    def state_counts(self, tenant_id: str, from_us: int, to_us: int,
                     trigger_id: str | None = None) -> dict[str, int]:
        """Fires per state in the range, for the tenant or one of its triggers."""
        params: dict[str, Any] = {"tenant_id": tenant_id, "lo": from_us, "hi": to_us}
        name = "hist_tenant_state_counts"
        if trigger_id is not None:
            params["trigger_id"] = trigger_id
            name = "hist_trigger_state_counts"
        with self.engine.read() as c:
            return {str(s): int(n) for s, n in c.execute(self.q[name], params).fetchall()}

    def recent_states(self, tenant_id: str, trigger_id: str, n: int, before_us: int = _HIGH) -> list[str]:
        """States of the trigger's last ``n`` fires scheduled before ``before_us``, newest first."""
        with self.engine.read() as c:
            rows = c.execute(self.q["hist_recent_states"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                            "hi": before_us, "n": n}).fetchall()
        return [str(r[0]) for r in rows]

    def ops_triggers(self, tenant_id: str | None = None, after: str = "", limit: int = 1000) -> list[Trigger]:
        """Live triggers of every tenant (or of ``tenant_id``), by id: the operator's listing."""
        with self.engine.read() as c:
            rows = c.execute(self.q["hist_ops_triggers"], {"tenant_id": tenant_id or "", "after": after,
                                                           "limit": limit}).fetchall()
        return [rec.trigger(r) for r in rows]

    def trigger_by_id(self, trigger_id: str) -> Trigger | None:
        """Any trigger by id, whatever its tenant or state (operator commands only)."""
        with self.engine.read() as c:
            row = c.execute(self.q["hist_trigger_any"], {"id": trigger_id}).fetchone()
        return rec.trigger(row) if row else None

    def due_waiting_by_partition(self, now_us: int) -> dict[int, int]:
        """Per partition, the oldest instant still waiting at ``now_us`` (µs): a due-index row not yet
        decided, or an on-time fire not yet attempted whose dispatch time has passed (the recovery
        lanes never page: decision 0165). Partitions with nothing waiting are absent."""
        out: dict[int, int] = {}
        with self.engine.read() as c:
            for name in ("hist_due_by_partition", "hist_undispatched_by_partition"):
                for part, oldest in c.execute(self.q[name], {"now_us": now_us}).fetchall():
                    if oldest is not None:
                        p = int(part)
                        out[p] = min(out.get(p, int(oldest)), int(oldest))
        return out

    def lane_depths(self) -> dict[tuple[str, str], int]:
        """Live fires (pending / dispatching / held by overlap policy queue) per (lane, state)."""
        with self.engine.read() as c:
            return {(str(lane), str(state)): int(n)
                    for lane, state, n in c.execute(self.q["hist_lane_depths"]).fetchall()}

    def lease_rows(self) -> list[LeaseRow]:
        """The partition leases table, read only (the timing plane owns it)."""
        with self.engine.read() as c:
            return [LeaseRow(int(r[0]), r[1], int(r[2]), int(r[3]), None if r[4] is None else int(r[4]))
                    for r in c.execute(self.q["hist_leases"]).fetchall()]

    def node_rows(self) -> list[NodeRow]:
        """Running nodes (not cleanly stopped) with their last heartbeat, ε and shedding flag, read only."""
        with self.engine.read() as c:
            return [NodeRow(str(r[0]), str(r[1]), int(r[2]), int(r[3]),
                            None if r[4] is None else int(r[4]), r[5], bool(r[6]))
                    for r in c.execute(self.q["hist_nodes"]).fetchall()]

    def tenant_ids(self) -> list[str]:
        """Every tenant id, deleted tenants included (their history expires like anyone's)."""
        with self.engine.read() as c:
            return [str(r[0]) for r in c.execute(self.q["hist_tenant_ids"]).fetchall()]

    def count_expiring(self, tenant_id: str, before_us: int) -> tuple[int, int]:
        """(terminal fires scheduled before ``before_us``, live fires scheduled before it)."""
        params = {"tenant_id": tenant_id, "before_us": before_us}
        with self.engine.read() as c:
            terminal = int(c.execute(self.q["hist_count_expiring"], params).fetchone()[0])
            live = int(c.execute(self.q["hist_count_live_before"], params).fetchone()[0])
        return terminal, live

    def expiring_batch(self, tenant_id: str, before_us: int, after: TenantCursor | None = None,
                       limit: int = 500) -> list[ExpiringFire]:
        """The next ``limit`` terminal fires of the tenant scheduled before ``before_us``, after the
        cursor, oldest first, with attempts and work outcome. Live fires are never returned."""
        c_us, c_tr, c_seq = after if after is not None else (_LOW, "", -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["hist_expiring"], {"tenant_id": tenant_id, "before_us": before_us,
                                                       "c_us": c_us, "c_tr": c_tr, "c_seq": c_seq,
                                                       "limit": limit}).fetchall()
            fires = self._attach_attempts(c, [rec.fire(r) for r in rows])
            out = []
            for f in fires:
                o = c.execute(self.q["hist_outcome"], {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                                                       "scheduled_us": f.scheduled_us, "seq": f.seq}).fetchone()
                out.append(ExpiringFire(f, None if o is None else str(o[0]), None if o is None else int(o[1])))
        return out

    def purge_fires(self, keys: Sequence[FireKey]) -> int:
        """Delete these fires (terminal ones only), their attempts and work outcomes, in ONE short
        transaction; returns how many fires were deleted. Callers keep batches small."""
        deleted = 0
        with self.engine.write() as c:
            for k in keys:
                p = {"tenant_id": k.tenant_id, "trigger_id": k.trigger_id, "scheduled_us": k.scheduled_us,
                     "seq": k.seq}
                n = c.execute(self.q["hist_delete_fire"], p).rowcount
                if n:
                    deleted += n
                    c.execute(self.q["hist_delete_attempts"], p)
                    c.execute(self.q["hist_delete_outcome"], p)
        return deleted

    def smear_rows(self, tenant_id: str, lo_us: int, hi_us: int, after: tuple[int, str, int] | None = None,
                   limit: int = 5000) -> list[SmearRow]:
        """One page of the tenant's on-time scheduled fires with ``lo_us <= scheduled_us < hi_us``,
        after the cursor ``(scheduled_us, trigger_id, seq)``; pass the last row's back for the next."""
        c_us, c_tr, c_seq = after if after is not None else (_LOW, "", -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["rp_smear_rows"], {"tenant_id": tenant_id, "lo": lo_us, "hi": hi_us,
                                                       "c_us": c_us, "c_tr": c_tr, "c_seq": c_seq,
                                                       "limit": limit}).fetchall()
        return [(str(r[0]), int(r[1]), int(r[2]), int(r[3]), None if r[4] is None else int(r[4])) for r in rows]

    def console_triggers(self, tenant_id: str, limit: int) -> list[tuple[Trigger, TriggerVersion | None]]:
        """The tenant's live triggers by id (at most ``limit``), each with its current version
        (its payload left out: ``b""``), in one statement."""
        with self.engine.read() as c:
            rows = c.execute(self.q["console_triggers"], {"tenant_id": tenant_id, "limit": limit}).fetchall()
        out: list[tuple[Trigger, TriggerVersion | None]] = []
        for r in rows:
            t = rec.trigger(r[:9])
            v = None
            if r[9] is not None:
                v = TriggerVersion(t.id, t.current_version, t.tenant_id, json.loads(r[9]), r[10], b"",
                                   rec.policies_from_json(r[11]), r[12], int(r[13]))
            out.append((t, v))
        return out

    def console_recent_states(self, tenant_id: str, limit: int, n: int, before_us: int) -> dict[str, list[str]]:
        """For the tenant's first ``limit`` live triggers by id: the states of each one's last ``n``
        fires scheduled before ``before_us``, newest first, in one statement (triggers without
        fires are absent)."""
        if n <= 0:
            return {}
        with self.engine.read() as c:
            rows = c.execute(self.q["console_recent_states"], {
                "tenant_id": tenant_id, "limit": limit, "hi": before_us, "skip": n - 1, "low": _LOW}).fetchall()
        grouped: dict[str, list[tuple[int, int, str]]] = {}
        for trigger_id, state, scheduled_us, seq in rows:
            grouped.setdefault(str(trigger_id), []).append((int(scheduled_us), int(seq), str(state)))
        return {tid: [s for _, _, s in sorted(items, reverse=True)[:n]] for tid, items in grouped.items()}

    def oldest_undispatched_us(self, now_us: int) -> int | None:
        """The oldest instant that is due (≤ ``now_us``) but not yet decided, or decided but not
        yet delivered; None when nothing is waiting."""
        with self.engine.read() as c:
            due = c.execute(self.q["earliest_due"]).fetchone()[0]
            fired = c.execute(self.q["oldest_undelivered"]).fetchone()[0]
        waiting = [int(x) for x in (due, fired) if x is not None and int(x) <= now_us]
        return min(waiting) if waiting else None

    def count_fires(self) -> int:
        """How many fire records the ledger holds (every tenant)."""
        with self.engine.read() as c:
            return int(c.execute(self.q["count_fires"]).fetchone()[0])


__all__ = ["HISTORY_QUERIES", "SqlHistory"]
