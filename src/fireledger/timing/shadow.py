"""The shadow rebuilder, and the rebuild of the due index from the registry (seed ADR-11, invariant 10).

The due index holds one row per live trigger: its next instant not yet decided. It is derived data,
so it is recomputed rather than restored, and the recomputation runs *continuously*: every timing
node walks partitions on a rota (the stalest report first, claimed by compare-and-set so two nodes
never check the same partition at once), recomputes each trigger's row with the same compiler the
scan uses (:mod:`fireledger.definitions`) and compares it with the live index.

**What the row should be** (:func:`expected_next`): for an active trigger, the first instant of its
current version's recurrence strictly after its *anchor* — the latest of

* the last instant the ledger decided for it (``scheduled`` and ``catch-up`` fires, whatever their
  state: decided is decided; manual and backfill fires do not move the recurrence),
* when its current schedule took effect (the first version of the run of identical schedules that
  ends at the current version: an amendment that kept the schedule keeps the pending instant),
* when it was last resumed — or rather, since a resume restarts the row at the first instant after
  the pause's resume point (decision 0063), that point, unless the schedule changed after the resume.

Paused, deleted and exhausted triggers have no row. The trigger, its versions, its last fire and its
live row are read in one statement (one snapshot), so a decision committing meanwhile cannot make a
consistent index look divergent.

**Divergence** kinds: ``missing`` (a row should exist), ``orphaned`` (a row exists that should not,
or whose trigger does not exist), ``wrong_instant``, ``wrong_version``, ``wrong_partition`` (the
row is stored under another partition than its trigger). Each report goes to ``shadow_partitions`` /
``shadow_divergence`` (queryable: ``fireledger due-index report``), to the gauge
``fireledger_shadow_divergence{kind}`` and, when non-zero, to a warning log line (trigger ids and
instants only, never payloads). Triggers whose stored partition differs from the current count's
hash are counted as ``repartition_pending`` (not divergence: see ``fireledger partitions set``).

:func:`rebuild` replaces the index partition by partition with exactly the rows
:func:`expected_next` computes — the same function the shadow reports with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fireledger.clock import Clock
from fireledger.definitions import next_us, recurrence_for
from fireledger.domain.keys import from_us
from fireledger.domain.partition import partition_of
from fireledger.domain.timing_records import (
    DIVERGENCE_KINDS,
    Divergence,
    RebuildStats,
    ShadowReport,
    ShadowRow,
    StrayDue,
)
from fireledger.observe.metrics import METRICS
from fireledger.store import Store
from fireledger.waker import Waker

log = logging.getLogger("fireledger.timing.shadow")


def expected_next(row: ShadowRow) -> int | None:
    """The due row's instant the registry and the ledger imply for ``row`` (None: no row)."""
    anchor = resume_anchor(row)
    if anchor is None:
        return None
    rec = recurrence_for(row.trigger_id, row.version, row.schedule)
    return next_us(rec, anchor)


def resume_anchor(row: ShadowRow) -> int | None:
    """The instant ``row``'s due row continues from: its next instant is the first strictly after it
    (module docstring); None for a trigger that has no due row."""
    if row.state != "active":
        return None
    anchors = [a for a in (row.last_us, row.run_start_us, row.resumed_us) if a is not None]
    if (row.paused_us is not None and row.resumed_us is not None and row.paused_us <= row.resumed_us
            and (row.run_start_us is None or row.run_start_us <= row.resumed_us)):
        # The last resume restarted the row just after its pause's resume point (the paused gap is
        # decided by the missed-fire policy, decision 0063), also for a schedule amended while
        # paused; a schedule amended after the resume restarts from its amendment as usual.
        anchors = [a for a in (row.last_us, row.paused_us) if a is not None]
    return max(anchors) if anchors else None


def compare(partition: int, rows: list[ShadowRow], strays: list[StrayDue], n: int, *, node: str, now_us: int,
            duration_us: int = 0) -> ShadowReport:
    """Compare one partition's live rows with what :func:`expected_next` says (pure, given the rows)."""
    divs: list[Divergence] = []
    pending = 0
    live = 0
    for r in rows:
        if r.partition != partition_of(r.trigger_id, n):
            pending += 1
        want = expected_next(r)
        have = r.due_next_us
        if have is not None:
            live += 1

        def d(kind: str, r: ShadowRow = r, want: int | None = want) -> Divergence:
            return Divergence(partition, r.trigger_id, kind, r.due_next_us, r.due_version, want,
                              None if want is None else r.version, now_us, node)

        if want is None and have is None:
            continue
        if want is None:
            divs.append(d("orphaned"))
        elif have is None:
            divs.append(d("missing"))
        elif have != want:
            divs.append(d("wrong_instant"))
        elif r.due_version != r.version:
            divs.append(d("wrong_version"))
        elif r.due_partition != r.partition:
            divs.append(d("wrong_partition"))
    for s in strays:
        live += 1
        divs.append(Divergence(partition, s.trigger_id, "orphaned", s.next_us, s.version, None, None, now_us, node))
    counts = {k: sum(1 for x in divs if x.kind == k) for k in DIVERGENCE_KINDS}
    return ShadowReport(partition, node, now_us, len(rows), live, counts, pending, duration_us, tuple(divs))


@dataclass
class ShadowSettings:
    """``interval_s``: pause between two partition checks on one node (env
    ``FIRELEDGER_SHADOW_INTERVAL_S``; a full rota of n partitions over k nodes takes ≈ n·interval/k)."""

    interval_s: float = 1.0
    #: Share of one core the rebuilder may use: after a check taking d seconds it pauses at least
    #: d·(1 − budget)/budget (5 %: a 0.4 s check of a million triggers is followed by ≈ 7.6 s).
    budget: float = 0.05


class ShadowRebuilder:
    """Walks partitions on a rota and reports divergence (see the module docstring)."""

    def __init__(self, store: Store, clock: Clock, node_id: str, settings: ShadowSettings | None = None) -> None:
        self.store = store
        self.clock = clock
        self.node_id = node_id
        self.settings = settings or ShadowSettings()
        self.last: ShadowReport | None = None
        self._ensured_n: int | None = None

    def check(self, partition: int, n: int | None = None) -> ShadowReport:
        """Check one partition now and store its report (also used by tests and the CLI)."""
        st = self.store
        n = st.timing.partition_count() if n is None else n
        t0 = self.clock.monotonic()
        rows, strays = st.timing.shadow_snapshot(partition)
        now_us = self.clock.now().earliest_us
        report = compare(partition, rows, strays, n, node=self.node_id, now_us=now_us,
                         duration_us=int((self.clock.monotonic() - t0) * 1e6))
        st.timing.shadow_write(report)
        METRICS.shadow_checked.inc()
        if report.divergent:
            sample = "; ".join(
                f"{x.trigger_id} {x.kind} (live {_at(x.live_next_us)} v{x.live_version}, "
                f"expected {_at(x.expected_next_us)} v{x.expected_version})" for x in report.divergences[:3])
            log.warning("shadow rebuild: partition %d diverges from the registry in %d of %d rows: %s",
                        partition, report.divergent, report.triggers, sample)
        self.last = report
        return report

    def step(self) -> ShadowReport | None:
        """Claim the stalest partition and check it; None when another node took it first."""
        st = self.store
        n = st.timing.partition_count()
        if self._ensured_n != n:
            st.timing.ensure_partitions(n)
            self._ensured_n = n
        part = st.timing.shadow_claim(self.node_id, self.clock.now().earliest_us, n)
        if part is None:
            return None
        report = self.check(part, n)
        self.publish()
        return report

    def publish(self) -> None:
        """Set ``fireledger_shadow_divergence{kind}`` from the latest report of every partition."""
        totals = dict.fromkeys(DIVERGENCE_KINDS, 0)
        for r in self.store.timing.shadow_reports():
            for k in DIVERGENCE_KINDS:
                totals[k] += r.count(k)
        for k, v in totals.items():
            METRICS.shadow_divergence.labels(k).set(v)

    def pause_after(self, check_s: float) -> float:
        """The pause after a check that took ``check_s``: ``interval_s``, or longer when checks are
        expensive, so the rebuilder never takes more than ``budget`` of a core (a million triggers
        in a partition must not turn an idle timing process into a busy one)."""
        return max(self.settings.interval_s, check_s * (1 - self.settings.budget) / self.settings.budget)

    def run(self, stop: Waker) -> None:
        """Check one partition, pause (:meth:`pause_after`), repeat until ``stop`` is set (errors
        logged, retried)."""
        last_msg, last_at = "", -1e9
        while not stop.is_set():
            started = self.clock.monotonic()
            try:
                self.step()
                last_msg = ""
            except Exception as exc:
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                now = self.clock.monotonic()
                if msg != last_msg or now - last_at > 30:   # one line per distinct failure, 30 s apart
                    log.warning("shadow rebuild step failed: %s", msg)
                    last_msg, last_at = msg, now
            stop.wait(self.pause_after(self.clock.monotonic() - started))


def rebuild(store: Store, *, on_partition: Callable[[RebuildStats], None] = lambda s: None) -> list[RebuildStats]:
    """Replace the whole due index with the rows :func:`expected_next` computes, one transaction per
    partition (the index is never empty as a whole), then remove rows whose trigger does not exist.

    Covers every partition of the current count and any partition number a trigger is stored under
    (rows left behind by a count change)."""
    n = store.timing.partition_count()
    stats = []
    for p in _partitions(store, n):
        s = store.timing.rebuild_partition(p, expected_next)
        stats.append(s)
        on_partition(s)
    store.timing.delete_orphan_due()
    return stats


def rebuild_partitions(store: Store) -> list[int]:
    """The partitions :func:`rebuild` walks, in order."""
    return list(_partitions(store, store.timing.partition_count()))


@dataclass(frozen=True)
class Repartitioned:
    """What :func:`repartition` did: the count before and after, triggers walked and moved, and how
    many triggers are still stored under a partition number ≥ the new count (created meanwhile)."""

    previous: int
    partitions: int
    triggers: int
    moved: int
    stored_out_of_range: int


def repartition(store: Store, count: int, *, batch: int = 1000,
                on_start: Callable[[int, int], None] = lambda previous, total: None,
                on_batch: Callable[[int], None] = lambda walked: None) -> Repartitioned:
    """Change the partition count to ``count`` on a running cluster: record it (the lease and shadow
    tables follow), then rewrite every trigger's stored partition (and its due row) to
    :func:`~fireledger.domain.partition.partition_of` in transactions of ``batch`` triggers.

    Idempotent: running it again finishes an interrupted change. ``on_start(previous, total)`` is
    called once before the walk, ``on_batch(walked)`` after each transaction. The caller checks the
    bounds of ``count`` and ``batch``; store and database errors propagate."""
    old = store.timing.set_partition_count(count)
    on_start(old, store.timing.count_triggers())
    seen = moved = 0
    after = ""
    while True:
        after, k, m = store.timing.repartition_batch(after, batch, lambda tid: partition_of(tid, count))
        seen += k
        moved += m
        on_batch(k)
        if k < batch:
            break
    return Repartitioned(old, count, seen, moved, store.timing.count_out_of_range(count))


def _partitions(store: Store, n: int) -> Iterator[int]:
    yield from range(n)
    if store.timing.count_out_of_range(n):
        # Rare: a count change not yet applied left triggers under partition numbers ≥ n.
        yield from store.timing.out_of_range_partitions(n)


def _at(us: int | None) -> str:
    return "none" if us is None else from_us(us).isoformat().replace("+00:00", "Z")


__all__ = ["Repartitioned", "ShadowRebuilder", "ShadowSettings", "compare", "expected_next", "rebuild",
           "rebuild_partitions", "repartition", "resume_anchor"]
