"""Pause, resume and the gaps they leave (the registry area's second half, :class:`RegistryGaps`; decision 0063).

* **Pause** (:meth:`RegistryGaps.pause_trigger`) turns an active trigger paused, removes its due row and
  records its *resume point* in ``triggers.paused_us``: the pause instant, or — when the due row
  still held an instant at or before the pause (not yet decided) — just before that instant. Every
  instant of the trigger after the resume point is undecided; every one at or before it is decided
  or was never due while the trigger was active.
* **Resume** (:meth:`RegistryGaps.resume_trigger`) turns it active and writes the due row the caller
  computed from the resume point (the first instant after it), compare-and-set on the state, the
  current version and the resume point read. The timing plane then plans the paused gap exactly like
  an outage: expired beyond the catch-up horizon, per missed-fire policy within it.
  ``triggers.resumed_us`` keeps the instant of the resume (the shadow rebuilder uses both).
* **A trigger the timing plane cannot plan** (:meth:`RegistryGaps.pause_failing`; decision 0087): its
  due instant is recorded ``failed`` with the cause, its due row removed (compare-and-set on the row
  the loop read) and the trigger paused with ``pause_reason`` and the failed instant as its resume
  point, in one transaction. A pause or resume by a principal clears the reason.
* **The last recorded gap** (:meth:`RegistryGaps.last_gap_fires`): the fire records of the most recent
  plan that missed instants — the plan of the newest ``catch-up`` fire, i.e. every ``scheduled`` and
  ``catch-up`` fire of the trigger sharing its ``decided_us`` (one plan per trigger per decision).

Writes take ``now_us`` from the caller; compare-and-sets use ``_one`` semantics (0 rows: moved
meanwhile, normal; more than 1: a bug).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fireledger.domain.model import DueRow, Fire, NewFire, Trigger
from fireledger.domain.trust_records import AuditNote

from . import queries
from . import rows as rec
from .backfill import PROGRESS_CHUNK
from .core import AppendAudit, Area, InvariantViolation, expect_one
from .engine import Engine, StoreError

_F = queries.FIRE_COLS_EVIDENCE
#: Stands for "no resume point recorded" in compare-and-sets (instants are never this small).
_NONE = -(2**62)

GAP_QUERIES: dict[str, str] = {
    "gp_pause": (
        "UPDATE triggers SET state = 'paused', updated_us = :now_us, pause_reason = NULL "
        "WHERE tenant_id = :tenant_id AND id = :id AND state = 'active'"
    ),
    "gp_pause_failing": (
        "UPDATE triggers SET state = 'paused', updated_us = :now_us, paused_us = :point_us, "
        "pause_reason = :reason WHERE tenant_id = :tenant_id AND id = :id AND state = 'active'"
    ),
    "gp_take_due": "DELETE FROM due WHERE trigger_id = :trigger_id RETURNING next_us",
    "gp_set_resume_point": "UPDATE triggers SET paused_us = :point_us WHERE tenant_id = :tenant_id AND id = :id",
    "gp_resume_point": (
        "SELECT paused_us FROM triggers WHERE tenant_id = :tenant_id AND id = :id AND state = 'paused'"
    ),
    "gp_resume": (
        "UPDATE triggers SET state = 'active', updated_us = :now_us, resumed_us = :now_us, "
        "pause_reason = NULL WHERE tenant_id = :tenant_id AND id = :id AND state = 'paused' "
        "AND current_version = :expected_version AND COALESCE(paused_us, :none) = :point_us"
    ),
    "gp_last_catch_up": (
        "SELECT decided_us FROM fires INDEXED BY fires_by_trigger "
        "WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND kind = 'catch-up' ORDER BY scheduled_us DESC, seq DESC LIMIT 1"
    ),
    "gp_plan_fires": (
        f"SELECT {_F} FROM fires INDEXED BY fires_by_trigger WHERE tenant_id = :tenant_id AND trigger_id = :trigger_id "
        "AND scheduled_us <= :decided_us AND decided_us = :decided_us AND kind IN ('scheduled', 'catch-up') "
        "ORDER BY scheduled_us, seq"
    ),
}

queries.register(GAP_QUERIES)


class RegistryGaps(Area):
    """Pause/resume with a recorded resume point, the last recorded gap, and backfill (the
    registry area's second half: :class:`~fireledger.store.registry.SqlRegistry` extends it)."""

    def __init__(self, engine: Engine, append_audit: AppendAudit) -> None:
        super().__init__(engine)
        self._audit = append_audit

    def pause_trigger(self, trigger: Trigger, now_us: int, *, audit: AuditNote | None = None) -> int | None:
        """Pause an active trigger: compare-and-set on its state, its due row removed, its resume
        point recorded and (when given) the ``audit`` row appended, in one transaction. Returns the
        resume point, or None when the trigger was not active any more (changed meanwhile: nothing
        written, no audit row)."""
        key = {"tenant_id": trigger.tenant_id, "id": trigger.id}
        with self.engine.write() as c:
            if not expect_one(c.execute(self.q["gp_pause"], {**key, "now_us": now_us}).rowcount, "pause_trigger"):
                return None
            rows = c.execute(self.q["gp_take_due"], {"trigger_id": trigger.id}).fetchall()
            if len(rows) > 1:
                raise StoreError(f"trigger {trigger.id} had {len(rows)} due rows")
            point = now_us
            if rows and rows[0][0] is not None:
                # An instant due at or before the pause but not decided yet stays in the gap.
                point = min(now_us, int(rows[0][0]) - 1)
            expect_one(c.execute(self.q["gp_set_resume_point"], {**key, "point_us": point}).rowcount, "resume point")
            if audit is not None:
                self._audit(c, audit)
            c.execute(self.q["bump_definitions"])
        return point

    def pause_failing(self, row: DueRow, fire: NewFire, reason: str, now_us: int) -> bool:
        """The timing plane could not plan ``row``: record ``fire`` (state ``failed``, its cause),
        remove the due row and pause the trigger with ``reason``, in one transaction. Compare-and-set
        on the due row as read: False (nothing written) when it moved meanwhile — an amendment, a
        pause or another node's decision; the loop reads it again next cycle."""
        with self.engine.write() as c:
            taken = c.execute(self.q["retire_due"], {
                "trigger_id": row.trigger_id, "expected_next_us": row.next_us,
                "expected_version": row.version, "new_next_us": None, "new_version": row.version}).rowcount
            if not expect_one(taken, "pause_failing"):
                return False
            c.execute(self.q["insert_fire"], rec.fire_params(fire))
            # Resume point: the failed instant is decided; a resume plans what follows it (0063).
            c.execute(self.q["gp_pause_failing"], {"tenant_id": row.tenant_id, "id": row.trigger_id,
                                                   "now_us": now_us, "point_us": row.next_us,
                                                   "reason": reason})
            c.execute(self.q["bump_definitions"])
        return True

    def resume_point(self, tenant_id: str, trigger_id: str) -> tuple[bool, int | None]:
        """``(paused, point)``: whether the trigger is paused, and its resume point (None for a
        trigger paused before resume points were recorded: it resumes from the resume instant)."""
        with self.engine.read() as c:
            row = c.execute(self.q["gp_resume_point"], {"tenant_id": tenant_id, "id": trigger_id}).fetchone()
        if row is None:
            return False, None
        return True, None if row[0] is None else int(row[0])

    def resume_trigger(self, trigger: Trigger, point_us: int | None, next_us: int | None, now_us: int, *,
                       audit: AuditNote | None = None) -> bool:
        """Resume a paused trigger with the due row at ``next_us`` (None: the schedule has no instant
        left, no row) and (when given) the ``audit`` row appended, in one transaction. Compare-and-set
        on the state, the current version and the resume point the caller computed ``next_us`` from:
        False when any moved (nothing written, no audit row)."""
        with self.engine.write() as c:
            ok = expect_one(c.execute(self.q["gp_resume"], {
                "tenant_id": trigger.tenant_id, "id": trigger.id, "now_us": now_us,
                "expected_version": trigger.current_version, "none": _NONE,
                "point_us": _NONE if point_us is None else point_us}).rowcount, "resume_trigger")
            if not ok:
                return False
            if next_us is not None:
                c.execute(self.q["upsert_due"], {"trigger_id": trigger.id, "tenant_id": trigger.tenant_id,
                                                 "partition": trigger.partition, "next_us": next_us,
                                                 "version": trigger.current_version})
            if audit is not None:
                self._audit(c, audit)
            c.execute(self.q["bump_definitions"])
        return True

    def last_gap_fires(self, tenant_id: str, trigger_id: str) -> list[Fire]:
        """The fire records of the trigger's most recent plan that missed instants (oldest first;
        range records included as recorded), or [] when it never missed one."""
        with self.engine.read() as c:
            row = c.execute(self.q["gp_last_catch_up"], {"tenant_id": tenant_id,
                                                         "trigger_id": trigger_id}).fetchone()
            if row is None:
                return []
            rows = c.execute(self.q["gp_plan_fires"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                       "decided_us": int(row[0])}).fetchall()
        return [rec.fire(r) for r in rows]

    def backfill_window(self, tenant_id: str, trigger_id: str, lo_us: int, hi_us: int,
                        seq: int) -> tuple[set[int], set[int]]:
        """For ``lo_us <= scheduled_us < hi_us``: (instants holding a fire with sequence ``seq``,
        instants holding a delivered fire of any sequence)."""
        present: set[int] = set()
        delivered: set[int] = set()
        with self.engine.read() as c:
            rows = c.execute(self.q["bf_window"], {"tenant_id": tenant_id, "trigger_id": trigger_id,
                                                   "lo": lo_us, "hi": hi_us, "seq": seq}).fetchall()
        for scheduled_us, s, state in rows:
            if int(s) == seq:
                present.add(int(scheduled_us))
            if state == "delivered":
                delivered.add(int(scheduled_us))
        return present, delivered

    def commit_backfill(self, fires: Sequence[NewFire], *, tenant_id: str, actor: str, at_us: int,
                        prior: Any, audit_new: dict[str, Any],
                        progress: Callable[[int, int], None] | None = None) -> list[NewFire]:
        """Insert ``fires`` and append the ``trigger.backfill`` audit row in one transaction; returns
        the fires inserted (a key that exists already inserts nothing). The audit row's ``new`` value
        is ``audit_new`` plus ``created`` and ``already_present`` as counted inside the transaction."""
        inserted: list[NewFire] = []
        total = len(fires)
        with self.engine.write() as c:
            for i, f in enumerate(fires):
                n = c.execute(self.q["insert_fire"], {
                    "tenant_id": f.tenant_id, "trigger_id": f.trigger_id, "scheduled_us": f.scheduled_us,
                    "seq": f.seq, "version": f.version, "kind": f.kind.value, "lane": f.lane.value,
                    "state": f.state.value, "cause": f.cause, "decided_us": f.decided_us,
                    "decided_by": f.decided_by, "finished_us": None, "tzdata_version": f.tzdata_version,
                    "next_attempt_us": f.not_before_us if f.not_before_us is not None else f.decided_us,
                    "eps_us": f.eps_us, "eps_source": f.eps_source, "dst": f.dst, "specs": f.specs,
                }).rowcount
                if n > 1:
                    raise InvariantViolation(f"insert_fire matched {n} rows")
                if n == 1:
                    inserted.append(f)
                if progress is not None and ((i + 1) % PROGRESS_CHUNK == 0 or i + 1 == total):
                    progress(i + 1, total)
            new = {**audit_new, "created": len(inserted),
                   "already_present": int(audit_new.get("already_present", 0)) + total - len(inserted)}
            self._audit(c, AuditNote(tenant_id, actor, "trigger.backfill", at_us, prior, new))
        return inserted


__all__ = ["GAP_QUERIES", "RegistryGaps"]
