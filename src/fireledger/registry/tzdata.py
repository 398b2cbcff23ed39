"""Tzdata upgrades as an event (issue 18 item 8, decisions 0162-0163): which live triggers' instants
change under other zone rules, and the re-resolution of their due rows, audited per trigger.

* **Running rules**: the pinned ``tzdata`` package this process runs (:data:`TZDATA_VERSION`), the
  only rules the timing plane decides with.
* **Other rules** (optional, :func:`load_rules`): a TZif tree — a directory of compiled zone files
  such as ``/usr/share/zoneinfo`` or an unpacked ``tzdata`` wheel's ``tzdata/zoneinfo`` — holding the
  rules to compare with (typically the previous release, the one the recorded fires name). Read
  with :meth:`zoneinfo.ZoneInfo.from_file`; the host's zone data is never used otherwise.

:func:`scan` walks every partition's triggers in one snapshot each (the shadow rebuilder's read) and,
for every active cron trigger with a due row, computes the next ``count`` instants after the point
its due row continues from (:func:`fireledger.timing.shadow.resume_anchor`) under the running rules,
and under the other rules when given. A trigger is listed (:class:`TzChange`) when its stored next
instant is not the running rules' first (``stale``: it was resolved under other rules) or when the
two rule sets give different instants (``differs``). Intervals and one-shots are absolute instants:
zone rules never move them (counted, never listed).

:func:`apply` re-resolves one listed trigger: its due row moves to the running rules' next instant
(compare-and-set on the row as read: a row decided, amended or paused meanwhile is left alone) and
one audit row ``trigger.tzdata_reresolve`` records the versions and instants before and after, in
the same transaction. The fires already decided keep the tzdata version they were decided under.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from fireledger.definitions import recurrence_for
from fireledger.domain.keys import from_us, to_us
from fireledger.domain.model import Advance
from fireledger.domain.timing_records import ShadowRow
from fireledger.domain.trust_records import AuditNote
from fireledger.recurrence import TZDATA_VERSION, CronRecurrence, RecurrenceError, format_instant, preview
from fireledger.store import Store
from fireledger.timing.shadow import resume_anchor

#: Instants compared per trigger by default, and at most.
DEFAULT_COUNT = 5
MAX_COUNT = 100
_VERSION = re.compile(r"#\s*version\s+(\S+)")


@dataclass(frozen=True, slots=True)
class Rules:
    """Zone rules read from a TZif tree (``zone(name)`` raises :class:`RecurrenceError` for a zone
    the tree lacks); ``version`` from its ``tzdata.zi`` header, or None when it has none."""

    path: str
    version: str | None
    zone: Callable[[str], ZoneInfo]


def load_rules(directory: str | Path) -> Rules:
    """The rules of the TZif tree at ``directory``. Raises ``ValueError`` naming the problem when it
    is not a directory."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"{directory}: not a directory of TZif zone files")
    version = None
    zi = root / "tzdata.zi"
    if zi.is_file():
        with zi.open(encoding="utf-8", errors="replace") as fh:
            m = _VERSION.match(fh.readline())
            version = m.group(1) if m else None
    cache: dict[str, ZoneInfo] = {}

    def zone(name: str) -> ZoneInfo:
        got = cache.get(name)
        if got is None:
            path = root.joinpath(*name.split("/"))
            if ".." in name.split("/") or not path.is_file():
                raise RecurrenceError("zone", f"{name!r} is not in {root}")
            with path.open("rb") as fh:
                got = cache[name] = ZoneInfo.from_file(fh, key=name)
        return got

    return Rules(str(root), version, zone)


@dataclass(frozen=True, slots=True)
class TzChange:
    """One live trigger whose instants depend on the rules (module docstring). Instants are µs."""

    tenant_id: str
    trigger_id: str
    version: int
    cron: str
    zone: str
    recorded_tzdata: str | None     # on its latest decided instant; None: never decided
    stored_next_us: int
    running: tuple[int, ...]        # under the running rules, from the due row's resume point
    other: tuple[int, ...] | None   # under the other rules (None: none given, or the zone is not there)

    @property
    def stale(self) -> bool:
        """The stored next instant is not the running rules' first: resolved under other rules."""
        return self.stored_next_us != (self.running[0] if self.running else None)

    @property
    def differs(self) -> bool:
        """The two rule sets give different instants."""
        return self.other is not None and self.other != self.running

    def as_json(self) -> dict[str, Any]:
        return {"tenant_id": self.tenant_id, "trigger_id": self.trigger_id, "version": self.version,
                "cron": self.cron, "zone": self.zone, "recorded_tzdata": self.recorded_tzdata,
                "stored_next": _iso(self.stored_next_us), "stale": self.stale, "differs": self.differs,
                "running": [_iso(u) for u in self.running],
                "other": None if self.other is None else [_iso(u) for u in self.other]}


@dataclass
class ScanStats:
    """What a scan looked at: partitions, live triggers, and those zone rules cannot move."""

    partitions: int = 0
    live: int = 0
    unaffected: int = 0       # intervals and one-shots
    uncompilable: int = 0     # a stored schedule that no longer compiles (the timing plane pauses those)


def _iso(us: int) -> str:
    return format_instant(from_us(us))


def instants(rec: CronRecurrence, after_us: int, count: int, zone: ZoneInfo | None = None) -> tuple[int, ...]:
    """The first ``count`` instants of ``rec`` strictly after ``after_us``, under ``zone``'s rules
    instead of the compiled zone's when given (same expression, same DST rules; pure)."""
    r = rec if zone is None else replace(rec, zone=zone)
    return tuple(to_us(o.instant) for o in preview(r, from_us(after_us).astimezone(UTC), count))


def _change(row: ShadowRow, count: int, other: Rules | None, recorded: dict[str, str],
            stats: ScanStats) -> TzChange | None:
    try:
        rec = recurrence_for(row.trigger_id, row.version, row.schedule)
    except RecurrenceError:
        stats.uncompilable += 1
        return None
    anchor = resume_anchor(row)
    if not isinstance(rec, CronRecurrence) or anchor is None or row.due_next_us is None:
        stats.unaffected += 1
        return None
    running = instants(rec, anchor, count)
    theirs = None
    if other is not None:
        try:
            theirs = instants(rec, anchor, count, other.zone(rec.zone_name))
        except RecurrenceError:
            theirs = None
    change = TzChange(row.tenant_id, row.trigger_id, row.version, rec.expression, rec.zone_name,
                      recorded.get(row.trigger_id), row.due_next_us, running, theirs)
    return change if change.stale or change.differs else None


def scan(store: Store, *, count: int = DEFAULT_COUNT, other: Rules | None = None,
         progress: Callable[[int, int], None] | None = None,
         stats: ScanStats | None = None) -> Iterator[TzChange]:
    """The live triggers whose instants change (module docstring), partition by partition; calls
    ``progress(done, total)`` after each partition. Reads only; ``stats`` (when given) is filled."""
    st = stats if stats is not None else ScanStats()
    n = store.timing.partition_count()
    for p in range(n):
        rows, _ = store.timing.shadow_snapshot(p)
        live = [r for r in rows if r.state == "active" and r.due_next_us is not None and r.due_version == r.version]
        st.partitions += 1
        st.live += len(live)
        recorded = store.timing.latest_tzdata([(r.tenant_id, r.trigger_id) for r in live]) if live else {}
        for r in live:
            change = _change(r, count, other, recorded, st)
            if change is not None:
                yield change
        if progress is not None:
            progress(p + 1, n)


def apply(store: Store, change: TzChange, *, actor: str, now_us: int, other: Rules | None = None) -> bool:
    """Re-resolve ``change``'s due row to the running rules' next instant and audit it (module
    docstring); False when the row moved meanwhile (nothing written)."""
    new_next = change.running[0] if change.running else None
    prior: dict[str, Any] = {"trigger_id": change.trigger_id, "next": _iso(change.stored_next_us),
             "tzdata_version": change.recorded_tzdata}
    if change.other is not None:
        prior["instants"] = [_iso(u) for u in change.other]
        prior["rules"] = other.version if other is not None else None
    new = {"trigger_id": change.trigger_id, "next": None if new_next is None else _iso(new_next),
           "tzdata_version": TZDATA_VERSION, "instants": [_iso(u) for u in change.running]}
    advance = Advance(change.trigger_id, change.stored_next_us, change.version, new_next, change.version)
    note = AuditNote(change.tenant_id, actor, "trigger.tzdata_reresolve", now_us, prior, new)
    return store.timing.reresolve_due(advance, note)


def now_us() -> int:
    """The wall clock in µs (the audit row's instant: an operator act, not a fire decision)."""
    return to_us(datetime.now(UTC))


__all__ = ["DEFAULT_COUNT", "MAX_COUNT", "Rules", "ScanStats", "TzChange", "apply", "instants", "load_rules",
           "now_us", "scan"]
