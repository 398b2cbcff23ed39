"""The definitions service: every act on a trigger's definition, each one store transaction.

A caller (the API, the operator CLI, the benchmarks, the falsification harness, the tests) hands
the :class:`Registry` what it was asked; the registry checks it with the same code for everyone
(:mod:`.checks`: problems name the fields as the API names them), builds the rows — the trigger, its
immutable version, its partition (:func:`~fireledger.domain.partition.partition_of`), the payload
sealed under the tenant's data key, the single due row — and writes them **together with the act's
audit row in one store transaction** (invariant 5 for the due row, invariant 13 for the audit): a
failure anywhere, the audit append included, leaves nothing written. Only after the commit does it
call ``on_change`` (the embedded timing loop's wake-up; a failure there is logged and changes
nothing, since the loop also polls the store's definitions counter).

What is audited is what was audited before the service existed (decision 0105): a create or an
amendment that sets a policy field (``trigger.policy``: actor, the policy values before — None at
creation — and after, and the fields touched), a manual run (``trigger.run``: the fire key) and a
backfill (``trigger.backfill``: the window and counts, :func:`fireledger.backfill.run_backfill`).
A pause or a resume made for an ``actor`` (the API and the console name one) writes
``trigger.pause`` / ``trigger.resume`` (decision 0180); a delete writes no audit row.

Refusals are :mod:`.errors` (nothing written): ``Invalid`` (fields), ``NotFound``, ``Conflict`` (a
state that does not allow the act, or a compare-and-set lost to a concurrent change),
``LimitReached``. Role checks are the surfaces' (the API's guard): the registry acts for whoever
the caller says ``actor`` is.

The registry never reads a clock: each act takes ``now_us`` (or a clock reading, for acts that
commit fires) from its caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fireledger.backfill import DEFAULT_MAX, BackfillRefused, BackfillResult, run_backfill
from fireledger.clock import Interval
from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.keys import FireKey, from_us, new_id
from fireledger.domain.model import (
    Fire,
    FireKind,
    FireState,
    Lane,
    NewFire,
    Policies,
    Trigger,
    TriggerState,
    TriggerVersion,
)
from fireledger.domain.partition import partition_of
from fireledger.domain.trust_records import AuditNote
from fireledger.recurrence import TZDATA_VERSION, Recurrence, RecurrenceError, compile_spec, format_duration
from fireledger.security.envelope import seal_payload
from fireledger.security.limits import trigger_input_problems, trigger_limit_problem
from fireledger.store import Store

from . import checks
from .errors import Conflict, Invalid, LimitReached, NotFound

log = logging.getLogger("fireledger.registry")

#: The fields that make a version's :class:`Policies`.
_POLICY_INPUTS = checks.POLICY_FIELDS | {"jitter", "timeout", "retry"}
#: Triggers per transaction in :meth:`Registry.create_many`.
BATCH = 10_000


@dataclass(frozen=True)
class Definition:
    """A definition that passed every check, compiled; nothing stored yet. ``payload`` is the
    encoded JSON in clear (sealed when written); ``next_us`` the first instant after the check's
    instant (None: the schedule has none)."""

    name: str
    rec: Recurrence
    target_id: str
    payload: bytes
    policies: Policies
    next_us: int | None


@dataclass(frozen=True)
class Current:
    """A trigger as stored and its current version (``trigger.next_us`` from the due row)."""

    trigger: Trigger
    version: TriggerVersion


def _policy_values(p: Policies) -> dict[str, Any]:
    """The policy fields as the API writes them (the audit's ``prior``/``new`` values)."""
    return {"missed_fire_policy": p.missed_fire.value,
            "catchup_horizon": format_duration(timedelta(seconds=p.catchup_horizon_s)),
            "overlap_policy": p.overlap.value,
            "outcome_window": format_duration(timedelta(seconds=p.outcome_window_s))}


def policy_audit(tenant_id: str, actor: str, trigger_id: str, prior: Policies | None, new: Policies,
                 fields: Collection[str], at_us: int) -> AuditNote | None:
    """The ``trigger.policy`` audit row of a change touching ``fields`` (``prior`` None: set at
    creation), or None when no policy field is among them."""
    touched = sorted(set(fields) & checks.POLICY_FIELDS)
    if not touched:
        return None
    before = {"trigger_id": trigger_id, **_policy_values(prior)} if prior is not None else None
    after = {"trigger_id": trigger_id, **_policy_values(new), "fields": touched}
    return AuditNote(tenant_id, actor, "trigger.policy", at_us, before, after)


class Registry:
    """Definition acts over one store (module docstring). Cheap to build: holds no state but the
    store and the wake-up hook, so a surface may build one per request."""

    def __init__(self, store: Store, on_change: Callable[[], None] | None = None) -> None:
        self.store = store
        self._on_change = on_change

    def _changed(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change()
        except Exception as exc:  # the change is committed; a failed wake-up only delays the loop
            log.warning("on_definition_change failed: %s", type(exc).__name__)

    # --- reads ---------------------------------------------------------------------------------

    def current(self, tenant_id: str, trigger_id: str) -> Current:
        """The tenant's trigger and its current version. ``NotFound("trigger")`` when absent, deleted
        or another tenant's (reported alike)."""
        t = self.store.registry.get_trigger(tenant_id, trigger_id)
        if t is None:
            raise NotFound("trigger")
        v = self.store.registry.get_version(t.id, t.current_version)
        if v is None or v.tenant_id != tenant_id:
            raise NotFound("trigger")
        return Current(t, v)

    def current_any(self, trigger_id: str) -> Current:
        """Any tenant's trigger by id (operator commands). ``NotFound`` when absent or deleted."""
        t = self.store.history.trigger_by_id(trigger_id)
        if t is None or t.state == TriggerState.DELETED:
            raise NotFound("trigger")
        v = self.store.registry.get_version(t.id, t.current_version)
        if v is None:
            raise NotFound("trigger version")
        return Current(t, v)

    # --- create --------------------------------------------------------------------------------

    def check_create(self, tenant_id: str, values: Mapping[str, Any], now_us: int) -> Definition:
        """Every check a create makes of ``values`` (API field names and forms: ``name``, ``schedule``
        object, ``target_id``, ``payload`` object, policy durations…; absent optional fields take the
        domain defaults) at ``now_us``, and the compiled result. Stores nothing (the create dry run
        answers from it). Raises ``Invalid`` naming every bad field."""
        errors: checks.Errors = [(f, "is required") for f in ("name", "schedule", "target_id") if f not in values]
        if errors:
            raise Invalid(errors)
        schedule, body = values["schedule"], values.get("payload", {})
        errors = trigger_input_problems({"schedule": schedule, "payload": body})
        name = checks.name(values["name"], errors)
        rec = checks.compile_schedule(schedule, now_us, errors)
        checks.target_problem(self.store, tenant_id, values["target_id"], now_us, errors)
        payload = checks.payload(body, errors)
        policies = checks.policies({k: v for k, v in values.items() if k in _POLICY_INPUTS},
                                   Policies(), errors)
        nxt = checks.next_instant(rec, now_us, errors) if rec is not None else None
        if errors or rec is None:
            raise Invalid(errors)
        return Definition(name, rec, values["target_id"], payload, policies, nxt)

    def create(self, tenant_id: str, actor: str, values: Mapping[str, Any], *, now_us: int,
               explicit: Collection[str] | None = None) -> Current:
        """Create a trigger from ``values`` (as :meth:`check_create`) at ``now_us``.

        Refuses, writing nothing: ``LimitReached`` when the tenant has its maximum of live triggers
        (checked first), ``Invalid`` for any bad field. Writes, in ONE transaction: the trigger (a new
        id, its partition), version 1 (normalised schedule, payload sealed), the due row at the first
        instant, and — when ``explicit`` (the fields the client set; default: every key of ``values``)
        names a policy field — the ``trigger.policy`` audit row by ``actor``. Returns the stored
        trigger (``next_us`` set) and version."""
        over = trigger_limit_problem(self.store, tenant_id)
        if over:
            raise LimitReached(over)
        d = self.check_create(tenant_id, values, now_us)
        return self.create_checked(tenant_id, actor, d, now_us=now_us,
                                   audited=values.keys() if explicit is None else explicit)

    def _rows(self, tenant_id: str, d: Definition, now_us: int, tid: str, part: int,
              schedule: dict[str, Any] | None = None) -> tuple[Trigger, TriggerVersion]:
        """The rows of a new trigger (``schedule``: ``d.rec.spec()`` when the caller has it already)."""
        trigger = Trigger(id=tid, tenant_id=tenant_id, name=d.name, state=TriggerState.ACTIVE, current_version=1,
                          partition=part, created_us=now_us, updated_us=now_us, next_us=d.next_us)
        version = TriggerVersion(trigger_id=tid, version=1, tenant_id=tenant_id,
                                 schedule=d.rec.spec() if schedule is None else schedule,
                                 target_id=d.target_id, payload=seal_payload(self.store, tenant_id, tid, 1, d.payload),
                                 policies=d.policies, tzdata_version=TZDATA_VERSION, created_us=now_us)
        return trigger, version

    def create_checked(self, tenant_id: str, actor: str, d: Definition, *, now_us: int,
                       audited: Collection[str] = (), trigger_id: str | None = None,
                       partition: int | None = None) -> Current:
        """Write an already checked (or, for tools and tests, directly built) definition: the rows
        and audit row of :meth:`create` in ONE transaction, no check repeated (the caller vouches for
        the target and the schedule). ``audited``: the fields set by the client (a policy field
        among them writes the ``trigger.policy`` row). ``trigger_id`` / ``partition`` replace the new
        id and the partition hash (tests placing a trigger in a chosen partition); by default the
        partition is ``partition_of(id, store.timing.partition_count())``."""
        tid = trigger_id or new_id("tr")
        part = partition_of(tid, self.store.timing.partition_count()) if partition is None else partition
        trigger, version = self._rows(tenant_id, d, now_us, tid, part)
        audit = policy_audit(tenant_id, actor, trigger.id, None, d.policies, audited, now_us)
        self.store.registry.create_trigger(trigger, version, d.next_us, audit=audit)
        self._changed()
        return Current(trigger, version)

    def create_many(self, tenant_id: str, actor: str, defs: Iterable[Definition], *, now_us: int,
                    audited: Collection[str] = (), batch: int = BATCH) -> int:
        """:meth:`create_checked` for many definitions of one tenant, one transaction per ``batch``
        (each batch all or nothing; earlier batches stay). For bulk loading (benchmarks,
        falsification). Returns the number created."""
        partitions = self.store.timing.partition_count()
        count = 0
        items: list[tuple[Trigger, TriggerVersion, int | None]] = []
        audits: list[AuditNote] = []

        def flush() -> None:
            self.store.registry.create_triggers(items, audits)
            items.clear()
            audits.clear()

        specs: dict[int, tuple[Recurrence, dict[str, Any]]] = {}   # one normalised schedule per compiled one
        for d in defs:
            tid = new_id("tr")
            known = specs.get(id(d.rec))
            if known is None or known[0] is not d.rec:
                known = specs[id(d.rec)] = (d.rec, d.rec.spec())
            trigger, version = self._rows(tenant_id, d, now_us, tid, partition_of(tid, partitions), known[1])
            items.append((trigger, version, d.next_us))
            note = policy_audit(tenant_id, actor, trigger.id, None, d.policies, audited, now_us)
            if note is not None:
                audits.append(note)
            count += 1
            if len(items) >= batch:
                flush()
        if items:
            flush()
        if count:
            self._changed()
        return count

    # --- amend ---------------------------------------------------------------------------------

    def amend(self, tenant_id: str, actor: str, trigger_id: str, values: Mapping[str, Any], *,
              now_us: int) -> Current:
        """Amend the fields present in ``values`` (API names; any subset of the create fields) as a new
        version, its next instant recomputed at once (a new schedule: the first instant after
        ``now_us``; the same schedule: the pending instant is kept, decided under the new version).

        Refuses, writing nothing: ``NotFound``; ``Invalid`` when ``values`` is empty or a field is bad
        (a stored schedule that no longer compiles names ``schedule``); ``Conflict`` when the trigger's
        version moved meanwhile (compare-and-set). Writes in ONE transaction: the version, the
        trigger's current version and name, the due row, and — when a policy field is among
        ``values`` — the ``trigger.policy`` audit row with the prior and new policy values. Returns
        the trigger as stored after the change."""
        found = self.current(tenant_id, trigger_id)
        trigger, old = found.trigger, found.version
        fields = set(values)
        if not fields:
            raise Invalid([("body", "names no field to change")])
        errors: checks.Errors = trigger_input_problems({f: values[f] for f in fields & {"schedule", "payload"}})
        name = checks.name(values["name"], errors) if "name" in fields else trigger.name
        rec = (checks.compile_schedule(values["schedule"], now_us, errors) if "schedule" in fields
               else checks.stored_recurrence(old, errors))
        target_id = old.target_id
        if "target_id" in fields:
            target_id = values["target_id"]
            checks.target_problem(self.store, tenant_id, target_id, now_us, errors)
        payload = checks.payload(values["payload"], errors) if "payload" in fields else old.payload
        policies = checks.policies({f: values[f] for f in fields if f in _POLICY_INPUTS},
                                   old.policies, errors)
        nxt: int | None = None
        if rec is not None:
            if "schedule" in fields:
                nxt = checks.next_instant(rec, now_us, errors)
            elif trigger.next_us is not None:
                # Same schedule: keep the pending instant (it may be due and not yet decided; recomputing
                # from now would silently drop it). The timing loop decides it under the new version.
                nxt = trigger.next_us
            else:
                nxt = next_us(rec, now_us)
        if errors or rec is None:
            raise Invalid(errors)
        new_v = trigger.current_version + 1
        version = TriggerVersion(trigger_id=trigger.id, version=new_v, tenant_id=trigger.tenant_id,
                                 schedule=rec.spec(), target_id=target_id,
                                 payload=seal_payload(self.store, trigger.tenant_id, trigger.id, new_v, payload)
                                 if "payload" in fields else payload,  # kept: sealed at an earlier version
                                 policies=policies, tzdata_version=TZDATA_VERSION, created_us=now_us)
        audit = policy_audit(tenant_id, actor, trigger.id, old.policies, policies, fields, now_us)
        if not self.store.registry.amend_trigger(trigger, version, name, nxt, now_us, audit=audit):
            raise Conflict(f"the trigger changed meanwhile (version {trigger.current_version} is no longer "
                           "current); read it again and retry")
        self._changed()
        return self.current(tenant_id, trigger.id)

    # --- lifecycle -----------------------------------------------------------------------------

    def pause(self, tenant_id: str, trigger_id: str, *, now_us: int, actor: str | None = None) -> Current:
        """Pause an active trigger: its due row removed, its resume point recorded (decision 0063)
        and, when ``actor`` is given, the ``trigger.pause`` audit row by ``actor`` (decision 0180),
        in one transaction. Refuses, writing nothing: ``NotFound``; ``Conflict`` when it is not
        active or changed meanwhile. Returns the trigger as stored after the pause."""
        found = self.current(tenant_id, trigger_id)
        if found.trigger.state != TriggerState.ACTIVE:
            raise Conflict(f"the trigger is {found.trigger.state.value}, not active")
        audit = None if actor is None else AuditNote(
            tenant_id, actor, "trigger.pause", now_us, {"trigger_id": trigger_id, "state": "active"},
            {"trigger_id": trigger_id, "state": "paused"})
        # Records the resume point: the pause instant, or just before an instant still undecided (0063).
        if self.store.registry.pause_trigger(found.trigger, now_us, audit=audit) is None:
            raise Conflict("the trigger changed meanwhile; read it again and retry")
        self._changed()
        return self.current(tenant_id, trigger_id)

    def resume(self, tenant_id: str, trigger_id: str, *, now_us: int, actor: str | None = None) -> Current:
        """Resume a paused trigger: the due row restarts at the first instant of the current version
        after the resume point, so the timing plane decides the paused gap by the missed-fire policy
        and horizon (decision 0063); a trigger paused before resume points were recorded restarts
        after ``now_us``. One transaction (compare-and-set on state, version and resume point) with,
        when ``actor`` is given, the ``trigger.resume`` audit row by ``actor`` (decision 0180).
        Refuses, writing nothing: ``NotFound``; ``Conflict`` when not paused, changed meanwhile, or
        its stored schedule no longer compiles. Returns the trigger as stored after the resume."""
        found = self.current(tenant_id, trigger_id)
        if found.trigger.state != TriggerState.PAUSED:
            raise Conflict(f"the trigger is {found.trigger.state.value}, not paused")
        paused, point = self.store.registry.resume_point(tenant_id, trigger_id)
        if not paused:
            raise Conflict("the trigger changed meanwhile; read it again and retry")
        try:
            nxt = next_us(recurrence_of(found.version), now_us if point is None else point)
        except RecurrenceError as exc:
            raise Conflict(f"the trigger's schedule no longer compiles ({exc.field}: {exc.problem}); amend it "
                           "with a new schedule, then resume") from None
        audit = None if actor is None else AuditNote(
            tenant_id, actor, "trigger.resume", now_us, {"trigger_id": trigger_id, "state": "paused"},
            {"trigger_id": trigger_id, "state": "active"})
        if not self.store.registry.resume_trigger(found.trigger, point, nxt, now_us, audit=audit):
            raise Conflict("the trigger changed meanwhile; read it again and retry")
        self._changed()
        return self.current(tenant_id, trigger_id)

    def delete(self, tenant_id: str, trigger_id: str, *, now_us: int, attempts: int = 3) -> None:
        """Delete a trigger (state ``deleted``, due row removed; history kept), one transaction, no
        audit row. A compare-and-set lost to a concurrent change is retried up to ``attempts`` times.
        Refuses: ``NotFound``; ``Conflict`` when it kept changing."""
        for _ in range(attempts):
            found = self.current(tenant_id, trigger_id)
            if self.store.registry.set_trigger_state(found.trigger, TriggerState.DELETED, None, now_us):
                self._changed()
                return
        raise Conflict("the trigger kept changing; retry")

    # --- fires ---------------------------------------------------------------------------------

    def run(self, tenant_id: str, actor: str, trigger_id: str, *, now: Interval, decided_by: str) -> Fire:
        """Commit one ``manual`` fire of an active trigger now: its own key (``now.earliest_us`` — so
        dispatching at once can never precede its instant — with sequence 1, never a scheduled
        fire's), the on-time lane, ε and its source recorded, AND the ``trigger.run`` audit row by
        ``actor`` naming the key, in ONE transaction. Refuses, writing nothing: ``NotFound``;
        ``Conflict`` when not active or a manual fire of this instant exists. Returns the stored fire."""
        found = self.current(tenant_id, trigger_id)
        if found.trigger.state != TriggerState.ACTIVE:
            raise Conflict(f"the trigger is {found.trigger.state.value}, not active")
        at = now.earliest_us
        fire = NewFire(tenant_id=tenant_id, trigger_id=trigger_id, scheduled_us=at, seq=1,
                       version=found.trigger.current_version, kind=FireKind.MANUAL, lane=Lane.ON_TIME,
                       state=FireState.PENDING, decided_us=at, tzdata_version=TZDATA_VERSION,
                       decided_by=decided_by, eps_us=now.eps_us, eps_source=now.source)
        key = FireKey(tenant_id, trigger_id, at, 1)
        audit = AuditNote(tenant_id, actor, "trigger.run", at, None, {"trigger_id": trigger_id, "fire_key": str(key)})
        if not self.store.timing.insert_fires([fire], audit=audit):
            raise Conflict("a manual fire was already recorded for this instant; retry")
        self._changed()
        stored = self.store.history.get_fire(key)
        if stored is None:   # committed above: only a purge racing this very call could remove it
            raise NotFound("fire")
        return stored

    def backfill(self, found: Current, from_us: int, to_us: int, *, now: Interval, actor: str, decided_by: str,
                 dry_run: bool = False, skip_delivered: bool = False, max_fires: int = DEFAULT_MAX,
                 on_instants: Callable[[int], None] | None = None,
                 on_commit: Callable[[int, int], None] | None = None) -> BackfillResult:
        """Backfill ``found`` (from :meth:`current` or :meth:`current_any`) over ``[from_us, to_us)``
        by the rules of :mod:`fireledger.backfill`: the fires and the ``trigger.backfill`` audit row
        in ONE transaction (``dry_run``: the same plan, nothing stored). ``now``: the clock reading
        (its earliest bound is "now"; ε recorded on every fire). Refuses, writing nothing:
        ``Conflict`` when the trigger is not active; ``Invalid`` naming ``from``/``to``/``schedule``
        for a bad or over-long window."""
        t = found.trigger
        if t.state != TriggerState.ACTIVE:
            raise Conflict(f"the trigger is {t.state.value}, not active; resume it before a backfill")
        try:
            res = run_backfill(self.store, t, found.version, from_us, to_us, now_us=now.earliest_us, actor=actor,
                               decided_by=decided_by, dry_run=dry_run, skip_delivered=skip_delivered,
                               max_fires=max_fires, on_instants=on_instants, on_commit=on_commit,
                               eps=(now.eps_us, now.source))
        except BackfillRefused as exc:
            raise Invalid(exc.errors) from None
        if not dry_run and res.created:
            self._changed()   # wake the embedded planes; the dispatcher also polls
        return res


def definition(schedule: dict[str, Any], target_id: str, *, now_us: int, name: str = "trigger",
               payload: bytes = b"{}", policies: Policies | None = None,
               anchor_us: int | None = None) -> Definition:
    """A :class:`Definition` built directly from a schedule object (an interval without an anchor is
    anchored at ``anchor_us``, default ``now_us``; its first instant is the first after ``now_us``),
    for tools and tests that write through :meth:`Registry.create_checked` /
    :meth:`Registry.create_many` without the API's checks. Raises ``RecurrenceError`` for a schedule
    that does not compile."""
    rec = compile_spec(schedule, default_anchor=from_us(now_us if anchor_us is None else anchor_us))
    return Definition(name, rec, target_id, payload, policies or Policies(), next_us(rec, now_us))


__all__ = ["BATCH", "Current", "Definition", "Registry", "definition", "policy_audit"]
