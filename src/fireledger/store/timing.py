"""The timing area: due reads, the decisions that commit fires and advance due rows, manual fires,
the overlap policy's facts and held fires; partitions, leases, node sessions and the shadow
rebuilder in :class:`~fireledger.store.leases.TimingLeases`.

Contracts (:class:`~fireledger.store.protocols.TimingStore` states each one):

* A decision's fires and its due-row advance commit together; the due row's compare-and-set decides
  who decided: a fire whose key exists inserts nothing (decided elsewhere), and when the due row
  moved the fires this call inserted for it are removed again.
* Instants come from the caller (``now_us``, ``until_us``): the store never reads a clock.
* On an engine that notifies (PostgreSQL), a transaction that inserted fires also sends ONE
  ``NOTIFY fireledger_fires`` (payload: how many fires it inserted, nothing else), so it is delivered
  at commit only and never for a rolled-back transaction: dispatch processes listening
  (:mod:`fireledger.store.listen`) claim at once instead of at their idle poll (decision 0221).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fireledger.domain.model import Advance, ClaimOutcome, Decision, DueRow, FireUpdate, NewFire, Policies
from fireledger.domain.timing_records import FireFacts, HeldRow, OverlapFacts
from fireledger.domain.trust_records import AuditNote

from . import queries
from . import rows as rec
from .core import AppendAudit, InvariantViolation, expect_one
from .decisions import advance_rows, fire_rows, write_batch
from .engine import Engine
from .leases import TimingLeases
from .overlap import update_params

# The tzdata version of each trigger's latest decided instant (scheduled / catch-up fires; manual and
# backfill fires do not move the recurrence), for ids given as [[tenant_id, trigger_id], ...]: one
# statement, one primary-key probe per trigger (decision 0162).
_LATEST_TZ = ("SELECT {t}, (SELECT f.tzdata_version FROM fires f INDEXED BY fires_by_trigger "
              "WHERE f.tenant_id = {a} AND f.trigger_id = {t} "
              "AND f.kind IN ('scheduled', 'catch-up') ORDER BY f.scheduled_us DESC, f.seq DESC LIMIT 1) "
              "FROM {each}")
queries.register(
    {"tm_latest_tzdata": _LATEST_TZ.format(a="json_extract(j.value, '$[0]')", t="json_extract(j.value, '$[1]')",
                                           each="json_each(:ids) j")},
    {"postgres": {"tm_latest_tzdata": _LATEST_TZ.format(a="j->>0", t="j->>1",
                                                        each="jsonb_array_elements(CAST(:ids AS jsonb)) j")}})
# Fires committed: one notification per transaction, its payload a count (decision 0221). SQLite has
# no notifications; the statement is run only where ``engine.caps.notify``.
queries.register({"tm_notify_fires": "SELECT :n"},
                 {"postgres": {"tm_notify_fires": "SELECT pg_notify('fireledger_fires', CAST(:n AS text))"}})


class SqlTiming(TimingLeases):
    """The timing plane's store (module docstring)."""

    def __init__(self, engine: Engine, append_audit: AppendAudit) -> None:
        super().__init__(engine)
        self._audit = append_audit

    def due_rows(self, until_us: int, limit: int) -> list[DueRow]:
        """Due-index rows with ``next_us <= until_us``, earliest first."""
        with self.engine.read() as c:
            rows = c.execute(self.q["due_rows"], {"until_us": until_us, "limit": limit}).fetchall()
        return [DueRow(*r) for r in rows]

    def version_plans(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[str, Policies]]:
        """What planning needs of many trigger versions, in one statement: ``(trigger_id, version)``
        → (the schedule as stored — its JSON text —, the decoded policies); missing ones are absent.
        A stored policy that does not decode raises (the caller reads those versions one by one)."""
        if not pairs:
            return {}
        with self.engine.read() as c:
            rows = c.execute(self.q["tm_versions"], {"ids": json.dumps(sorted(set(pairs)))}).fetchall()
        return {(str(r[0]), int(r[1])): (str(r[2]), rec.policies_from_json(r[3])) for r in rows}

    def earliest_due(self) -> int | None:
        """The earliest ``next_us`` of the whole due index, or None when it is empty."""
        with self.engine.read() as c:
            row = c.execute(self.q["earliest_due"]).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def apply_decisions(self, decisions: Sequence[Decision]) -> list[ClaimOutcome]:
        """Commit fires and due-row advances in ONE transaction.

        For each decision: insert its fires (a primary-key conflict inserts nothing: decided
        elsewhere), then compare-and-set the due row. When the CAS finds the row moved (another
        decider, or an amendment/pause committed meanwhile) the fires this call inserted for it are
        removed again, so nothing is decided against a definition no longer in force.
        """
        q = self.q
        outcomes: list[ClaimOutcome] = []
        if not decisions:
            return outcomes
        with self.engine.write() as c:
            fast = self._apply_all_or_nothing(c, decisions)
            if fast is not None:
                for d in decisions:
                    if d.updates:   # overlap: a held fire superseded (every row advanced here)
                        self._apply_fire_updates(c, d.updates)
                self._announce_fires(c, sum(len(o.inserted) for o in fast))
                return fast
            for d in decisions:
                inserted = []
                for f in d.fires:
                    n = c.execute(q["insert_fire"], rec.fire_params(f)).rowcount
                    if expect_one(n, "insert_fire"):
                        inserted.append(f)
                a = d.advance
                params = rec.advance_params(a)
                if a.new_next_us is None:
                    advanced = expect_one(c.execute(q["retire_due"], params).rowcount, "retire_due")
                else:
                    advanced = expect_one(c.execute(q["advance_due"], params).rowcount, "advance_due")
                if not advanced and inserted:
                    for f in inserted:
                        c.execute(q["delete_fire"], {"tenant_id": f.tenant_id, "trigger_id": f.trigger_id,
                                                     "scheduled_us": f.scheduled_us, "seq": f.seq})
                    inserted = []
                if advanced and d.updates:   # overlap: a held fire superseded, only with its decision
                    self._apply_fire_updates(c, d.updates)
                outcomes.append(ClaimOutcome(a.trigger_id, advanced, tuple(inserted)))
            self._announce_fires(c, sum(len(o.inserted) for o in outcomes))
        return outcomes

    def _apply_all_or_nothing(self, c: Any, decisions: Sequence[Decision]) -> list[ClaimOutcome] | None:
        """The common case in bulk: every fire is new and every due row is where the decision
        expects it. One statement per kind of write for the whole batch (the fires, the due rows
        advanced, the due rows retired: ``store/decisions.py``), inside a savepoint; when a count
        differs (a fire decided elsewhere, a row moved) the savepoint is rolled back and None
        returned, and the caller decides row by row. Counts are exact: every element matches at
        most its own row (primary key) and the batch's trigger ids are distinct (checked here), so
        a count equal to the number of elements means each matched once."""
        q = self.q
        if len({d.advance.trigger_id for d in decisions}) != len(decisions):
            return None   # one trigger twice in a batch: only the row-by-row path can tell them apart
        fires = [f for d in decisions for f in d.fires]
        advances = [d.advance for d in decisions if d.advance.new_next_us is not None]
        retires = [d.advance for d in decisions if d.advance.new_next_us is None]
        cur = c.cursor()
        cur.execute("SAVEPOINT apply_bulk")
        ok = True
        for name, elements in (("tm_insert_fires", fire_rows(fires)), ("tm_advance_due", advance_rows(advances)),
                               ("tm_retire_due", advance_rows(retires))):
            if not elements:
                continue
            n = write_batch(cur, self.engine.name, q, name, elements)
            if n > len(elements):
                raise InvariantViolation(f"{name}: {n} rows matched {len(elements)} keys")
            if n != len(elements):
                ok = False
                break
        if not ok:
            cur.execute("ROLLBACK TO SAVEPOINT apply_bulk")
            cur.execute("RELEASE SAVEPOINT apply_bulk")
            return None
        cur.execute("RELEASE SAVEPOINT apply_bulk")
        return [ClaimOutcome(d.advance.trigger_id, True, tuple(d.fires)) for d in decisions]

    def insert_fires(self, fires: Sequence[NewFire], *, audit: AuditNote | None = None) -> list[NewFire]:
        """Commit fires that advance no due row (manual runs) in one transaction; returns those
        inserted — a fire whose key exists already inserts nothing (decided elsewhere). ``audit`` is
        appended in the same transaction when at least one fire was inserted (none: no audit row)."""
        inserted = []
        with self.engine.write() as c:
            for f in fires:
                n = c.execute(self.q["insert_fire"], {
                    "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
                    "seq": f.seq, "version": f.version, "kind": f.kind.value, "lane": f.lane.value,
                    "state": f.state.value, "cause": f.cause, "decided_us": f.decided_us,
                    "decided_by": f.decided_by, "finished_us": None, "tzdata_version": f.tzdata_version,
                    "next_attempt_us": f.not_before_us if f.not_before_us is not None else f.decided_us,
                    "eps_us": f.eps_us, "eps_source": f.eps_source, "dst": f.dst, "specs": f.specs,
                }).rowcount
                if expect_one(n, "insert_fire"):
                    inserted.append(f)
            if audit is not None and inserted:
                self._audit(c, audit)
            self._announce_fires(c, len(inserted))
        return inserted

    def overlap_facts(self, triggers: Sequence[tuple[str, str]]) -> dict[str, OverlapFacts]:
        """Previous and held fire of each ``(tenant_id, trigger_id)``, keyed by trigger id, in one
        statement (triggers with neither are absent)."""
        if not triggers:
            return {}
        ids = json.dumps(sorted({(t, tr) for t, tr in triggers}))
        prev: dict[str, FireFacts] = {}
        held: dict[str, FireFacts] = {}
        with self.engine.read() as c:
            rows = c.execute(self.q["ov_facts"], {"ids": ids}).fetchall()
        for r in rows:
            f = FireFacts(str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5]), str(r[6]),
                          None if r[7] is None else int(r[7]), bool(r[8]))
            into = prev if r[0] == "p" else held
            old = into.get(f.trigger_id)
            if old is None or (f.scheduled_us, f.seq) > (old.scheduled_us, old.seq):
                into[f.trigger_id] = f
        return {tid: OverlapFacts(prev.get(tid), held.get(tid)) for tid in set(prev) | set(held)}

    def held_fires(self, after: tuple[int, str, int] | None = None, limit: int = 1000) -> list[HeldRow]:
        """A page of held fires (at most one per trigger) in ``(scheduled_us, trigger_id, seq)``
        order, after the cursor (the last row of the previous page)."""
        c_us, c_tr, c_seq = after if after is not None else (-(2**62), "", -1)
        with self.engine.read() as c:
            rows = c.execute(self.q["ov_held_all"], {"limit": limit, "c_us": c_us, "c_tr": c_tr,
                                                     "c_seq": c_seq}).fetchall()
        return [HeldRow(str(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]),
                        str(r[7]), str(r[8]), str(r[9])) for r in rows]

    def release_held(self, updates: Sequence[FireUpdate]) -> list[bool]:
        """Apply held-fire updates (compare-and-set on the expected state) in ONE transaction;
        per update, True when it changed its fire (False: released or superseded elsewhere)."""
        if not updates:
            return []
        with self.engine.write() as c:
            changed = self._apply_fire_updates(c, updates)
            self._announce_fires(c, sum(changed))   # released fires are due to dispatch now
            return changed

    def latest_tzdata(self, triggers: Sequence[tuple[str, str]]) -> dict[str, str]:
        """The tzdata version recorded on each ``(tenant_id, trigger_id)``'s latest decided instant
        (its newest scheduled or catch-up fire), keyed by trigger id, in one statement; a trigger
        never decided is absent."""
        if not triggers:
            return {}
        with self.engine.read() as c:
            rows = c.execute(self.q["tm_latest_tzdata"], {"ids": json.dumps(sorted(set(triggers)))}).fetchall()
        return {str(r[0]): str(r[1]) for r in rows if r[1] is not None}

    def reresolve_due(self, advance: Advance, audit: AuditNote) -> bool:
        """Move one due row to the instant the running zone rules give (``tzdata diff --apply``,
        decision 0163): the compare-and-set of ``advance`` (``new_next_us`` None removes the row) and
        ``audit`` appended in ONE transaction. False — and no audit row — when the row moved
        meanwhile (decided, amended, paused)."""
        params = rec.advance_params(advance)
        with self.engine.write() as c:
            name = "retire_due" if advance.new_next_us is None else "advance_due"
            if not expect_one(c.execute(self.q[name], params).rowcount, name):
                return False
            self._audit(c, audit)
        return True

    def _announce_fires(self, c: Any, inserted: int) -> None:
        """Inside the write transaction ``c``: when it inserted fires and the engine notifies, queue
        one ``fireledger_fires`` notification (delivered at commit, dropped by a rollback); on an
        engine without notifications, ring its fires bell after the commit (SQLite, decision 0256)."""
        if inserted <= 0:
            return
        if self.engine.caps.notify:
            c.execute(self.q["tm_notify_fires"], {"n": str(inserted)})
        else:
            self.engine.ring_fires_after_commit()

    def _apply_fire_updates(self, c: Any, updates: Sequence[FireUpdate]) -> list[bool]:
        return [expect_one(c.execute(self.q["ov_update"], update_params(u)).rowcount, "overlap fire update")
                for u in updates]


__all__ = ["SqlTiming"]
