"""Backfill (privileged, audited, bounded, idempotent) and the avoided-peak report of jitter smearing.

API tests run the real app over a real SQLite store with a fake clock (apikit); the store operations
run on real SQLite and real PostgreSQL; the end-to-end test runs ``fireledger serve`` and delivers
backfill fires to a real HTTP sink.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from apikit import T0, Api, assert_problem, us
from fireledger.backfill import BACKFILL_SEQ, max_fires_from_env
from fireledger.control.auth import hash_token
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import FireKind, FireState, Lane, NewFire, Policies
from fireledger.domain.smearing import is_popular
from fireledger.observe.smearing import smearing_report
from fireledger.security.auditlog import verify_chain
from fireledger.timing import TimingLoop
from storekit import add_target, add_tenant, add_trigger

S = 1_000_000
HOURLY = {"cron": "0 * * * *", "zone": "UTC"}
WINDOW = {"from": "2026-03-27T00:00:00Z", "to": "2026-03-27T06:00:00Z"}   # 6 hourly instants, before T0
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def api(tmp_path: Path) -> Any:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def backfill_fires(api: Api, tenant_id: str, trigger_id: str) -> list[Any]:
    return [f for f in api.store.history.history_fires(tenant_id, trigger_id=trigger_id, limit=10_000)
            if f.kind == "backfill"]


def audits(api: Api, tenant_id: str, action: str) -> list[Any]:
    return [r for r in api.store.trust.audit_rows(tenant_id=tenant_id) if r.action == action]


# --- the API ------------------------------------------------------------------------------------------


def test_backfill_commits_keyed_fires_in_the_backfill_lane_and_audits_them(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tr = s.trigger(s.target()["id"], HOURLY)
    before = api.changes
    r = s.post(f"/v1/triggers/{tr['id']}/backfill", json=WINDOW)
    assert r.status_code == 201, r.text
    out = r.json()
    want = [us(f"2026-03-27T0{h}:00:00Z") for h in range(6)]
    assert (out["instants"], out["created"], out["already_present"], out["dry_run"]) == (6, 6, 0, False)
    assert [us(i["instant"]) for i in out["items"]] == want
    assert all(i["outcome"] == "created" for i in out["items"])
    assert api.changes == before + 1   # the planes are woken
    # The ledger: one fire per instant, its original instant, sequence 2, kind and lane backfill.
    fires = backfill_fires(api, tenant_id, tr["id"])
    assert [f.scheduled_us for f in fires] == want
    assert {(f.seq, f.kind, f.lane, f.state, f.version) for f in fires} == {(BACKFILL_SEQ, "backfill", "backfill",
                                                                            "pending", 1)}
    principal = api.store.trust.principal_by_token_hash(hash_token(s.token))
    assert {f.decided_by for f in fires} == {f"control:{principal.id}"}
    assert all(f.tzdata_version for f in fires)
    assert [i["key"] for i in out["items"]] == [str(FireKey(tenant_id, tr["id"], u, 2)) for u in want]
    # History shows them with kind and lane backfill.
    hist = s.get(f"/v1/triggers/{tr['id']}/fires").json()["items"]
    assert [(h["scheduled_instant"], h["kind"], h["lane"]) for h in hist] == [
        (i["instant"], "backfill", "backfill") for i in out["items"]]
    # Only the backfill lane offers them to the dispatch plane.
    assert api.store.dispatch.claim_dispatch("on-time", T0, 100, "d", 30 * S) == []
    assert api.store.dispatch.claim_dispatch("catch-up", T0, 100, "d", 30 * S) == []
    assert len(api.store.dispatch.claim_dispatch("backfill", T0, 100, "d", 30 * S)) == 6
    # Audited with the actor, the window and the counts (never a payload).
    (row,) = audits(api, tenant_id, "trigger.backfill")
    new = json.loads(row.new)
    assert row.actor == principal.id
    assert (new["from"], new["to"], new["created"], new["already_present"], new["instants"]) == (
        WINDOW["from"], WINDOW["to"], 6, 0, 6)
    assert "SENTINEL" not in (row.new or "") + (row.prior or "")


def test_repeating_a_backfill_creates_nothing_twice_and_never_collides_with_scheduled_fires(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tr = s.trigger(s.target()["id"], HOURLY)
    # The scheduled fire of 03:00 exists (sequence 0, as the timing plane writes it) and was delivered.
    at3 = us("2026-03-27T03:00:00Z")
    api.store.timing.insert_fires([NewFire(tenant_id, tr["id"], at3, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                                    FireState.PENDING, at3, "2026a", "timing-1")])
    (job,) = api.store.dispatch.claim_dispatch("on-time", T0, 10, "d", 30 * S)
    api.store.dispatch.settle_attempts([Settlement(job, "delivered", 200, None, "delivered", None, None)], T0)
    first = s.post(f"/v1/triggers/{tr['id']}/backfill", json=WINDOW).json()
    assert first["created"] == 6   # the backfill of 03:00 is its own fire: sequence 2, not 0
    again = s.post(f"/v1/triggers/{tr['id']}/backfill", json=WINDOW)
    assert again.status_code == 201
    assert (again.json()["created"], again.json()["already_present"]) == (0, 6)
    assert {i["outcome"] for i in again.json()["items"]} == {"present"}
    wider = s.post(f"/v1/triggers/{tr['id']}/backfill", json={**WINDOW, "to": "2026-03-27T08:00:00Z"}).json()
    assert (wider["created"], wider["already_present"]) == (2, 6)
    fires = api.store.history.history_fires(tenant_id, trigger_id=tr["id"], limit=100)
    keys = [(f.scheduled_us, f.seq) for f in fires]
    assert len(keys) == len(set(keys)) == 9
    assert [f.seq for f in fires if f.scheduled_us == at3] == [0, 2]
    assert [json.loads(r.new)["created"] for r in audits(api, tenant_id, "trigger.backfill")] == [6, 0, 2]
    # skip_delivered leaves out the instant whose fire was delivered.
    later = {"from": "2026-03-27T02:00:00Z", "to": "2026-03-27T05:00:00Z", "skip_delivered": True}
    tr2 = s.trigger(s.target()["id"], HOURLY)
    api.store.timing.insert_fires([NewFire(tenant_id, tr2["id"], at3, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME,
                                    FireState.PENDING, at3, "2026a", "timing-1")])
    (job,) = api.store.dispatch.claim_dispatch("on-time", T0, 10, "d", 30 * S)
    api.store.dispatch.settle_attempts([Settlement(job, "delivered", 200, None, "delivered", None, None)], T0)
    out = s.post(f"/v1/triggers/{tr2['id']}/backfill", json=later).json()
    assert (out["instants"], out["created"], out["skipped_delivered"]) == (3, 2, 1)
    assert [i["outcome"] for i in out["items"]] == ["created", "skipped-delivered", "created"]


def test_dry_run_lists_the_plan_and_stores_nothing(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    tr = s.trigger(s.target()["id"], HOURLY)
    s.post(f"/v1/triggers/{tr['id']}/backfill", json={**WINDOW, "to": "2026-03-27T02:00:00Z"})
    snap = api.snapshot()
    n_audit = len(api.store.trust.audit_rows(tenant_id=tenant_id))
    r = s.post(f"/v1/triggers/{tr['id']}/backfill", json={**WINDOW, "dry_run": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["dry_run"], out["instants"], out["created"], out["already_present"]) == (True, 6, 4, 2)
    assert [i["outcome"] for i in out["items"]] == ["present", "present", "create", "create", "create", "create"]
    assert out["items"][2]["key"] == str(FireKey(tenant_id, tr["id"], us("2026-03-27T02:00:00Z"), 2))
    assert api.snapshot() == snap
    assert len(api.store.trust.audit_rows(tenant_id=tenant_id)) == n_audit


def test_an_author_without_the_backfill_role_is_refused_and_the_refusal_audited(api: Api) -> None:
    tenant_id, admin = api.tenant("acme")
    tr = admin.trigger(admin.target()["id"], HOURLY)
    made = admin.post("/v1/principals", json={"name": "author", "roles": ["author", "reader", "policy"]})
    assert made.status_code == 201, made.text
    author = type(admin)(api, made.json()["token"])
    snap = api.snapshot()
    for body in (WINDOW, {**WINDOW, "dry_run": True}):
        problem = assert_problem(author.post(f"/v1/triggers/{tr['id']}/backfill", json=body), 403)
        assert "'backfill'" in problem["detail"]
    assert api.snapshot() == snap
    denied = [json.loads(r.new) for r in audits(api, tenant_id, "denied")]
    assert [d["missing_role"] for d in denied] == ["backfill", "backfill"]
    assert all(d["request"] == f"POST /v1/triggers/{tr['id']}/backfill" for d in denied)
    # A principal holding only `backfill` may backfill (it is its own grant).
    only = admin.post("/v1/principals", json={"name": "ops", "roles": ["backfill"]}).json()["token"]
    assert type(admin)(api, only).post(f"/v1/triggers/{tr['id']}/backfill", json=WINDOW).status_code == 201


def test_bad_input_and_windows_over_the_bound_are_refused_naming_the_field(api: Api,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tenant_id, s = api.tenant("acme")
    tr = s.trigger(s.target()["id"], HOURLY)
    path = f"/v1/triggers/{tr['id']}/backfill"
    snap = api.snapshot()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"to": WINDOW["to"]}, "from"),
        ({"from": WINDOW["from"]}, "to"),
        ({**WINDOW, "from": "yesterday"}, "from"),
        ({**WINDOW, "to": "2026-03-27T06:00:00"}, "to"),                       # no offset
        ({**WINDOW, "to": WINDOW["from"]}, "to"),                               # empty window
        ({**WINDOW, "to": "2026-03-27T12:00:01Z"}, "to"),                       # after now (T0)
        ({**WINDOW, "dry_run": "yes"}, "dry_run"),
        ({**WINDOW, "dry_run": 1}, "dry_run"),
        ({**WINDOW, "count": 3}, "count"),
        ({"from": "2026-03-27T00:10:00Z", "to": "2026-03-27T00:50:00Z"}, "from"),   # holds no instant
        ({"from": "0001-01-01T00:00:00Z", "to": WINDOW["to"]}, "from"),         # before 1970
    ]
    for body, field in cases:
        assert_problem(s.post(path, json=body), 422, field)
    # The bound: FIRELEDGER_BACKFILL_MAX instants per operation, the whole request refused above it.
    monkeypatch.setenv("FIRELEDGER_BACKFILL_MAX", "5")
    problem = assert_problem(s.post(path, json=WINDOW), 422, "to")
    assert "more than 5 instants" in problem["detail"]
    assert_problem(s.post(path, json={**WINDOW, "dry_run": True}), 422, "to")
    assert api.snapshot() == snap
    assert s.post(path, json={**WINDOW, "to": "2026-03-27T05:00:00Z"}).status_code == 201   # exactly 5
    monkeypatch.delenv("FIRELEDGER_BACKFILL_MAX")
    # The default bound is 1000: 1001 hourly instants are refused, nothing stored.
    snap = api.snapshot()
    assert_problem(s.post(path, json={"from": "2026-02-01T00:00:00Z", "to": "2026-03-15T17:00:00Z"}), 422, "to")
    assert api.snapshot() == snap
    # Another tenant's trigger does not exist for it; a paused trigger is not backfilled.
    _, other = api.tenant("other")
    assert_problem(other.post(path, json=WINDOW), 404)
    assert_problem(s.post("/v1/triggers/tr_nope/backfill", json=WINDOW), 404)
    s.post(f"/v1/triggers/{tr['id']}/pause")
    assert_problem(s.post(path, json=WINDOW), 409)
    assert [r.action for r in audits(api, tenant_id, "trigger.backfill")] == ["trigger.backfill"]


def test_the_bound_setting_is_checked() -> None:
    assert max_fires_from_env({}) == 1000
    assert max_fires_from_env({"FIRELEDGER_BACKFILL_MAX": "20000"}) == 20_000
    for bad in ("0", "-1", "ten", "100001", "1.5"):
        with pytest.raises(ValueError, match="FIRELEDGER_BACKFILL_MAX"):
            max_fires_from_env({"FIRELEDGER_BACKFILL_MAX": bad})


# --- the store, on both engines -----------------------------------------------------------------------


def test_store_commits_backfill_fires_and_their_audit_in_one_transaction(store: Any) -> None:
    t = add_tenant(store)
    trig, _, _ = add_trigger(store, t, add_target(store, t), {"every": "60s"}, now_us=T0 - 3600 * S)
    fires = [NewFire(t.id, trig.id, T0 - k * 60 * S, 2, 1, FireKind.BACKFILL, Lane.BACKFILL, FireState.PENDING,
                     T0, "2026a", "operator") for k in range(1, 4)]
    progress: list[tuple[int, int]] = []
    got = store.registry.commit_backfill(fires, tenant_id=t.id, actor="operator", at_us=T0, prior=None,
                                audit_new={"trigger_id": trig.id}, progress=lambda d, n: progress.append((d, n)))
    assert len(got) == 3 and progress[-1] == (3, 3)
    extra = NewFire(t.id, trig.id, T0 - 600 * S, 2, 1, FireKind.BACKFILL, Lane.BACKFILL, FireState.PENDING, T0,
                    "2026a", "operator")
    again = store.registry.commit_backfill([*fires[:2], extra],
                                  tenant_id=t.id, actor="operator", at_us=T0, prior=None,
                                  audit_new={"trigger_id": trig.id})
    assert [f.scheduled_us for f in again] == [T0 - 600 * S]
    rows = [r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.backfill"]
    assert [(json.loads(r.new)["created"], json.loads(r.new)["already_present"]) for r in rows] == [(3, 0), (1, 2)]
    present, delivered = store.registry.backfill_window(t.id, trig.id, T0 - 3600 * S, T0, 2)
    assert present == {T0 - k * 60 * S for k in (1, 2, 3, 10)} and delivered == set()
    # A failure inside the transaction leaves neither fires nor the audit row.
    bad = [NewFire(t.id, trig.id, T0 - 7 * 60 * S, 2, 1, FireKind.BACKFILL, Lane.BACKFILL, FireState.PENDING,
                   T0, "2026a", "operator")]

    def boom(_d: int, _n: int) -> None:
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        store.registry.commit_backfill(bad, tenant_id=t.id, actor="operator", at_us=T0, prior=None, audit_new={},
                              progress=boom)
    assert store.registry.backfill_window(t.id, trig.id, T0 - 3600 * S, T0, 2)[0] == present
    assert len([r for r in store.trust.audit_rows(tenant_id=t.id) if r.action == "trigger.backfill"]) == 2
    assert verify_chain(store).ok


def test_store_smear_rows_page_the_tenants_on_time_scheduled_fires(store: Any) -> None:
    t = add_tenant(store)
    tg = add_target(store, t)
    trig, _, _ = add_trigger(store, t, tg, {"every": "60s"}, now_us=T0 - 3600 * S, policies=Policies(jitter_s=7))
    base = T0 - 1800 * S
    mk = lambda at, seq=0, kind=FireKind.SCHEDULED, lane=Lane.ON_TIME, state=FireState.PENDING: NewFire(  # noqa: E731
        t.id, trig.id, at, seq, 1, kind, lane, state, at, "2026a", "timing-1")
    store.timing.insert_fires([mk(base + k * S) for k in range(7)]
                       + [mk(base + 100 * S, kind=FireKind.CATCH_UP, lane=Lane.CATCH_UP),
                          mk(base + 101 * S, seq=2, kind=FireKind.BACKFILL, lane=Lane.BACKFILL),
                          mk(base + 102 * S, state=FireState.SKIPPED)])
    rows, after = [], None
    while True:
        page = store.history.smear_rows(t.id, base, base + 3600 * S, after=after, limit=3)
        rows += page
        if len(page) < 3:
            break
        after = (page[-1][2], page[-1][0], page[-1][3])
    assert [r[2] for r in rows] == [base + k * S for k in range(7)]
    assert store.registry.version_jitter_s(trig.id, 1) == 7 and store.registry.version_jitter_s(trig.id, 9) == 0
    other = add_tenant(store, "other")
    assert store.history.smear_rows(other.id, base, base + 3600 * S) == []


# --- the smearing report --------------------------------------------------------------------------------


def test_smearing_report_matches_what_the_planner_recorded(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    reader_token = s.post("/v1/principals", json={"name": "r", "roles": ["reader"]}).json()["token"]
    reader = type(s)(api, reader_token)
    target = s.target()["id"]
    minute = T0 + 60 * S            # a whole minute (T0 is 12:00:00)
    at = {"at": "2026-03-27T12:01:00Z"}
    smeared = [s.trigger(target, at)["id"] for _ in range(60)]        # jitter 10s by default
    opted = [s.trigger(target, at, jitter="0s")["id"] for _ in range(5)]
    api.clock.set(minute + 5_000)
    loop = TimingLoop(api.store, api.clock, "timing-1")
    assert len(loop.tick().inserted) == 65
    # What the planner recorded as each fire's dispatch not-before (nothing dispatched yet).
    fires = api.store.history.history_fires(tenant_id, limit=1000)
    recorded = Counter(f.next_attempt_us // S for f in fires)
    assert all(is_popular(f.scheduled_us) for f in fires)
    r = reader.get("/v1/reports/smearing", params={"from": "2026-03-27T12:00:00Z", "to": "2026-03-27T12:02:00Z"})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert (rep["fires"], rep["popular_fires"], rep["smeared_fires"], rep["opted_out_fires"]) == (65, 65, 60, 5)
    assert rep["peak_without_smearing"] == {"per_s": 65, "at": "2026-03-27T12:01:00Z"}
    # The report's smeared peak is the peak of the not-before instants the planner committed.
    assert rep["peak_with_smearing"]["per_s"] == max(recorded.values())
    assert rep["peak_with_smearing"]["per_s"] < 65 / 2
    assert rep["avoided_peak_per_s"] == 65 - rep["peak_with_smearing"]["per_s"]
    assert rep["avoided_ratio"] == round(rep["avoided_peak_per_s"] / 65, 4)
    assert rep["dispatched_fires"] == 0 and rep["peak_dispatched"] == {"per_s": 0, "at": None}
    # The opted-out triggers are not smeared: they all sit in the instant's own second.
    assert {f.next_attempt_us // S for f in fires if f.trigger_id in opted} == {minute // S}
    assert len(smeared) == 60
    # Per tenant: another tenant sees none of it; bad windows are refused naming the field.
    _, other = api.tenant("other")
    assert other.get("/v1/reports/smearing", params={"from": "2026-03-27T12:00:00Z"}).json()["fires"] == 0
    assert_problem(s.get("/v1/reports/smearing", params={"from": "noon"}), 422, "from")
    assert_problem(s.get("/v1/reports/smearing", params={"from": "2026-03-01T00:00:00Z"}), 422, "from")
    assert_problem(s.get("/v1/reports/smearing", params={"to": "0001-01-01T00:30:00Z"}), 422, "to")
    assert_problem(s.get("/v1/reports/smearing", params={"from": "2026-03-27T12:02:00Z",
                                                         "to": "2026-03-27T12:00:00Z"}), 422, "to")
    # The whole-store report and the Prometheus gauges (last 15 minutes) agree.
    whole = smearing_report(api.store, minute - 60 * S, minute + 60 * S)
    assert whole.as_json()["avoided_peak_per_s"] == rep["avoided_peak_per_s"]
    text = api.http.get("/metrics").text
    assert f"fireledger_smearing_avoided_peak_fires_per_second {float(rep['avoided_peak_per_s'])}" in text
    assert 'fireledger_smearing_peak_fires_per_second{schedule="unsmeared"} 65.0' in text


# --- the operator command --------------------------------------------------------------------------------


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from fireledger.cli import main

    monkeypatch.setattr("sys.argv", ["fireledger", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_operator_backfill_command(api: Api, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    tenant_id, s = api.tenant("acme")
    tr = s.trigger(s.target()["id"], {"cron": "*/5 * * * *", "zone": "UTC"})
    db = f"sqlite:///{api.store.engine.path}"
    args = ("backfill", tr["id"], "--db", db, "--from", "2026-03-01T00:00:00Z", "--to", "2026-03-05T00:00:00Z")
    code, out, err = run_main(monkeypatch, capsys, *args, "--dry-run", "--json", "--max", "2000")
    assert code == 0, err
    plan = json.loads(out)
    assert (plan["dry_run"], plan["instants"], plan["created"]) == (True, 1152, 1152)
    assert plan["items_truncated"] and len(plan["items"]) == 1000
    assert backfill_fires(api, tenant_id, tr["id"]) == []
    code, _, err = run_main(monkeypatch, capsys, *args)                    # over the default bound (1000)
    assert code == 2 and "--to: the window holds more than 1000 instants" in err
    code, out, err = run_main(monkeypatch, capsys, *args, "--max", "2000")   # progress display, then the table
    assert code == 0, err
    assert "created 1152" in out and "committing backfill fires" in out
    assert len(backfill_fires(api, tenant_id, tr["id"])) == 1152
    assert [r.actor for r in audits(api, tenant_id, "trigger.backfill")] == ["operator"]
    code, out, err = run_main(monkeypatch, capsys, *args, "--max", "2000", "--json")
    assert code == 0 and json.loads(out)["already_present"] == 1152
    for bad, msg in ((("--from", "soon"), "--from: must be an RFC 3339"), (("--max", "0"), "--max:"),
                     (("--to", "2099-01-01T00:00:00Z"), "--to: must not be after now")):
        code, _, err = run_main(monkeypatch, capsys, *args, *bad)
        assert code == 2 and msg in err, err
    code, _, err = run_main(monkeypatch, capsys, "backfill", "tr_nope", "--db", db, "--from", "2026-03-01T00:00:00Z",
                            "--to", "2026-03-02T00:00:00Z")
    assert code == 2 and "no trigger" in err
    # The smearing report over the whole store, as JSON.
    code, out, err = run_main(monkeypatch, capsys, "report", "smearing", "--db", db, "--from",
                              "2026-03-01T00:00:00Z", "--to", "2026-03-08T00:00:00Z", "--json")
    assert code == 0, err
    assert json.loads(out)["fires"] == 0   # backfill fires are not on-time scheduled fires


# --- end to end: real `fireledger serve`, a real sink ------------------------------------------------------


@pytest.mark.e2e
def test_backfill_fires_are_delivered_signed_with_their_original_instants(tmp_path: Path) -> None:
    from e2e import Api as HttpApi
    from e2e import Service, new_tenant, verify_target, wait_until
    from fireledger.recurrence import format_instant
    from sink import SinkServer

    sink = SinkServer()
    sink.start_in_thread()
    db = f"sqlite:///{tmp_path}/fl.db"
    svc = None
    try:
        _, token = new_tenant(db)
        svc = Service(db, tmp_path).start()
        http = HttpApi(svc.base, token)
        target = http.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hook"})
        sink.add_secret(target["secret"])
        verify_target(http, sink, target)
        tr = http.ok("POST", "/v1/triggers", {"name": "daily", "schedule": {"cron": "0 3 * * *", "zone": "UTC"},
                                              "target_id": target["id"], "payload": {"report": "daily"}})
        from datetime import UTC, datetime, timedelta

        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        window = {"from": format_instant(today - timedelta(days=5)), "to": format_instant(today)}
        expected = [format_instant(today - timedelta(days=d) + timedelta(hours=3)) for d in range(5, 0, -1)]
        plan = http.ok("POST", f"/v1/triggers/{tr['id']}/backfill", {**window, "dry_run": True}, 200)
        assert [i["instant"] for i in plan["items"]] == expected
        assert sink.records() == []
        done = http.ok("POST", f"/v1/triggers/{tr['id']}/backfill", window, 201)
        assert done["created"] == 5
        recs = wait_until(lambda: recs if len(recs := sink.records()) >= 5 else None, 30,
                          "5 backfill deliveries")
        assert sorted(r["scheduled_instant"] for r in recs) == expected
        assert all(r["signature_ok"] and r["kind"] == "backfill" and r["lane"] == "backfill" for r in recs), recs
        assert all(r["payload"] == {"report": "daily"} and r["fire_key"].endswith(".2") for r in recs)
        assert {r["fire_key_header"] for r in recs} == {i["key"] for i in done["items"]}

        def delivered() -> list[dict[str, Any]] | None:
            items = http.ok("GET", f"/v1/triggers/{tr['id']}/fires?state=delivered")["items"]
            return items if len(items) == 5 else None

        hist = wait_until(delivered, 15, "history to show 5 delivered backfill fires")
        assert {(h["kind"], h["lane"]) for h in hist} == {("backfill", "backfill")}
        # Drained in the backfill lane: paced at the tenant's 10 % of its 100 fires/s quota (no burst).
        starts = sorted(us(h["attempts"][0]["started_at"]) for h in hist)
        assert (starts[-1] - starts[0]) / S >= 4 / 10 * 0.9, starts
        # The repeat creates nothing and sends nothing more.
        assert http.ok("POST", f"/v1/triggers/{tr['id']}/backfill", window, 201)["created"] == 0
        assert len(sink.records()) == 5
    finally:
        if svc is not None:
            svc.stop()
        sink.stop()
