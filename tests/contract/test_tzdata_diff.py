"""Tzdata upgrades as an event (issue 18 item 8, decisions 0162-0163), on real SQLite and PostgreSQL.

The "other" zone rules are a tiny TZif tree built for the test (:func:`tzkit.other_rules`):
America/New_York's compiled file under the name Europe/London (so London's 09:00 lands at 14:00Z in
January instead of 09:00Z), with a ``tzdata.zi`` header naming version 2099z. The store methods behind the command —
``timing.latest_tzdata`` (the version on each trigger's latest decided instant) and
``timing.reresolve_due`` (the due row's compare-and-set with its audit row, in one transaction) —
and :func:`scan` / :func:`apply` over them: a trigger whose instants differ under the other rules is
listed, one whose stored next instant was resolved under other rules is listed as stale, intervals
are never listed, and ``apply`` moves the row and audits it once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fireledger.domain.model import Advance
from fireledger.domain.trust_records import AuditNote
from fireledger.recurrence import TZDATA_VERSION
from fireledger.registry import tzdata as tz
from storekit import T0, add_target, add_tenant, add_trigger
from tzkit import LONDON_9, decided_under_old_rules, other_rules
from tzkit import us as _us


def test_the_store_reads_the_latest_recorded_version_and_reresolves_with_its_audit(store: Any) -> None:
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, first = add_trigger(store, t, tg, LONDON_9)
    never, _, _ = add_trigger(store, t, tg, LONDON_9)
    decided_under_old_rules(store, trig, first, first + 29 * 3600 * 1_000_000)
    assert store.timing.latest_tzdata([(t.id, trig.id), (t.id, never.id)]) == {trig.id: "2019c"}
    assert store.timing.latest_tzdata([]) == {}

    stale = first + 29 * 3600 * 1_000_000
    right = first + 24 * 3600 * 1_000_000
    note = AuditNote(t.id, "operator", "trigger.tzdata_reresolve", T0, {"next": stale}, {"next": right})
    assert store.timing.reresolve_due(Advance(trig.id, stale, 1, right, 1), note)
    assert {r.trigger_id: r.next_us for r in store.timing.due_index()}[trig.id] == right
    # The same compare-and-set again finds the row moved: False, no second audit row.
    assert not store.timing.reresolve_due(Advance(trig.id, stale, 1, right, 1), note)
    audits = [a for a in store.trust.audit_rows(tenant_id=t.id) if a.action == "trigger.tzdata_reresolve"]
    assert len(audits) == 1


def test_scan_lists_differing_and_stale_triggers_and_apply_reresolves(store: Any, tmp_path: Path) -> None:
    rules = tz.load_rules(other_rules(tmp_path))
    assert rules.version == "2099z"
    t = add_tenant(store)
    tg = add_target(store, t)
    fresh, _, fresh_first = add_trigger(store, t, tg, LONDON_9)
    assert fresh_first == _us("2027-01-15T09:00:00Z")
    old, _, old_first = add_trigger(store, t, tg, LONDON_9)
    decided_under_old_rules(store, old, old_first, _us("2027-01-16T14:00:00Z"))   # 09:00 under NY rules
    add_trigger(store, t, tg, {"cron": "0 9 * * *", "zone": "America/New_York"})   # not in the other tree
    add_trigger(store, t, tg, {"every": "1h"})                                     # absolute: never moves

    stats = tz.ScanStats()
    found = {c.trigger_id: c for c in tz.scan(store, count=3, other=rules, stats=stats)}
    assert set(found) == {fresh.id, old.id}
    assert (stats.live, stats.unaffected) == (4, 1)
    f = found[fresh.id]
    assert (f.stale, f.differs, f.recorded_tzdata) == (False, True, None)
    assert f.running == (_us("2027-01-15T09:00:00Z"), _us("2027-01-16T09:00:00Z"), _us("2027-01-17T09:00:00Z"))
    assert f.other == (_us("2027-01-15T14:00:00Z"), _us("2027-01-16T14:00:00Z"), _us("2027-01-17T14:00:00Z"))
    o = found[old.id]
    assert (o.stale, o.differs, o.recorded_tzdata) == (True, True, "2019c")
    assert o.stored_next_us == _us("2027-01-16T14:00:00Z")
    assert o.running[0] == _us("2027-01-16T09:00:00Z")

    # Without other rules only the stale row is listed.
    assert [c.trigger_id for c in tz.scan(store, count=3)] == [old.id]

    assert tz.apply(store, o, actor="operator", now_us=T0, other=rules)
    assert not tz.apply(store, o, actor="operator", now_us=T0, other=rules)     # moved: left alone
    assert {r.trigger_id: r.next_us for r in store.timing.due_index()}[old.id] == _us("2027-01-16T09:00:00Z")
    assert list(tz.scan(store, count=3)) == []
    audit = [a for a in store.trust.audit_rows(tenant_id=t.id) if a.action == "trigger.tzdata_reresolve"]
    assert len(audit) == 1 and audit[0].actor == "operator"
    assert '"tzdata_version":"2019c"' in (audit[0].prior or "") and '"rules":"2099z"' in (audit[0].prior or "")
    assert f'"tzdata_version":"{TZDATA_VERSION}"' in (audit[0].new or "")
    assert '"next":"2027-01-16T09:00:00Z"' in (audit[0].new or "")


def test_load_rules_refuses_what_is_not_a_tree(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        tz.load_rules(tmp_path / "missing")
    rules = tz.load_rules(other_rules(tmp_path))
    from fireledger.recurrence import RecurrenceError
    with pytest.raises(RecurrenceError):
        rules.zone("Asia/Tokyo")
    with pytest.raises(RecurrenceError):
        rules.zone("../zoneinfo/Europe/London")
