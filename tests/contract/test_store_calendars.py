"""The registry area's exclusion calendars (decision 0156) and a fire's matched specs (0155), on both
engines: create (a name once per tenant), read, list by name, replace under compare-and-set, delete
refused while a live trigger's current version names the calendar — each write with its audit row in
the same transaction — the timing plane's batch read, and the ``specs`` a decided fire records,
through the batched commit and the row-by-row insert alike."""

from __future__ import annotations

import json

from fireledger.domain.calendar_records import CalendarRecord
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.registry import Registry
from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
XMAS = [{"date": "2026-12-25", "zone": "Europe/London", "label": "Christmas"}]


def _audit(store: Store, tenant_id: str) -> list[tuple[str, str, object, object]]:
    return [(r.action, r.actor, json.loads(r.prior) if r.prior else None, json.loads(r.new) if r.new else None)
            for r in store.trust.audit_rows(0, 1000, tenant_id) if r.action.startswith("calendar.")]


def test_calendars_are_created_read_listed_and_replaced_with_their_audit(store: Store) -> None:
    t, other = add_tenant(store), add_tenant(store, "other")
    reg = store.registry
    assert reg.create_calendar(CalendarRecord(t.id, "holidays", XMAS, 1, T0, T0), "pr-a")
    assert not reg.create_calendar(CalendarRecord(t.id, "holidays", [], 1, T0 + S, T0 + S), "pr-a")   # taken
    assert reg.create_calendar(CalendarRecord(t.id, "audit-days", [], 1, T0, T0), "pr-a")
    assert reg.create_calendar(CalendarRecord(other.id, "holidays", [], 1, T0, T0), "pr-b")   # per tenant
    got = reg.get_calendar(t.id, "holidays")
    assert got == CalendarRecord(t.id, "holidays", XMAS, 1, T0, T0)
    assert reg.get_calendar(other.id, "audit-days") is None
    assert [c.name for c in reg.list_calendars(t.id)] == ["audit-days", "holidays"]
    assert [c.name for c in reg.list_calendars(t.id, after="audit-days", limit=5)] == ["holidays"]
    assert [c.name for c in reg.list_calendars(t.id, limit=1)] == ["audit-days"]

    new = [*XMAS, {"cron": "* * 26 12 *"}]
    assert reg.replace_calendar(t.id, "holidays", new, "pr-a", T0 + 9 * S, expected_revision=7) is None  # CAS
    done = reg.replace_calendar(t.id, "holidays", new, "pr-a", T0 + 9 * S, expected_revision=1)
    assert done == CalendarRecord(t.id, "holidays", new, 2, T0, T0 + 9 * S)
    assert reg.get_calendar(t.id, "holidays") == done
    assert reg.replace_calendar(t.id, "absent", new, "pr-a", T0) is None
    assert reg.replace_calendar(other.id, "audit-days", new, "pr-b", T0) is None   # another tenant's: absent
    assert _audit(store, t.id) == [
        ("calendar.create", "pr-a", None, {"name": "holidays", "entries": XMAS}),
        ("calendar.create", "pr-a", None, {"name": "audit-days", "entries": []}),
        ("calendar.update", "pr-a", {"name": "holidays", "revision": 1, "entries": XMAS},
         {"name": "holidays", "revision": 2, "entries": new})]
    both = reg.calendars_of([(t.id, "holidays"), (other.id, "holidays"), (t.id, "absent"), (t.id, "holidays")])
    assert sorted(both) == sorted([(t.id, "holidays"), (other.id, "holidays")])
    assert both[(t.id, "holidays")].revision == 2 and reg.calendars_of([]) == {}


def test_a_calendar_named_by_a_live_trigger_is_not_deleted(store: Store) -> None:
    t = add_tenant(store)
    tg = add_target(store, t)
    reg = store.registry
    reg.create_calendar(CalendarRecord(t.id, "holidays", XMAS, 1, T0, T0), "pr-a")
    reg.create_calendar(CalendarRecord(t.id, "holi", [], 1, T0, T0), "pr-a")   # a prefix of the other's name
    a = add_trigger(store, t, tg, {"cron": "0 9 * * *", "calendars": ["holidays"]})[0]
    b = add_trigger(store, t, tg, {"specs": [{"every": "1h"}], "calendars": ["x", "holidays"]})[0]
    add_trigger(store, t, tg, {"every": "1h"})
    assert reg.triggers_using_calendar(t.id, "holidays") == sorted([a.id, b.id])
    assert reg.triggers_using_calendar(t.id, "holi") == []
    assert reg.delete_calendar(t.id, "holidays", "pr-a", T0 + S) == sorted([a.id, b.id])
    assert reg.get_calendar(t.id, "holidays") is not None
    Registry(store).delete(t.id, a.id, now_us=T0 + S)
    Registry(store).amend(t.id, "pr-a", b.id, {"schedule": {"every": "1h"}}, now_us=T0 + S)   # no longer names it
    assert reg.triggers_using_calendar(t.id, "holidays") == []
    assert reg.delete_calendar(t.id, "holidays", "pr-a", T0 + 2 * S) == []
    assert reg.get_calendar(t.id, "holidays") is None
    assert reg.delete_calendar(t.id, "holidays", "pr-a", T0 + 3 * S) is None
    assert _audit(store, t.id)[-1] == ("calendar.delete", "pr-a", {"name": "holidays", "revision": 1,
                                                                   "entries": XMAS}, None)


def _new(tenant_id: str, trigger_id: str, at: int, specs: str | None, state: FireState = FireState.PENDING,
         cause: str | None = None) -> NewFire:
    return NewFire(tenant_id, trigger_id, at, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, state, at, "2026a",
                   "node-a", cause, specs=specs)


def test_a_fire_records_the_specs_that_produced_it(store: Store) -> None:
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, v, first = add_trigger(store, t, tg, {"specs": [{"cron": "0 * * * *"}, {"every": "30m"}]})
    assert first is not None
    # The batched commit (apply_decisions) and the row-by-row insert both store it.
    d = Decision(Advance(trig.id, first, 1, first + 1800 * S, 1), (_new(t.id, trig.id, first, "0,1"),))
    outcome = store.timing.apply_decisions([d])
    assert outcome[0].advanced
    store.timing.insert_fires([_new(t.id, trig.id, first + 7 * S, None, FireState.SKIPPED, "skipped: x")])
    got = store.history.get_fire(FireKey(t.id, trig.id, first, 0))
    assert got is not None and got.specs == "0,1"
    none = store.history.get_fire(FireKey(t.id, trig.id, first + 7 * S, 0))
    assert none is not None and none.specs is None and none.state == FireState.SKIPPED
    page = store.history.history_fires(t.id, trigger_id=trig.id, from_us=None, to_us=None, states=None,
                                       after=None, limit=10, descending=False)
    assert [f.specs for f in page] == ["0,1", None]
    assert v.schedule["specs"][1]["every"] == "30m"
