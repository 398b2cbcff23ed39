"""Backfill: fires for a declared past window of one trigger (seed ADR-15, ADR-09; DESIGN.md
invariants 8 and 13). Shared by the API (``POST /v1/triggers/{id}/backfill``, role ``backfill``) and
the operator command (``fireledger backfill``).

* **Instants.** The trigger's *current* version's recurrence instants in ``[from, to)``, computed by
  the timing loop's own compiler (``fireledger.definitions``). ``to`` must not be after now (the
  clock's *earliest* bound), so a backfill can never make a fire early; ``from`` < ``to``; ``from``
  not before 1970.
* **Bound.** At most ``FIRELEDGER_BACKFILL_MAX`` instants per operation (default 1000): a window
  holding more is refused whole, naming ``to`` — nothing is created. A window holding none is refused
  too (naming ``from``): it is almost always a mistaken window.
* **Identity.** Each fire's key is (tenant, trigger, original instant, sequence 2): never the
  scheduled or caught-up fire of that instant (sequence 0) nor a manual run (sequence 1), and the same
  for every backfill of that instant — so a repeated backfill creates nothing new (``ON CONFLICT DO
  NOTHING``) and reports those instants as already present (decision 0066).
* **Record.** Kind ``backfill``, lane ``backfill`` (drained there, paced per tenant at the catch-up
  fraction of its quota and shed first), ``decided_by`` ``control:<principal>`` (or ``operator``),
  the running tzdata version. All fires and the audit row (actor, window, counts) are committed in one
  transaction. ``dry_run`` computes the same plan and stores nothing.
* ``skip_delivered`` leaves out instants that already hold a *delivered* fire (of any sequence): the
  "re-run only what did not happen" backfill after an outage longer than the catch-up horizon.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fireledger.definitions import next_us, recurrence_of
from fireledger.domain.keys import FireKey
from fireledger.domain.model import FireKind, FireState, Lane, NewFire, Trigger, TriggerVersion
from fireledger.errors import FireledgerError
from fireledger.recurrence import TZDATA_VERSION, Recurrence, RecurrenceError, dst_label_us, format_instant
from fireledger.store import Store

#: The key sequence of backfill fires (0: scheduled / catch-up, 1: manual run).
BACKFILL_SEQ = 2
ENV_MAX = "FIRELEDGER_BACKFILL_MAX"
DEFAULT_MAX = 1000
#: The largest bound an operator may configure (one transaction holds every fire of a backfill).
HARD_MAX = 100_000
#: At most this many per-instant items are listed in a result (the counts are always complete).
ITEMS_LISTED = 1000


class BackfillRefused(FireledgerError, ValueError):
    """Bad input or a window the bound refuses: ``errors`` names each field; nothing was stored."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {p}" for f, p in errors))
        self.errors = errors


def max_fires_from_env(env: Mapping[str, str] | None = None) -> int:
    """``FIRELEDGER_BACKFILL_MAX`` (1-100000), default 1000; ``ValueError`` naming the variable."""
    from fireledger.settings import parse_backfill_max, process_env

    return parse_backfill_max(process_env() if env is None else env)


@dataclass(frozen=True, slots=True)
class BackfillItem:
    instant_us: int
    key: FireKey
    #: ``create`` (dry run) / ``created``, ``present`` (a backfill fire of this instant exists) or
    #: ``skipped-delivered`` (``skip_delivered`` and a delivered fire of this instant exists).
    outcome: str


@dataclass(frozen=True, slots=True)
class BackfillResult:
    tenant_id: str
    trigger_id: str
    version: int
    from_us: int
    to_us: int
    dry_run: bool
    instants: int
    created: int            # dry run: would be created
    already_present: int
    skipped_delivered: int
    max_fires: int
    items: tuple[BackfillItem, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "trigger_id": self.trigger_id, "version": self.version,
            "from": format_instant_us(self.from_us), "to": format_instant_us(self.to_us),
            "dry_run": self.dry_run, "kind": FireKind.BACKFILL.value, "lane": Lane.BACKFILL.value,
            "instants": self.instants, "created": self.created, "already_present": self.already_present,
            "skipped_delivered": self.skipped_delivered, "max_fires": self.max_fires,
            "items": [{"instant": format_instant_us(i.instant_us), "key": str(i.key), "outcome": i.outcome}
                      for i in self.items],
            "items_truncated": self.instants > len(self.items),
        }


def format_instant_us(us: int) -> str:
    from fireledger.domain.keys import from_us

    return format_instant(from_us(us))


def window_instants(rec: Recurrence, from_us: int, to_us: int, limit: int,
                    progress: Callable[[int], None] | None = None) -> list[int]:
    """The recurrence's instants in ``[from_us, to_us)``; :class:`BackfillRefused` (naming ``to``)
    as soon as there are more than ``limit``."""
    out: list[int] = []
    after = from_us - 1
    while True:
        try:
            nxt = next_us(rec, after)
        except RecurrenceError as exc:
            raise BackfillRefused([("schedule", exc.problem)]) from None
        except OverflowError:   # past the calendar's end: no further instant
            return out
        if nxt is None or nxt >= to_us:
            return out
        out.append(nxt)
        if len(out) > limit:
            raise BackfillRefused([("to", f"the window holds more than {limit} instants of the schedule, the "
                                          f"maximum per backfill ({ENV_MAX}); request a shorter window")])
        if progress is not None and len(out) % 500 == 0:
            progress(len(out))
        after = nxt


def check_window(from_us: int | None, to_us: int | None, now_us: int) -> list[tuple[str, str]]:
    """Problems of the window itself (``now_us``: the clock's earliest bound)."""
    errors: list[tuple[str, str]] = []
    if from_us is not None and from_us < 0:
        errors.append(("from", "must not be before 1970-01-01T00:00:00Z"))
    if from_us is not None and to_us is not None and to_us <= from_us:
        errors.append(("to", "must be later than `from`"))
    if to_us is not None and to_us > now_us:
        errors.append(("to", f"must not be after now ({format_instant_us(now_us)}): a backfill covers a "
                             "past window"))
    return errors


def run_backfill(store: Store, trigger: Trigger, version: TriggerVersion, from_us: int, to_us: int, *,
                 now_us: int, actor: str, decided_by: str, dry_run: bool = False, skip_delivered: bool = False,
                 max_fires: int = DEFAULT_MAX,
                 on_instants: Callable[[int], None] | None = None,
                 on_commit: Callable[[int, int], None] | None = None,
                 eps: tuple[int, str] | None = None) -> BackfillResult:
    """Plan (and unless ``dry_run``, commit and audit) a backfill of ``trigger`` over
    ``[from_us, to_us)``. ``now_us`` is the clock's earliest bound; ``version`` the current one.
    Raises :class:`BackfillRefused` for bad input (nothing stored)."""
    errors = check_window(from_us, to_us, now_us)
    if errors:
        raise BackfillRefused(errors)
    rec = recurrence_of(version)
    instants = window_instants(rec, from_us, to_us, max_fires, on_instants)
    if not instants:
        raise BackfillRefused([("from", "the window [from, to) holds no instant of the trigger's schedule")])
    present, delivered = store.registry.backfill_window(trigger.tenant_id, trigger.id, from_us, to_us, BACKFILL_SEQ)
    items: list[BackfillItem] = []
    fires: list[NewFire] = []
    skipped = 0
    for us in instants:
        key = FireKey(trigger.tenant_id, trigger.id, us, BACKFILL_SEQ)
        if us in present:
            outcome = "present"
        elif skip_delivered and us in delivered:
            outcome = "skipped-delivered"
            skipped += 1
        else:
            outcome = "create"
            fires.append(NewFire(tenant_id=trigger.tenant_id, trigger_id=trigger.id, scheduled_us=us,
                                 seq=BACKFILL_SEQ, version=version.version, kind=FireKind.BACKFILL,
                                 lane=Lane.BACKFILL, state=FireState.PENDING, decided_us=now_us,
                                 tzdata_version=TZDATA_VERSION, decided_by=decided_by,
                                 eps_us=None if eps is None else eps[0], eps_source=None if eps is None else eps[1],
                                 dst=dst_label_us(rec, us)))
        items.append(BackfillItem(us, key, outcome))
    already = sum(1 for us in instants if us in present)
    created = len(fires)
    if not dry_run:
        window = {"trigger_id": trigger.id, "version": version.version, "from": format_instant_us(from_us),
                  "to": format_instant_us(to_us)}
        inserted = store.registry.commit_backfill(
            fires, tenant_id=trigger.tenant_id, actor=actor, at_us=now_us,
            prior={"trigger_id": trigger.id, "backfill_fires_in_window": already},
            audit_new={**window, "instants": len(instants), "already_present": already,
                       "skipped_delivered": skipped, "skip_delivered": skip_delivered, "max_fires": max_fires},
            progress=on_commit)
        made = {f.scheduled_us for f in inserted}
        items = [BackfillItem(i.instant_us, i.key, "created" if i.instant_us in made else "present")
                 if i.outcome == "create" else i for i in items]
        already += created - len(inserted)   # decided by a concurrent backfill meanwhile
        created = len(inserted)
    return BackfillResult(tenant_id=trigger.tenant_id, trigger_id=trigger.id, version=version.version,
                          from_us=from_us, to_us=to_us, dry_run=dry_run, instants=len(instants), created=created,
                          already_present=already, skipped_delivered=skipped, max_fires=max_fires,
                          items=tuple(items[:ITEMS_LISTED]))


__all__ = ["BACKFILL_SEQ", "DEFAULT_MAX", "ENV_MAX", "HARD_MAX", "BackfillItem", "BackfillRefused",
           "BackfillResult", "check_window", "max_fires_from_env", "run_backfill", "window_instants"]
