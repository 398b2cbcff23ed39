"""The definitions service (issue 14, decision 0105): every act on a definition writes its change and
its audit row in ONE store transaction, on both engines.

Atomicity is proved by making the audit append fail inside the database — a trigger the test
installs on the ``audit`` table raises on every insert — and checking that the change did not happen
either (no trigger, no version, no due row, no fire, definitions counter unmoved, audit head unmoved).
Before the service, ``POST /v1/triggers`` committed the trigger and then appended its audit row in a
second transaction, and ``POST /v1/triggers/{id}/run`` likewise: the API tests at the end fail there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import Api
from fireledger.clock import Interval
from fireledger.domain.model import FireKind, Lane, MissedFirePolicy, OverlapPolicy, Policies, TriggerState
from fireledger.registry import Conflict, Invalid, LimitReached, NotFound, Registry, definition
from storekit import T0, add_target, add_tenant

S = 1_000_000
H = 3600 * S
REFUSED = "audit refused by the test"


def refuse_audit(store: Any) -> None:
    """Install a database trigger that makes every insert into ``audit`` fail."""
    with store.engine.write() as c:
        if store.engine_name == "sqlite":
            c.execute("CREATE TRIGGER test_refuse_audit BEFORE INSERT ON audit "
                      f"BEGIN SELECT RAISE(ABORT, '{REFUSED}'); END")
        else:
            c.execute("CREATE FUNCTION test_refuse_audit() RETURNS trigger LANGUAGE plpgsql AS "
                      f"$$ BEGIN RAISE EXCEPTION '{REFUSED}'; END $$")
            c.execute("CREATE TRIGGER test_refuse_audit BEFORE INSERT ON audit FOR EACH ROW "
                      "EXECUTE FUNCTION test_refuse_audit()")


def allow_audit(store: Any) -> None:
    with store.engine.write() as c:
        c.execute("DROP TRIGGER test_refuse_audit" if store.engine_name == "sqlite"
                  else "DROP TRIGGER test_refuse_audit ON audit")


def rows(store: Any, sql: str) -> list[tuple[Any, ...]]:
    with store.engine.read() as c:
        return sorted(tuple(r) for r in c.execute(sql).fetchall())


def state(store: Any) -> dict[str, Any]:
    """Everything an act on a definition may write."""
    return {t: rows(store, f"SELECT * FROM {t}") for t in ("triggers", "trigger_versions", "due", "fires")} | {
        "counter": store.registry.definitions_counter(), "audit_head": store.trust.audit_head()}


def clock_at(us: int) -> Interval:
    return Interval(us - 2000, us + 2000, "test")


def setup(store: Any) -> tuple[Any, Any, Registry]:
    t = add_tenant(store)
    return t, add_target(store, t), Registry(store)


CREATE = {"name": "nightly", "schedule": {"cron": "0 3 * * *", "zone": "Europe/Paris"},
          "payload": {"report": "daily"}, "missed_fire_policy": "skip", "catchup_horizon": "2h"}


# --- atomic: the change and its audit row, or neither ------------------------------------------


def test_create_and_its_audit_row_are_one_transaction(store: Any) -> None:
    t, tg, reg = setup(store)
    before = state(store)
    refuse_audit(store)
    with pytest.raises(Exception, match=REFUSED):
        reg.create(t.id, "pr_alice", {**CREATE, "target_id": tg.id}, now_us=T0)
    assert state(store) == before            # no trigger, version or due row without its audit row
    assert store.registry.list_triggers(t.id) == []
    allow_audit(store)
    made = reg.create(t.id, "pr_alice", {**CREATE, "target_id": tg.id}, now_us=T0)
    assert store.registry.get_trigger(t.id, made.trigger.id) is not None
    [row] = [r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.policy"]
    assert (row.actor, row.at_us, row.as_json()["prior"]) == ("pr_alice", T0, None)
    assert row.as_json()["new"] == {"trigger_id": made.trigger.id, "missed_fire_policy": "skip",
                                    "catchup_horizon": "2h", "overlap_policy": "allow", "outcome_window": "1h",
                                    "fields": ["catchup_horizon", "missed_fire_policy"]}


def test_create_many_and_its_audit_rows_are_one_transaction_per_batch(store: Any) -> None:
    t, tg, reg = setup(store)
    defs = [definition({"every": "60s"}, tg.id, now_us=T0, name=f"b{i}",
                       policies=Policies(missed_fire=MissedFirePolicy.SKIP)) for i in range(5)]
    before = state(store)
    refuse_audit(store)
    with pytest.raises(Exception, match=REFUSED):
        reg.create_many(t.id, "bench", defs, now_us=T0, audited={"missed_fire_policy"}, batch=10)
    assert state(store) == before
    allow_audit(store)
    assert reg.create_many(t.id, "bench", defs, now_us=T0, audited={"missed_fire_policy"}, batch=2) == 5
    assert len(store.registry.list_triggers(t.id)) == 5 and len(store.timing.due_rows(2**62, 100)) == 5
    assert len([r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.policy"]) == 5
    # Without audited fields the bulk path writes the same rows and no audit row.
    assert reg.create_many(t.id, "bench", defs[:2], now_us=T0) == 2
    assert len([r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.policy"]) == 5


def test_amend_of_a_policy_and_its_audit_row_are_one_transaction(store: Any) -> None:
    t, tg, reg = setup(store)
    made = reg.create(t.id, "pr_alice", {**CREATE, "target_id": tg.id}, now_us=T0, explicit={"name"})
    before = state(store)
    refuse_audit(store)
    with pytest.raises(Exception, match=REFUSED):
        reg.amend(t.id, "pr_bob", made.trigger.id, {"overlap_policy": "skip"}, now_us=T0 + S)
    assert state(store) == before            # still version 1, policies and due row unchanged
    allow_audit(store)
    done = reg.amend(t.id, "pr_bob", made.trigger.id, {"overlap_policy": "skip"}, now_us=T0 + S)
    assert (done.trigger.current_version, done.version.policies.overlap) == (2, OverlapPolicy.SKIP)
    assert done.trigger.next_us == made.trigger.next_us   # same schedule: the pending instant is kept
    [row] = [r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.policy"]
    assert row.actor == "pr_bob"
    assert row.as_json()["prior"]["overlap_policy"] == "allow"
    assert row.as_json()["new"]["overlap_policy"] == "skip" and row.as_json()["new"]["fields"] == ["overlap_policy"]


def test_amend_without_a_policy_field_writes_no_audit_row(store: Any) -> None:
    t, tg, reg = setup(store)
    made = reg.create(t.id, "pr_alice", {**CREATE, "target_id": tg.id}, now_us=T0, explicit={"name"})
    refuse_audit(store)   # no audit row is due, so the refusing trigger is never reached
    done = reg.amend(t.id, "pr_bob", made.trigger.id, {"name": "renamed", "schedule": {"every": "90s"}},
                     now_us=T0 + S)
    assert (done.trigger.name, done.trigger.current_version) == ("renamed", 2)
    assert done.trigger.next_us == T0 + S + 90 * S - (T0 + S) % S


def test_run_and_its_audit_row_are_one_transaction(store: Any) -> None:
    t, tg, reg = setup(store)
    made = reg.create(t.id, "pr_alice", {**CREATE, "target_id": tg.id}, now_us=T0, explicit=())
    before = state(store)
    refuse_audit(store)
    with pytest.raises(Exception, match=REFUSED):
        reg.run(t.id, "pr_alice", made.trigger.id, now=clock_at(T0 + H), decided_by="control:pr_alice")
    assert state(store) == before            # no manual fire without its audit row
    allow_audit(store)
    fire = reg.run(t.id, "pr_alice", made.trigger.id, now=clock_at(T0 + H), decided_by="control:pr_alice")
    assert (fire.kind, fire.lane, fire.seq, fire.scheduled_us) == (FireKind.MANUAL, Lane.ON_TIME, 1, T0 + H - 2000)
    [row] = [r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.run"]
    assert row.actor == "pr_alice" and row.as_json()["new"]["trigger_id"] == made.trigger.id
    # The same instant again: refused, and no second audit row.
    with pytest.raises(Conflict, match="already recorded"):
        reg.run(t.id, "pr_alice", made.trigger.id, now=clock_at(T0 + H), decided_by="control:pr_alice")
    assert len([r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.run"]) == 1


def test_backfill_and_its_audit_row_are_one_transaction(store: Any) -> None:
    t, tg, reg = setup(store)
    made = reg.create(t.id, "pr_alice", {"name": "n", "schedule": {"every": "60s"}, "target_id": tg.id},
                      now_us=T0 - H, explicit=())   # anchored an hour ago
    found = reg.current(t.id, made.trigger.id)
    before = state(store)
    refuse_audit(store)
    with pytest.raises(Exception, match=REFUSED):
        reg.backfill(found, T0 - H, T0 - H + 10 * 60 * S, now=clock_at(T0), actor="pr_alice", decided_by="x")
    assert state(store) == before
    allow_audit(store)
    res = reg.backfill(found, T0 - H, T0 - H + 10 * 60 * S, now=clock_at(T0), actor="pr_alice", decided_by="x")
    assert (res.instants, res.created) == (10, 10)
    assert len(rows(store, "SELECT * FROM fires WHERE kind = 'backfill'")) == 10
    assert [r.actor for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.backfill"] == ["pr_alice"]


# --- the other acts, and refusals that write nothing --------------------------------------------


def test_pause_resume_delete_change_state_with_no_audit_row(store: Any) -> None:
    t, tg, reg = setup(store)
    made = reg.create(t.id, "pr_alice", {"name": "n", "schedule": {"every": "60s"}, "target_id": tg.id},
                      now_us=T0, explicit=())
    tid = made.trigger.id
    audit_before = store.trust.audit_head()
    refuse_audit(store)   # none of these acts appends to the audit (as before the service)
    paused = reg.pause(t.id, tid, now_us=T0 + S)
    assert paused.trigger.state == TriggerState.PAUSED and paused.trigger.next_us is None
    with pytest.raises(Conflict, match="not active"):
        reg.pause(t.id, tid, now_us=T0 + 2 * S)
    resumed = reg.resume(t.id, tid, now_us=T0 + 5 * 60 * S)
    assert resumed.trigger.state == TriggerState.ACTIVE and resumed.trigger.next_us == made.trigger.next_us
    with pytest.raises(Conflict, match="not paused"):
        reg.resume(t.id, tid, now_us=T0 + 6 * 60 * S)
    reg.delete(t.id, tid, now_us=T0 + 7 * 60 * S)
    with pytest.raises(NotFound):
        reg.current(t.id, tid)
    assert rows(store, "SELECT * FROM due") == [] and store.trust.audit_head() == audit_before


def test_refusals_name_the_field_and_write_nothing(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    t, tg, reg = setup(store)
    other = add_tenant(store, "other")
    before = state(store)
    with pytest.raises(Invalid) as bad:
        reg.create(t.id, "a", {"name": " ", "schedule": {"cron": "61 * * * *"}, "target_id": tg.id,
                               "timeout": "0s"}, now_us=T0)
    assert {f for f, _ in bad.value.errors} == {"name", "schedule.cron", "timeout"}
    with pytest.raises(Invalid) as bad:   # another tenant's target reads as missing
        reg.create(other.id, "a", {"name": "n", "schedule": {"every": "60s"}, "target_id": tg.id}, now_us=T0)
    assert bad.value.errors == [("target_id", "no such target")]
    with pytest.raises(Invalid) as bad:
        reg.create(t.id, "a", {"name": "n", "schedule": {"every": "60s"}}, now_us=T0)
    assert bad.value.errors == [("target_id", "is required")]
    with pytest.raises(Invalid) as bad:
        reg.create(t.id, "a", {"name": "n", "schedule": {"at": "2020-01-01T00:00:00Z"}, "target_id": tg.id},
                   now_us=T0)
    assert bad.value.errors == [("schedule.at", "is in the past")]
    assert state(store) == before
    made = reg.create(t.id, "a", {"name": "n", "schedule": {"every": "60s"}, "target_id": tg.id}, now_us=T0)
    after_create = state(store)
    monkeypatch.setenv("FIRELEDGER_MAX_TRIGGERS_PER_TENANT", "1")
    with pytest.raises(LimitReached, match="limit is 1"):
        reg.create(t.id, "a", {"name": "n", "schedule": {"every": "60s"}, "target_id": tg.id}, now_us=T0)
    with pytest.raises(Invalid, match="names no field"):
        reg.amend(t.id, "a", made.trigger.id, {}, now_us=T0)
    with pytest.raises(NotFound):   # another tenant's trigger is absent
        reg.amend(other.id, "a", made.trigger.id, {"name": "x"}, now_us=T0)
    with pytest.raises(NotFound):
        reg.run(other.id, "a", made.trigger.id, now=clock_at(T0), decided_by="x")
    assert state(store) == after_create
    assert before["triggers"] == []


def test_a_test_placed_trigger_keeps_its_partition_and_id(store: Any) -> None:
    t, tg, reg = setup(store)
    d = definition({"every": "60s"}, tg.id, now_us=T0, payload=json.dumps({"k": 1}).encode())
    made = reg.create_checked(t.id, "test", d, now_us=T0, trigger_id="tr_fixed", partition=7)
    assert (made.trigger.id, made.trigger.partition) == ("tr_fixed", 7)
    assert store.timing.due_rows(2**62, 10)[0].partition == 7
    default = reg.create_checked(t.id, "test", d, now_us=T0)
    from fireledger.domain.partition import partition_of

    assert default.trigger.partition == partition_of(default.trigger.id, store.timing.partition_count())


# --- through the API (failed on the tree before the service: two transactions) ------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


def test_api_create_with_a_policy_field_leaves_nothing_when_its_audit_row_fails(api: Api) -> None:
    _, s = api.tenant("acme")
    target = s.target()
    before = api.snapshot()
    refuse_audit(api.store)
    r = s.post("/v1/triggers", json={"name": "n", "schedule": {"every": "60s"}, "target_id": target["id"],
                                     "missed_fire_policy": "skip"})
    assert r.status_code == 500, r.text
    assert api.snapshot() == before, "the trigger was stored without its audit row"
    assert s.get("/v1/triggers").json()["items"] == []


def test_api_run_leaves_no_fire_when_its_audit_row_fails(api: Api) -> None:
    _, s = api.tenant("acme")
    target = s.target()
    trig = s.trigger(target["id"], {"every": "60s"})
    before = api.snapshot()
    refuse_audit(api.store)
    r = s.post(f"/v1/triggers/{trig['id']}/run")
    assert r.status_code == 500, r.text
    assert api.snapshot() == before, "the manual fire was stored without its audit row"


def test_api_policy_change_leaves_the_version_when_its_audit_row_fails(api: Api) -> None:
    _, s = api.tenant("acme")
    target = s.target()
    trig = s.trigger(target["id"], {"every": "60s"})
    before = api.snapshot()
    refuse_audit(api.store)
    r = s.patch(f"/v1/triggers/{trig['id']}/policy", json={"overlap_policy": "skip"})
    assert r.status_code == 500, r.text
    assert api.snapshot() == before, "the new version was stored without its audit row"
    assert s.get(f"/v1/triggers/{trig['id']}").json()["version"] == 1
