"""Dry runs (issue 6, decision 0065): ``POST /v1/triggers/dry-run`` and
``POST /v1/triggers/{id}/policy/dry-run`` — the same checks and the same code as the real thing,
nothing stored.

* A create dry-run refuses exactly what create refuses, with the same problems; its instants are the
  created trigger's preview and what the timing loop then fires (smeared within the reported window).
* A policy dry-run on the last recorded gap predicts what the proposed policies record: proved by
  running the same gap under those policies on a copy of the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import SENTINEL, Api, Session, assert_problem, us
from fireledger.domain.policies import record_weight
from fireledger.store.sqlitelib import sqlite3
from fireledger.timing import TimingLoop
from test_api_bad_input import BAD_TRIGGER_FIELDS, _good

S = 1_000_000
M = 60 * S
H = 3600 * S


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


# --- POST /v1/triggers/dry-run ------------------------------------------------------------------


def test_a_create_dry_run_refuses_exactly_what_create_refuses_and_stores_nothing(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    before, changes = api.snapshot(), api.changes
    for over, field in BAD_TRIGGER_FIELDS:
        body = _good(tg["id"], **over)
        dry = s.post("/v1/triggers/dry-run", json=body)
        problem = assert_problem(dry, 422, field)
        assert SENTINEL not in dry.text
        real = s.post("/v1/triggers", json=body)
        assert real.status_code == 422 and real.json()["errors"] == problem["errors"], (field, real.text)
    for params, field in (({"count": 0}, "count"), ({"count": 1001}, "count"), ({"count": "x"}, "count"),
                          ({"cnt": 3}, "cnt")):
        assert_problem(s.post("/v1/triggers/dry-run", params=params, json=_good(tg["id"])), 422, field)
    # Only POST: other methods are 405, not a lookup of a trigger called "dry-run"; no token is 401.
    for method in ("GET", "PATCH", "DELETE"):
        r = s.request(method, "/v1/triggers/dry-run")
        assert_problem(r, 405)
        assert r.headers["allow"] == "POST"
    assert_problem(api.anon.post("/v1/triggers/dry-run", json=_good(tg["id"])), 401)
    assert api.snapshot() == before and api.changes == changes


def test_a_create_dry_run_needs_the_roles_create_needs(api: Api) -> None:
    _, owner = api.tenant("acme")
    tg = owner.target()
    reader = Session(api, owner.post("/v1/principals", json={"name": "r", "roles": ["reader"]}).json()["token"])
    author = Session(api, owner.post("/v1/principals", json={"name": "a", "roles": ["author"]}).json()["token"])
    body = _good(tg["id"])
    assert_problem(reader.post("/v1/triggers/dry-run", json=body), 403)
    assert author.post("/v1/triggers/dry-run", json=body).status_code == 200
    # Setting a policy field needs the policy role, as on create.
    assert_problem(author.post("/v1/triggers/dry-run", json={**body, "catchup_horizon": "2h"}), 403)


def test_dry_run_instants_are_the_preview_and_what_the_timing_loop_fires(api: Api) -> None:
    """02:30 in Paris: on Sunday 29 March 2026 that wall time does not exist (DST gap), so it fires at
    the jump (01:00Z). Every instant is a whole minute, so smearing applies within 10 s."""
    _, s = api.tenant("acme")
    tg = s.target()
    body = _good(tg["id"], schedule={"cron": "30 2 * * *", "zone": "Europe/Paris"})
    before = api.snapshot()
    r = s.post("/v1/triggers/dry-run", params={"count": 5}, json=body)
    assert r.status_code == 200, r.text
    dry = r.json()
    assert api.snapshot() == before and dry["stored"] is False
    assert [i["instant"] for i in dry["items"]] == ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z",
                                                    "2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z",
                                                    "2026-04-01T00:30:00Z"]
    assert [i["dst"] for i in dry["items"]][:2] == [None, "gap"]
    assert dry["next_instant"] == dry["items"][0]["instant"]
    d = dry["definition"]
    assert d["schedule"] == {"cron": "0 30 2 * * *", "zone": "Europe/Paris"} and d["jitter"] == "10s"
    assert d["missed_fire_policy"] == "fire-once-now" and d["payload_bytes"] > len(SENTINEL)
    assert "payload" not in d
    for i in dry["items"]:
        assert i["smeared"] and us(i["dispatch_window_end"]) == us(i["instant"]) + 10 * S
    # Create with the same body at the same instant: the preview is the dry run's instants.
    t = s.post("/v1/triggers", json=body).json()
    assert t["schedule"] == d["schedule"] and t["next_instant"] == dry["next_instant"]
    preview = s.get(f"/v1/triggers/{t['id']}/preview", params={"count": 5}).json()["items"]
    assert preview == [{k: i[k] for k in ("instant", "local", "dst", "specs", "excluded")} for i in dry["items"]]
    # And the timing loop fires exactly those instants, each dispatched inside the reported window.
    loop = TimingLoop(api.store, api.clock, "node-a")
    fired = []
    for i in dry["items"]:
        api.clock.set(us(i["instant"]))
        [f] = loop.tick().inserted
        fired.append(f.scheduled_us)
        assert us(i["instant"]) <= f.not_before_us < us(i["dispatch_window_end"])
    assert fired == [us(i["instant"]) for i in dry["items"]]


def test_an_interval_dry_run_returns_its_anchor_and_jitter_only_on_whole_minutes(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    api.clock.advance(7 * S + 250_000)
    dry = s.post("/v1/triggers/dry-run", params={"count": 3},
                 json=_good(tg["id"], schedule={"every": "90s"})).json()
    # Anchored at the dry run's instant, truncated to the second (as create does).
    assert dry["definition"]["schedule"] == {"every": "1m30s", "anchor": "2026-03-27T12:00:07Z", "zone": "UTC"}
    assert any("anchor" in n for n in dry["notes"])
    assert [i["instant"] for i in dry["items"]] == ["2026-03-27T12:01:37Z", "2026-03-27T12:03:07Z",
                                                    "2026-03-27T12:04:37Z"]
    assert [i["smeared"] for i in dry["items"]] == [False, False, False]
    # Created later with the returned (anchored) schedule, the instants are the same.
    api.clock.advance(30 * S)
    t = s.post("/v1/triggers", json=_good(tg["id"], schedule=dry["definition"]["schedule"], jitter="0s")).json()
    assert t["next_instant"] == "2026-03-27T12:01:37Z"
    no_jitter = s.post("/v1/triggers/dry-run", json=_good(tg["id"], schedule={"cron": "* * * * *", "zone": "UTC"},
                                                          jitter="0s")).json()
    assert not any(i["smeared"] or i["dispatch_window_end"] for i in no_jitter["items"])


# --- POST /v1/triggers/{id}/policy/dry-run ------------------------------------------------------


def ledger_counts(api: Api, tenant_id: str, trigger_id: str, decided_us: int) -> dict[str, int]:
    """One plan's instants by outcome, read from the ledger (a range record counts its range)."""
    out = {"dispatched": 0, "caught_up": 0, "on_time": 0, "skipped": 0, "expired": 0}
    for f in api.store.history.list_fires(tenant_id, trigger_id, limit=10_000):
        if f.decided_us != decided_us or f.kind not in ("scheduled", "catch-up"):
            continue
        n, _ = record_weight(f.cause)
        if f.state in ("skipped", "expired"):
            out[f.state] += n
        else:
            out["dispatched"] += n
            out["caught_up" if f.lane == "catch-up" else "on_time"] += n
    return out


def copy_of(api: Api, where: Path) -> Api:
    """A second harness over a copy of ``api``'s database (SQLite backup API), its clock in step."""
    where.mkdir()
    src = sqlite3.connect(api.store.engine.path)
    dst = sqlite3.connect(where / "api.db")
    src.backup(dst)
    src.close()
    dst.close()
    for kek in Path(api.store.engine.path).parent.glob("*kek*"):
        (where / kek.name).write_bytes(kek.read_bytes())
    other = Api(where)
    other.clock.set(api.clock.true_us)
    return other


def _subset(counts: dict[str, Any]) -> dict[str, int]:
    return {k: counts[k] for k in ("dispatched", "caught_up", "on_time", "skipped", "expired")}


def test_a_policy_dry_run_predicts_what_running_the_policy_records(api: Api, tmp_path: Path) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], {"every": "60s"}, missed_fire_policy="fire-once-now", jitter="0s")
    tid = t["id"]
    loop = TimingLoop(api.store, api.clock, "node-a")
    for _ in range(2):
        api.clock.advance(M)
        loop.tick()
    # Nothing missed yet: no gap, a clear answer, nothing stored.
    before = api.snapshot()
    none = s.post(f"/v1/triggers/{tid}/policy/dry-run", json={"missed_fire_policy": "fire-all"})
    assert none.status_code == 200, none.text
    assert none.json()["gap"] is None and none.json()["proposed"] is None and "no gap" in none.json()["message"]
    assert api.snapshot() == before
    # A three-hour pause, resumed: the gap is decided under fire-once-now. Copies are taken just
    # before that decision, to run the same gap under other policies for real.
    api.clock.advance(20 * S)
    s.post(f"/v1/triggers/{tid}/pause")
    api.clock.advance(3 * H)
    s.post(f"/v1/triggers/{tid}/resume")
    copies = [copy_of(api, tmp_path / f"copy-{i}") for i in range(3)]
    decided = loop.tick().earliest_us
    actual = ledger_counts(api, tenant_id, tid, decided)
    assert actual["expired"] == 120 and actual["skipped"] == 59
    proposals: list[dict[str, Any]] = [{"missed_fire_policy": "fire-all"},
                                       {"missed_fire_policy": "skip", "catchup_horizon": "2h"},
                                       {"catchup_horizon": "0s", "outcome_window": "2h"}]
    before = api.snapshot()
    answers = []
    for body in proposals:
        r = s.post(f"/v1/triggers/{tid}/policy/dry-run", json=body)
        assert r.status_code == 200, r.text
        answers.append(r.json())
    assert api.snapshot() == before
    for a in answers:
        assert a["stored"] is False and a["replay_matches_record"] is True
        assert a["gap"]["decided_at"] == _iso(decided) and a["gap"]["version"] == 1
        assert _subset(a["recorded"]["counts"]) == actual
        assert a["recorded"]["policies"] == {"missed_fire_policy": "fire-once-now", "catchup_horizon": "1h"}
        assert a["recorded"]["counts"]["instants"] == 180 and a["recorded"]["counts"]["lower_bound"] is False
    assert answers[0]["proposed"]["policies"] == {"missed_fire_policy": "fire-all", "catchup_horizon": "1h"}
    assert answers[1]["proposed"]["policies"] == {"missed_fire_policy": "skip", "catchup_horizon": "2h"}
    # Prove each prediction: change the policy on a copy and let its timing loop decide the same gap.
    for copy, body, a in zip(copies, proposals, answers, strict=True):
        try:
            owner = Session(copy, s.token)   # the copy holds the same principals
            r = owner.patch(f"/v1/triggers/{tid}/policy", json=body)
            assert r.status_code == 200, r.text
            got = TimingLoop(copy.store, copy.clock, "node-a").tick()
            assert got.earliest_us == decided
            assert ledger_counts(copy, tenant_id, tid, decided) == _subset(a["proposed"]["counts"]), body
        finally:
            copy.close()
    assert _subset(answers[0]["proposed"]["counts"]) != actual       # the prediction is not the record
    assert answers[0]["proposed"]["counts"]["caught_up"] == 59


def test_a_policy_dry_run_checks_its_body_role_and_tenant(api: Api) -> None:
    _, s = api.tenant("acme")
    _, other = api.tenant("rival")
    tg = s.target()
    t = s.trigger(tg["id"], {"every": "60s"})
    url = f"/v1/triggers/{t['id']}/policy/dry-run"
    before = api.snapshot()
    for body, field in (({"catchup_horizon": "25h"}, "catchup_horizon"),
                        ({"missed_fire_policy": "sometimes"}, "missed_fire_policy"),
                        ({"missed_fire_policy": None}, "missed_fire_policy"),
                        ({"jitter": "5s"}, "jitter"),
                        ({"outcome_window": "0s"}, "outcome_window")):
        assert_problem(s.post(url, json=body), 422, field)
    assert api.snapshot() == before
    assert_problem(other.post(url, json={}), 404)          # another tenant's trigger is simply absent
    author = Session(api, s.post("/v1/principals", json={"name": "a", "roles": ["author", "policy"]}
                                 ).json()["token"])
    reader = Session(api, s.post("/v1/principals", json={"name": "r", "roles": ["reader"]}).json()["token"])
    before = api.snapshot()
    assert_problem(author.post(url, json={}), 403)
    assert reader.post(url, json={"missed_fire_policy": "skip"}).status_code == 200
    assert api.snapshot() == before


def _iso(u: int) -> str:
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant

    return format_instant(from_us(u))
