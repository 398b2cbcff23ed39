"""The operator CLI as real processes: triggers, fires, why, status, and retention export/purge."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest

from e2e import cli
from fireledger.domain.dispatch_records import Settlement
from fireledger.domain.keys import FireKey
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
from fireledger.store import Store
from storekit import T0, add_target, add_tenant, add_trigger

S = 1_000_000
M = 60 * S
SECRET = "PAYLOAD-SENTINEL-7f3c"
WIDE = {"COLUMNS": "250"}   # Rich tables fold to the terminal width; a pipe has none


@pytest.fixture
def ledger(tmp_path: Path) -> dict[str, Any]:
    """One minutely trigger with six fires: 2 expired, 1 skipped, 2 delivered (one 90 s late), 1 failed."""
    db = f"sqlite:///{tmp_path}/ops.db"
    store = Store.open(db)
    t = add_tenant(store)
    trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"}, payload={"s": SECRET},
                                 partition=11)
    plan = [(FireState.EXPIRED, "expired: missed and older than the catch-up horizon (1h)"),
            (FireState.EXPIRED, "expired: missed and older than the catch-up horizon (1h)"),
            (FireState.SKIPPED, "skipped: missed; fire-once-now fires only the most recent missed instant"),
            (FireState.PENDING, None), (FireState.PENDING, None), (FireState.PENDING, None)]
    due = first
    for i, (state, cause) in enumerate(plan):
        lane = Lane.CATCH_UP if cause else Lane.ON_TIME
        f = NewFire(t.id, trig.id, first + i * M, 0, 1, FireKind.SCHEDULED, lane, state,
                    first + i * M + (60 * S if i == 4 else 2000), "2026f", "timing-x", cause=cause)
        assert store.timing.apply_decisions([Decision(Advance(trig.id, due, 1, due + M, 1), (f,))])[0].advanced
        due += M
    outcomes = [("delivered", 200, "delivered", None, 3 * M + 100_000),
                ("delivered", 200, "delivered", None, 4 * M + 90 * S),
                ("failed", 404, "failed", "failed: HTTP 404 is final", 5 * M + 200_000)]
    for result, status, state, cause, at in outcomes:
        (job,) = store.dispatch.claim_dispatch("on-time", first + at, 1, "dispatch-y", 30 * S)
        store.dispatch.settle_attempts([Settlement(job, result, status, None, state, cause, None)], first + at + 50_000)
    store.close()
    key = lambda i: str(FireKey(t.id, trig.id, first + i * M, 0))  # noqa: E731
    return {"db": db, "tenant": t.id, "trigger": trig.id, "first": first, "key": key, "tmp": tmp_path}


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str,
             out: bool = False) -> tuple[int, str]:
    """The CLI's own entry point in this process (cheap; the main flows run real processes):
    (exit code, stderr) — or stdout with ``out``, asserting success."""
    from fireledger.cli import main

    monkeypatch.setattr("sys.argv", ["fireledger", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    if out:
        assert code == 0, captured.err
        return code, captured.out
    return code, captured.err


def test_triggers_fires_and_why_tell_what_happened(ledger: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    db = ledger["db"]
    # As real processes: the listing, the history and the story.
    table = cli("triggers", "--db", db, "--tenant", ledger["tenant"], env=WIDE).stdout
    assert ledger["trigger"] in table and "2/6 delivered" in table
    fires = json.loads(cli("fires", ledger["trigger"], "--db", db, "--json").stdout)
    assert [f["state"] for f in fires] == ["failed", "delivered", "delivered", "skipped", "expired", "expired"]
    assert fires[2]["lateness_s"] == 0.1 and fires[1]["lateness_s"] == 90.0
    why = cli("why", ledger["key"](0), "--db", db, env=WIDE).stdout
    assert "not dispatched" in why and "catch-up horizon" in why and "timing-x" in why
    # The other forms in this process (the same entry point, cheaper).
    monkeypatch.setenv("COLUMNS", WIDE["COLUMNS"])
    rows = json.loads(run_main(monkeypatch, capsys, "triggers", "--db", db, "--json", out=True)[1])
    (row,) = [r for r in rows if r["id"] == ledger["trigger"]]
    assert row["tenant_id"] == ledger["tenant"] and row["partition"] == 11 and row["state"] == "active"
    assert row["recent"][:3] == ["failed", "delivered", "delivered"]
    only = json.loads(run_main(monkeypatch, capsys, "fires", ledger["trigger"], "--db", db, "--state", "expired",
                               "--json", out=True)[1])
    assert len(only) == 2
    assert "expired" in run_main(monkeypatch, capsys, "fires", ledger["trigger"], "--db", db, out=True)[1]
    late = json.loads(run_main(monkeypatch, capsys, "why", ledger["key"](4), "--db", db, "--json", out=True)[1])
    text = " ".join(line["text"] for line in late["story"])
    assert "decided it 60.00 s late" in text and "attempt 1 on node dispatch-y: delivered (HTTP 200)" in text
    failed = run_main(monkeypatch, capsys, "why", ledger["key"](5), "--db", db, out=True)[1]
    assert "HTTP 404 is final" in failed and "final (non-retryable)" in failed
    for out in (why, failed, json.dumps(late), json.dumps(fires)):
        assert SECRET not in out


def test_status_reports_due_age_leases_nodes_and_lanes(ledger: dict[str, Any]) -> None:
    store = Store.open(ledger["db"])
    # A trigger whose first instant passed ten minutes ago, with no timing plane running: it waits.
    t = add_tenant(store, "stalled")
    past = int(time.time()) * S - 10 * M
    add_trigger(store, t, add_target(store, t), {"every": "60s"}, now_us=past, partition=42)
    with store.engine.write() as c:   # what the timing plane would have written (read only for us)
        c.execute(f"INSERT INTO leases (partition, owner, epoch, expires_us, eps_us) VALUES (11, 'timing-x', 1, "
                  f"{past + 3600 * S}, 3000)")
        c.execute(f"INSERT INTO nodes (id, role, started_us, heartbeat_us, eps_us, eps_source) VALUES "
                  f"('timing-x', 'timing', {T0}, {T0}, 3000, 'declared')")
    store.close()
    out = json.loads(cli("status", "--db", ledger["db"], "--json").stdout)
    assert out["leases"] == [{"partition": 11, "owner": "timing-x", "epoch": 1, "live": True,
                              "expires": out["leases"][0]["expires"]}]
    assert out["nodes"][0]["eps_s"] == 0.003 and out["nodes"][0]["eps_source"] == "declared"
    assert set(out["due_age_s"]) == {"42"} and 9 * 60 < out["due_age_max_s"] < 11 * 60
    text = cli("status", "--db", ledger["db"], env=WIDE).stdout
    assert "oldest undispatched due age" in text and "timing-x" in text


def test_history_export_then_purge_archives_before_deleting(ledger: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    db, tmp = ledger["db"], ledger["tmp"]
    cut = "2027-01-15T08:04:30Z"   # T0 + 4.5 min: fires 0..3 (the first is at T0 + 1 min)
    assert ledger["first"] == T0 + M
    cli("history", "export", "--db", db, "--before", cut, "--out", str(tmp / "a.jsonl.gz"))
    exported = [json.loads(x) for x in gzip.decompress((tmp / "a.jsonl.gz").read_bytes()).splitlines()]
    assert [e["state"] for e in exported] == ["expired", "expired", "skipped", "delivered"]
    assert exported[3]["attempts"][0]["http_status"] == 200 and exported[0]["tenant_id"] == ledger["tenant"]
    assert all(SECRET not in json.dumps(e) and "payload" not in e for e in exported)
    fires = run_main(monkeypatch, capsys, "fires", ledger["trigger"], "--db", db, "--json", out=True)[1]
    assert len(json.loads(fires)) == 6   # nothing deleted
    # An archive is never overwritten.
    code, err = run_main(monkeypatch, capsys, "history", "export", "--db", db, "--before", cut, "--out",
                         str(tmp / "a.jsonl.gz"))
    assert code == 2 and "exists" in err
    purged = cli("history", "purge", "--db", db, "--before", cut, "--out", str(tmp / "p.jsonl.gz"), "--batch", "2")
    assert "purged 4 fires" in purged.stdout
    archived = gzip.decompress((tmp / "p.jsonl.gz").read_bytes()).splitlines()
    assert [json.loads(x)["key"] for x in archived] == [e["key"] for e in exported]
    left = json.loads(run_main(monkeypatch, capsys, "fires", ledger["trigger"], "--db", db, "--json", out=True)[1])
    assert [f["state"] for f in left] == ["failed", "delivered"]
    store = Store.open(db)
    with store.engine.read() as c:
        assert c.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 2
    store.close()




@pytest.mark.parametrize(("args", "needle"), [
    (["why", "not-a-key"], "FIRE_KEY"),
    (["fires", "tr_x", "--from", "yesterday"], "--from"),
    (["fires", "tr_x", "--state", "exploded"], "--state"),
    (["fires", "tr_nope"], "TRIGGER_ID"),
    (["fires", "tr_x", "--limit", "0"], "--limit"),
    (["history", "purge", "--before", "soon", "--out", "x.gz"], "--before"),
    (["history", "export", "--batch", "0", "--out", "{tmp}/b.gz"], "--batch"),
])
def test_bad_operator_input_is_one_line_and_exit_2(ledger: dict[str, Any], args: list[str], needle: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.replace("{tmp}", str(ledger["tmp"])) for a in args]
    code, err = run_main(monkeypatch, capsys, *args, "--db", ledger["db"])
    assert code == 2, err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (ledger["tmp"] / "b.gz").exists()


def test_a_missing_sqlite_file_is_not_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(monkeypatch, capsys, "status", "--db", f"sqlite:///{tmp_path}/typo.db")
    assert code == 2 and "no database" in err
    assert not (tmp_path / "typo.db").exists()
