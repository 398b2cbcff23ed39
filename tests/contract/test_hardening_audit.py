"""Hardening, class "audit integrity" (issue 13, finding 8; decisions 0090 and 0091).

1. The chain is keyed: someone with database write access who edits a row and recomputes the chain
   with the unkeyed algorithm (as the code before 0011 did), head included, is caught and the first
   row that does not check is named — on SQLite and PostgreSQL, in the library and through the CLI.
   Rows written before the upgrade are sealed by one keyed row; what a *key holder* can still do is
   caught only against an earlier export (``verify --anchor``).
2. Refusals are a bounded write path: a flood of denied requests from one token (or with tokens that
   are not valid) writes a bounded number of audit rows whose counts add up to every refusal, while
   another principal's privileged act is recorded and the chain stays verifiable.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from apikit import Api, assert_problem
from e2e import cli
from fireledger.control.denials import PER_WINDOW
from fireledger.domain.trust_records import GENESIS_HASH, chain_hash
from fireledger.security.auditlog import check_anchor, read_anchor, verify_chain
from fireledger.store import Store
from storekit import T0

S = 1_000_000


def _as_attacker(store: Store, *statements: str, params: list[dict[str, Any]] | None = None) -> None:
    """SQL run by someone with full database rights (the append-only triggers disabled first)."""
    with store.engine.write() as c:
        if store.engine_name == "sqlite":
            for name in ("audit_no_update", "audit_no_delete", "audit_insert_at_head", "audit_head_advances",
                         "audit_head_no_delete"):
                c.execute(f"DROP TRIGGER IF EXISTS {name}")
        else:
            c.execute("ALTER TABLE audit DISABLE TRIGGER USER")
            c.execute("ALTER TABLE audit_head DISABLE TRIGGER USER")
        for i, sql in enumerate(statements):
            c.execute(sql, (params or [{}] * len(statements))[i])


def _q(store: Store, sql: str) -> str:
    """``:name`` placeholders in the engine's style."""
    import re

    return sql if store.engine_name == "sqlite" else re.sub(r":(\w+)", r"%(\1)s", sql)


def _fill(store: Store, n: int = 5) -> None:
    for i in range(1, n + 1):
        store.trust.append_audit("tn_a", f"pr_{i}", "trigger.policy", T0 + i, {"catchup_horizon": "1h"},
                           {"catchup_horizon": f"{i}h"})


def _rechain_unkeyed(store: Store, from_seq: int, *, edit_seq: int | None = None,
                     link: Any = chain_hash, upto: int | None = None) -> None:
    """The attack: optionally edit one row, then recompute every link from ``from_seq`` (to ``upto``,
    default the end) with ``link`` (default: the unkeyed SHA-256 of the pre-0011 code) and move the
    head to match."""
    rows = store.trust.audit_rows(0, 10_000)
    prev = GENESIS_HASH if from_seq == 1 else rows[from_seq - 2].hash
    updates: list[str] = []
    params: list[dict[str, Any]] = []
    for r in rows[from_seq - 1:upto]:
        actor = "pr_innocent" if r.seq == edit_seq else r.actor
        h = link(r.seq, r.tenant_id, actor, r.action, r.at_us, r.prior, r.new, prev)
        updates.append(_q(store, "UPDATE audit SET actor = :actor, prev_hash = :prev, hash = :hash WHERE seq = :seq"))
        params.append({"actor": actor, "prev": prev, "hash": h, "seq": r.seq})
        prev = h
    if upto is None:
        updates.append(_q(store, "UPDATE audit_head SET seq = :seq, hash = :hash WHERE id = 1"))
        params.append({"seq": rows[-1].seq, "hash": prev})
    _as_attacker(store, *updates, params=params)


def test_an_edit_rechained_with_the_unkeyed_algorithm_and_a_new_head_is_caught(store):
    _fill(store)
    before = verify_chain(store)
    assert before.ok, before.line()
    # The whole chain recomputed the old (unkeyed) way around an edit of row 3, head included:
    _rechain_unkeyed(store, 1, edit_seq=3)
    assert [r.actor for r in store.trust.audit_rows()][2] == "pr_innocent"
    report = verify_chain(store)
    assert not report.ok and report.broken_seq == 1, report.line()
    assert report.problem.startswith("unkeyed") and "row 1" in report.line()


def test_a_tail_rechained_unkeyed_is_named_at_its_first_row(store):
    _fill(store, 6)
    _rechain_unkeyed(store, 4, edit_seq=5)   # rows 1-3 keep their keyed links
    report = verify_chain(store)
    assert not report.ok and report.broken_seq == 4, report.line()
    assert report.problem.startswith("unkeyed: row 4")


def test_a_key_holder_can_rewrite_consistently_and_only_an_earlier_export_shows_it(store):
    """The documented limit (decision 0090): with the audit key, a rewrite verifies; an anchor taken
    before it (an export, or `audit head` lines shipped elsewhere) does not match any more."""
    import hashlib
    import hmac as _hmac

    _fill(store, 4)
    anchor = read_anchor(json.dumps({"seq": r.seq, "hash": r.hash}) for r in store.trust.audit_rows())
    assert check_anchor(store, anchor) is None
    key = store.trust.audit_key

    def keyed(*content: Any) -> str:
        material = json.dumps(list(content), separators=(",", ":"), ensure_ascii=False).encode()
        return _hmac.new(key, material, hashlib.sha256).hexdigest()

    _rechain_unkeyed(store, 2, edit_seq=2, link=keyed)
    assert verify_chain(store).ok                      # the key alone cannot reveal this rewrite
    found = check_anchor(store, anchor)
    assert found is not None and not found.ok and found.broken_seq == 2, found
    assert found.problem.startswith("anchored")


def _legacy_store(kind: str, tmp_path: Path, pg_server: Any, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A store migrated only up to 0010, holding three rows written the pre-0011 (unkeyed) way."""
    import fireledger.store.root as store_root
    from fireledger.store.engine import engine_for_url, migration_files

    url = f"sqlite:///{tmp_path}/store.db" if kind == "sqlite" else pg_server.new_database()
    with monkeypatch.context() as m:
        m.setattr(store_root, "migration_files", lambda engine: [f for f in migration_files(engine) if f[0] < 11])
        old = Store(engine_for_url(url))
        old.migrate()
    prev = GENESIS_HASH
    for seq in (1, 2, 3):
        content = (seq, "tn_a", f"pr_{seq}", "tenant.create", T0 + seq, None, f'{{"n":{seq}}}')
        h = chain_hash(*content, prev)
        with old.engine.write() as c:
            c.execute(_q(old, "INSERT INTO audit (seq, tenant_id, actor, action, at_us, prior, new, prev_hash, hash) "
                              "VALUES (:seq, :t, :a, :act, :at, :p, :n, :prev, :h)"),
                      {"seq": seq, "t": content[1], "a": content[2], "act": content[3], "at": content[4],
                       "p": None, "n": content[6], "prev": prev, "h": h})
            c.execute(_q(old, "UPDATE audit_head SET seq = :seq, hash = :h WHERE id = 1"), {"seq": seq, "h": h})
        prev = h
    return old


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_unkeyed_rows_of_an_upgraded_database_are_sealed_and_stay_checked(kind, tmp_path, monkeypatch, request):
    pg = request.getfixturevalue("pg_server") if kind == "postgres" else None
    monkeypatch.delenv("FIRELEDGER_KEK", raising=False)
    monkeypatch.setenv("FIRELEDGER_KEK_FILE", str(tmp_path / "absent-kek.key"))
    store = _legacy_store(kind, tmp_path, pg, monkeypatch)
    try:
        # Without the KEK the upgrade refuses, names why, creates no key and changes nothing.
        with pytest.raises(Exception, match="migration 0011 seals the 3 existing audit rows"):
            store.migrate(now_us=T0 + 10)
        assert not (tmp_path / "absent-kek.key").exists() and 11 not in store.applied_migrations()
        assert [r.seq for r in store.trust.audit_rows()] == [1, 2, 3] and store.trust.audit_head()[0] == 3
        monkeypatch.setenv("FIRELEDGER_KEK", base64.b64encode(bytes(range(100, 132))).decode())
        assert 11 in store.migrate(now_us=T0 + 10)        # the upgrade seals the unkeyed rows
        rows = store.trust.audit_rows()
        assert [r.action for r in rows] == ["tenant.create"] * 3 + ["audit.seal"]
        seal = rows[3].as_json()
        assert seal["new"] == {"sealed_rows": 3, "sealed_hash": rows[2].hash, "scheme": "hmac-sha256"}
        assert seal["prev_hash"] == rows[2].hash and seal["actor"] == "system:upgrade"
        store.trust.append_audit("tn_a", "pr_9", "principal.create", T0 + 20, None, {"id": "pr_9"})
        report = verify_chain(store)
        assert report.ok and report.sealed_rows == 3 and report.rows == 5, report.line()
        assert "rows 1–3 unkeyed" in report.line()

        # An unkeyed row edited alone: named. The unkeyed rows rewritten consistently: the seal names it.
        _as_attacker(store, "UPDATE audit SET actor = 'mallory' WHERE seq = 2")
        r = verify_chain(store)
        assert not r.ok and r.broken_seq == 2 and r.problem.startswith("edited"), r.line()
        _rechain_unkeyed(store, 1, upto=3)
        r = verify_chain(store)   # rows 1-3 recomputed; the keyed seal still names the old head hash
        assert not r.ok and r.broken_seq == 4 and r.problem.startswith("unlinked"), r.line()
        _rechain_unkeyed(store, 1)   # everything recomputed the unkeyed way, seal included
        r = verify_chain(store)
        assert not r.ok and r.broken_seq == 1 and r.problem.startswith("unkeyed"), r.line()
    finally:
        store.close()


def test_the_append_only_triggers_are_kept_and_the_head_only_advances(store):
    _fill(store, 2)
    refused = ["UPDATE audit SET actor = 'x' WHERE seq = 1", "DELETE FROM audit WHERE seq = 2",
               "UPDATE audit_head SET seq = 1, hash = 'x' WHERE id = 1", "DELETE FROM audit_head",
               "INSERT INTO audit (seq, tenant_id, actor, action, at_us, prior, new, prev_hash, hash) "
               "VALUES (7, NULL, 'x', 'x', 0, NULL, NULL, 'x', 'x')"]
    for sql in refused:
        with pytest.raises(Exception, match=r"append-only|only advances|appended at the head"), \
                store.engine.write() as c:
            c.execute(sql)
    assert [r.seq for r in store.trust.audit_rows()] == [1, 2] and store.trust.audit_head()[0] == 2
    assert verify_chain(store).ok


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_cli_verify_export_and_anchor_on_both_engines(kind, tmp_path, request):
    from fireledger.domain.trust_records import AUDIT_KEY_LABEL
    from fireledger.security.derived import derive_from

    kek = bytes(range(7, 39))
    env = {"FIRELEDGER_KEK": base64.b64encode(kek).decode()}
    url = f"sqlite:///{tmp_path}/fl.db" if kind == "sqlite" else request.getfixturevalue("pg_server").new_database()
    store = Store.open(url, migrate=True)
    store.trust.set_audit_key(derive_from(kek, AUDIT_KEY_LABEL))
    try:
        _fill(store, 3)
        ok = cli("audit", "verify", "--db", url, env=env)
        assert ok.stdout.startswith("audit chain intact: 3 rows, keyed"), ok.stdout
        export = cli("audit", "export", "--db", url, env=env).stdout
        lines = [json.loads(x) for x in export.splitlines()]
        assert [x["seq"] for x in lines] == [1, 2, 3] and lines[2]["prev_hash"] == lines[1]["hash"]
        head = json.loads(cli("audit", "head", "--db", url, env=env).stdout)
        assert (head["seq"], head["hash"]) == (3, lines[2]["hash"]) and head["at"].endswith("Z")
        anchor = tmp_path / "anchor.jsonl"
        anchor.write_text(export)
        anchored = cli("audit", "verify", "--db", url, "--anchor", str(anchor), env=env)
        assert "anchor of 3 rows matches" in anchored.stdout, anchored.stdout

        wrong = cli("audit", "verify", "--db", url, env={"FIRELEDGER_KEK": base64.b64encode(bytes(32)).decode()},
                    check=False)
        assert wrong.returncode == 1 and "not the deployment's" in wrong.stderr, wrong.stderr

        _rechain_unkeyed(store, 2, edit_seq=2)
        bad = cli("audit", "verify", "--db", url, env=env, check=False)
        assert bad.returncode == 1 and "row 2" in bad.stderr and "unkeyed" in bad.stderr, bad.stderr
        assert bad.stderr.count("\n") == 1

        anchor.write_text("{not json\n")
        usage = cli("audit", "verify", "--db", url, "--anchor", str(anchor), env=env, check=False)
        assert usage.returncode == 2 and "--anchor: line 1" in usage.stderr and "Traceback" not in usage.stderr
    finally:
        store.close()


# --- 2. the denial write path is bounded ---------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Any:
    a = Api(tmp_path)
    yield a
    a.close()


def _wait_flushed(api: Api, deadline_s: float = 15.0) -> None:
    """Poll (with a deadline) until the flusher thread has written every counted refusal (an app
    without a denial ledger writes each refusal at once)."""
    ledger = getattr(api.app.state, "denials", None)
    end = time.monotonic() + deadline_s
    while ledger is not None and ledger.pending():
        assert time.monotonic() < end, f"{ledger.pending()} refusals still unwritten"
        time.sleep(0.05)   # poll with a deadline


def _stop(api: Api) -> None:
    """What the process does at stop: write the counts of open windows."""
    ledger = getattr(api.app.state, "denials", None)
    if ledger is not None:
        ledger.close()


def _denied(api: Api, actor: str) -> list[dict[str, Any]]:
    return [r.as_json() for r in api.store.trust.audit_rows(0, 100_000) if r.action == "denied" and r.actor == actor]


def test_a_thousand_refusals_write_a_bounded_number_of_rows_counting_every_one(api):
    tenant_id, admin = api.tenant("acme")
    made = admin.post("/v1/principals", json={"name": "reader", "roles": ["reader"]})
    assert made.status_code == 201, made.text
    reader_id, reader = made.json()["id"], type(admin)(api, made.json()["token"])
    rows_before = api.store.trust.audit_head()[0]
    granted = None
    for i in range(1000):
        path = "/v1/triggers" if i % 2 else f"/v1/triggers/tr_{i}/pause"   # two routes, one missing role
        assert reader.post(path, json={}).status_code == 403
        if i == 500:   # another principal's privileged act, in the middle of the flood
            granted = admin.post("/v1/principals", json={"name": "ops", "roles": ["backfill"]})
            assert granted.status_code == 201, granted.text
    api.clock.advance(61 * S)            # the window ends; the flusher writes the summary
    _wait_flushed(api)

    rows = _denied(api, reader_id)
    assert len(rows) <= PER_WINDOW + 1, len(rows)
    assert sum(r["new"]["count"] for r in rows) == 1000
    [summary] = [r for r in rows if r["new"].get("summary")]
    assert summary["new"]["by_request"] == {"POST /v1/triggers": 500 - PER_WINDOW // 2,
                                            "POST /v1/triggers/{trigger_id}/pause": 500 - PER_WINDOW // 2}
    assert api.store.trust.audit_head()[0] - rows_before <= PER_WINDOW + 2   # + the grant
    assert granted is not None
    [grant] = [r for r in api.store.trust.audit_rows(rows_before, 1000, tenant_id) if r.action == "principal.create"]
    assert json.loads(grant.new)["principal_id"] == granted.json()["id"]
    assert verify_chain(api.store).ok


def test_refusals_of_a_new_window_are_written_again_and_pending_counts_are_written_at_stop(api):
    tenant_id, admin = api.tenant("acme")
    made = admin.post("/v1/principals", json={"name": "reader", "roles": ["reader"]}).json()
    reader = type(admin)(api, made["token"])
    for _ in range(PER_WINDOW + 5):
        assert reader.delete("/v1/triggers/tr_x").status_code == 403
    api.clock.advance(61 * S)
    for _ in range(PER_WINDOW + 3):
        assert reader.delete("/v1/triggers/tr_x").status_code == 403
    _stop(api)                             # the process stops: the open window's count is written
    rows = _denied(api, made["id"])
    assert sum(r["new"]["count"] for r in rows) == 2 * PER_WINDOW + 8
    assert [r["new"]["count"] for r in rows if r["new"].get("summary")] == [5, 3]
    assert len(rows) == 2 * PER_WINDOW + 2
    assert verify_chain(api.store).ok


def test_requests_with_tokens_that_are_not_valid_are_counted_and_bounded(api):
    for i in range(1000):
        r = api.http.get(f"/v1/triggers/tr_{i}", headers={"Authorization": f"Bearer fl_guess{i}"})
        assert_problem(r, 401)
    _stop(api)
    rows = _denied(api, "anonymous")
    assert len(rows) <= PER_WINDOW + 1, len(rows)
    assert sum(r["new"]["count"] for r in rows) == 1000
    assert all(r["tenant_id"] is None for r in rows)
    first = rows[0]["new"]
    assert first["reason"] == "invalid-token" and first["request"] == "GET /v1/triggers/tr_0" and first["source"]
    assert not any("fl_guess" in json.dumps(r) for r in rows)   # the token itself is never audited
    assert verify_chain(api.store).ok


@pytest.mark.e2e
def test_serve_writes_the_counted_refusals_when_it_stops_and_the_chain_verifies(tmp_path):
    """A real `fireledger serve`: a flood of refusals is counted in memory; SIGTERM writes the
    counts before the process exits, and the CLI (same KEK) verifies the keyed chain."""
    from e2e import Api as HttpApi
    from e2e import Service

    db = f"sqlite:///{tmp_path}/fl.db"
    env: dict[str, str] = {}   # the run's state directory (conftest): serve and the CLI share its KEK
    svc = Service(db, tmp_path, env=env).start()
    try:
        made = json.loads(cli("tenant", "create", "acme", "--db", db, "--json", env=env).stdout)
        admin = HttpApi(svc.base, made["token"])
        reader = admin.ok("POST", "/v1/principals", {"name": "r", "roles": ["reader"]}, 201)
        for _ in range(3 * PER_WINDOW):
            assert HttpApi(svc.base, reader["token"]).call("POST", "/v1/triggers", {})[0] == 403
    finally:
        svc.stop()
    assert svc.proc is not None and svc.proc.returncode is not None
    rows = [json.loads(x) for x in cli("audit", "export", "--db", db, env=env).stdout.splitlines()]
    denied = [r for r in rows if r["action"] == "denied" and r["actor"] == reader["id"]]
    assert sum(r["new"]["count"] for r in denied) == 3 * PER_WINDOW and len(denied) == PER_WINDOW + 1
    ok = cli("audit", "verify", "--db", db, env=env)
    assert ok.stdout.startswith(f"audit chain intact: {len(rows)} rows, keyed"), ok.stdout
