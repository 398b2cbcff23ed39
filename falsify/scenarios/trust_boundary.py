"""``trust-…`` fault scenarios: the trust boundary end to end, with real processes.

* ``trust-payload-sentinel`` — a full run of ``fireledger serve`` (debug logs) with a sentinel string
  in every payload, deliveries that succeed, fail finally, are retried, are refused (lapsed target),
  plus API errors provoked with the sentinel in the request: the sentinel reaches the sink (it is
  delivered) and appears in NO log line, metric, history/audit response or error body, nor in
  plaintext in the database files. Then the tenant is deleted: its ciphertext can no longer be
  decrypted (even with the KEK) and its triggers stop.
* ``trust-unverified-target-refused`` — a trigger at an unverified target is refused at write time;
  a target whose verification fails later is not called at dispatch, each refusal recorded with a
  cause in history.
* ``trust-audit-tamper`` — ``fireledger audit verify`` passes on the real audit of a run, then names
  the row after an edit, a deletion and a reorder.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SENTINEL = "SENTINEL-7f3a9c-card-4111111111111111"


class RecordingApi:
    """The e2e API client, keeping every response body (to grep for the sentinel)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.bodies: list[str] = []

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        status, out = self.api.call(method, path, body, raw=raw)
        self.bodies.append(json.dumps(out) if not isinstance(out, str) else out)
        return status, out

    def ok(self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200, 201, 204)) -> Any:
        status, out = self.call(method, path, body)
        if status not in expect:
            raise AssertionError(f"{method} {path} -> {status}: {out}")
        return out


def _fires(api: RecordingApi, trigger_id: str) -> list[dict[str, Any]]:
    return api.ok("GET", f"/v1/triggers/{trigger_id}/fires?limit=1000")["items"]  # type: ignore[no-any-return]


def _setup(svc: Any, sink: Any, paths: list[str]) -> tuple[RecordingApi, list[dict[str, Any]]]:
    from e2e import Api, new_tenant, verify_target

    _, token = new_tenant(svc.db)
    api = RecordingApi(Api(svc.base, token))
    targets = []
    for path in paths:
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{path}"})
        sink.add_secret(tg["secret"])
        verify_target(api.api, sink, tg)
        targets.append(tg)
    return api, targets


def payload_sentinel(run_s: float) -> dict[str, Any]:
    from e2e import Service, cli, wait_until
    from fireledger.security.envelope import PayloadCipher, PayloadUnreadable, load_kek
    from fireledger.store import Store
    from sink import SinkServer

    work = Path(tempfile.mkdtemp(prefix="trust-sentinel-"))
    db = f"sqlite:///{work}/fl.db"
    failures: list[str] = []
    out: dict[str, Any] = {}
    metrics = ""
    delivered_payloads: list[Any] = []
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(db, work, env={"FIRELEDGER_LOG_LEVEL": "debug"}).start()
    try:
        api, (good, gone, flaky, lapsing) = _setup(svc, sink, ["/ok", "/status/404", "/fail-first/1", "/lapse"])
        payload = {"card": SENTINEL, "nested": {"why": SENTINEL}}
        ids = {}
        for name, tg in (("good", good), ("gone", gone), ("flaky", flaky), ("lapsing", lapsing)):
            ids[name] = api.ok("POST", "/v1/triggers", {"name": name, "schedule": {"every": "1s"},
                                                        "target_id": tg["id"], "payload": payload,
                                                        "timeout": "2s"})["id"]
        # Errors provoked with the sentinel in the request: none may echo it.
        bad_requests: list[tuple[str, str, Any, bytes | None]] = [
            ("POST", "/v1/triggers", {"name": "big", "schedule": {"every": "1s"}, "target_id": good["id"],
                                      "payload": {"x": SENTINEL * 2000}}, None),
            ("POST", "/v1/triggers", None, ('{"name": "x", "payload": {"a": "' + SENTINEL + '"').encode()),
            ("POST", "/v1/triggers", None, ('{"name": "x", "schedule": {"every": "1s"}, "target_id": "'
                                            + good["id"] + '", "payload": {"a": NaN, "b": "' + SENTINEL + '"}}'
                                            ).encode()),
            ("PATCH", f"/v1/triggers/{ids['good']}", {"payload": {"a": SENTINEL}, "schedule": {"cron": "99 * * * *"}},
             None),
            ("PATCH", f"/v1/triggers/{ids['good']}", {"payload": SENTINEL}, None),
            ("POST", "/v1/triggers", {"name": "x", "schedule": {"every": "1s"}, "target_id": good["id"],
                                      "payload": {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[SENTINEL]]]]]]]]]]]]]]]]]]
                                                           ]]]]]]]]]]]]]]]]}}, None),
            ("POST", "/v1/triggers", {"name": "x", "schedule": {"every": "1s"}, "target_id": "tg_nope",
                                      "payload": {"a": SENTINEL}}, None),
        ]
        for method, path, body, raw in bad_requests:
            status, _ = api.call(method, path, body, raw=raw)
            if status < 400:
                failures.append(f"{method} {path} with a bad body answered {status}")

        def delivered() -> bool:
            recs = sink.records()
            return (sum(1 for r in recs if r["trigger_id"] == ids["good"]) >= 3
                    and any(f["state"] == "failed" for f in _fires(api, ids["gone"]))
                    and any(f["state"] == "delivered" and f["attempts"][0]["result"] == "retry"
                            for f in _fires(api, ids["flaky"])))

        wait_until(delivered, 30, "deliveries, a final failure and a retried delivery")
        # The lapsing target fails a re-verification: it is not called from then on.
        sink.remove_challenge(lapsing["verification"]["token"])
        lapsed = api.ok("POST", f"/v1/targets/{lapsing['id']}/verify")
        if lapsed["verification"]["state"] != "failed":
            failures.append(f"re-verification did not fail: {lapsed['verification']}")
        lapsed_at = time.time()
        wait_until(lambda: any((f["cause"] or "").startswith("failed: not sent:") for f in _fires(api, ids["lapsing"])),
                   15, "a refused attempt at the lapsed target")
        deadline = time.time() + run_s
        wait_until(lambda: time.time() >= deadline, run_s + 5, "the run", interval_s=0.2)
        late = [r for r in sink.records() if r["path"] == "/lapse" and r["arrived_at"] > lapsed_at + 1.5]
        if late:
            failures.append(f"the lapsed target was called {len(late)} times after its verification failed")
        delivered_payloads = [r["payload"] for r in sink.records() if r["trigger_id"] == ids["good"]]
        if not delivered_payloads or any(p != payload for p in delivered_payloads):
            failures.append("the payload did not reach the target intact (decryption in the runner)")

        # Read everything a tenant can read.
        for tid in ids.values():
            fires = _fires(api, tid)
            api.ok("GET", f"/v1/triggers/{tid}")
            api.ok("GET", f"/v1/triggers/{tid}/preview?count=3")
            for f in fires[:5]:
                api.ok("GET", f"/v1/fires/{f['key']}")
        api.call("GET", "/v1/fires?limit=1000")
        api.ok("GET", "/v1/triggers?limit=1000")
        api.ok("GET", "/v1/targets?limit=1000")
        api.ok("GET", "/v1/audit?limit=1000")
        with urllib.request.urlopen(svc.base + "/metrics", timeout=10) as r:
            metrics = r.read().decode()

        # Delete the tenant: its ciphertext becomes undecryptable at once, its deliveries stop.
        tenant_id = good_tenant = ""
        store = Store.open(db)
        try:
            row = store.engine.connection().execute(
                "SELECT tenant_id, trigger_id, version, payload FROM trigger_versions WHERE trigger_id = ?",
                (ids["good"],)).fetchone()
            tenant_id, blob = row[0], bytes(row[3])
            kek = load_kek()   # the service's KEK: the run's state directory (falsify/run.py)
            if PayloadCipher(store, kek).open(tenant_id, row[1], row[2], blob) != json.dumps(
                    payload, separators=(",", ":")).encode():
                failures.append("the stored ciphertext did not open before deletion")
            out = json.loads(cli("tenant", "delete", tenant_id, "--db", db, "--yes").stdout)
            good_tenant = tenant_id
            deleted_at = time.time()
            try:
                PayloadCipher(store, kek).open(tenant_id, row[1], row[2], blob)
                failures.append("the ciphertext still decrypts after the tenant was deleted")
            except PayloadUnreadable:
                pass
        finally:
            store.close()
        wait_until(lambda: time.time() >= deleted_at + 4, 10, "deliveries to stop", interval_s=0.2)
        after = [r for r in sink.records() if r["arrived_at"] > deleted_at + 3]
        if after:
            failures.append(f"{len(after)} deliveries after the tenant was deleted")
        status, _ = api.call("GET", "/v1/triggers")
        if status != 401:
            failures.append(f"the deleted tenant's token still works ({status})")
    finally:
        svc.stop()
        sink.stop()
    log = svc.log_text()
    files = b"".join(p.read_bytes() for p in work.iterdir() if p.name.startswith("fl.db"))
    where = {"log": SENTINEL in log, "metrics": SENTINEL in metrics,
             "responses": any(SENTINEL in b for b in api.bodies), "database_files": SENTINEL.encode() in files}
    leaks = [k for k, v in where.items() if v]
    if leaks:
        failures.append(f"the sentinel leaked into: {', '.join(leaks)}")
    return {"passed": not failures, "failures": failures, "tenant": good_tenant,
            "deliveries_with_sentinel": len(delivered_payloads), "log_lines": log.count("\n"),
            "responses_checked": len(api.bodies), "metrics_bytes": len(metrics), "deleted": out}


def unverified_target_refused() -> dict[str, Any]:
    from e2e import Api, Service, new_tenant, verify_target, wait_until
    from sink import SinkServer

    work = Path(tempfile.mkdtemp(prefix="trust-unverified-"))
    failures: list[str] = []
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(f"sqlite:///{work}/fl.db", work).start()
    try:
        _, token = new_tenant(svc.db)
        api = Api(svc.base, token)
        tg = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hook"}, 201)
        sink.add_secret(tg["secret"])
        body = {"name": "t", "schedule": {"every": "1s"}, "target_id": tg["id"]}
        status, problem = api.call("POST", "/v1/triggers", body)
        refused_at_write = status == 422 and problem["errors"][0]["field"] == "target_id"
        if not refused_at_write:
            failures.append(f"a trigger at an unverified target answered {status}")
        verify_target(api, sink, tg)
        tid = api.ok("POST", "/v1/triggers", body, 201)["id"]
        wait_until(lambda: len(sink.records()) >= 2, 20, "deliveries once verified")
        sink.remove_challenge(tg["verification"]["token"])
        api.ok("POST", f"/v1/targets/{tg['id']}/verify", None, 200)
        failed_at = time.time()

        def refused() -> list[dict[str, Any]]:
            fires = api.ok("GET", f"/v1/triggers/{tid}/fires?limit=1000")["items"]
            return [f for f in fires if (f["cause"] or "").startswith("failed: not sent:")]

        wait_until(lambda: len(refused()) >= 3, 20, "refused attempts")
        got = refused()
        calls_after = [r for r in sink.records() if r["arrived_at"] > failed_at + 1.5]
        if calls_after:
            failures.append(f"the target was called {len(calls_after)} times after its verification failed")
        status, again = api.call("POST", "/v1/triggers", body)
        if status != 422:
            failures.append(f"a trigger at a target whose verification failed answered {status}")
    finally:
        svc.stop()
        sink.stop()
    return {"passed": not failures, "failures": failures, "refused_at_write": refused_at_write,
            "refused_at_dispatch": len(got), "example_cause": got[0]["cause"] if got else None}


def _rechain_unkeyed(c: Any, from_seq: int) -> None:
    """A database writer without the audit key: edit a row, recompute every link from it with the
    unkeyed SHA-256 (as the code before migration 0011 did) and move the head to match."""
    from fireledger.domain.trust_records import chain_hash

    c.execute("UPDATE audit SET actor = 'mallory' WHERE seq = ?", (from_seq,))
    rows = c.execute("SELECT seq, tenant_id, actor, action, at_us, prior, new, prev_hash FROM audit "
                     "WHERE seq >= ? ORDER BY seq", (from_seq,)).fetchall()
    prev = rows[0][7]
    for r in rows:
        h = chain_hash(r[0], r[1], r[2], r[3], r[4], r[5], r[6], prev)
        c.execute("UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, h, r[0]))
        prev = h
    c.execute("DROP TRIGGER IF EXISTS audit_head_advances")
    c.execute("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", (rows[-1][0], prev))


def audit_tamper() -> dict[str, Any]:
    from e2e import cli
    from fireledger.control.tenants import create_tenant
    from fireledger.store import Store

    work = Path(tempfile.mkdtemp(prefix="trust-audit-"))
    db = f"sqlite:///{work}/fl.db"
    store = Store.open(db)
    for i in range(6):
        create_tenant(store, f"tenant-{i}", 1_800_000_000_000_000 + i)
    conn = store.engine.connection()
    conn.execute("DROP TRIGGER audit_no_update")
    conn.execute("DROP TRIGGER audit_no_delete")
    store.close()
    intact = cli("audit", "verify", "--db", db, check=False)
    results = {"intact_exit": intact.returncode}
    cases = {
        "edit": ("UPDATE audit SET actor = 'mallory' WHERE seq = 4", "row 4"),
        "delete": ("DELETE FROM audit WHERE seq = 2", "row 2"),
        "reorder": ("UPDATE audit SET seq = -1 WHERE seq = 5; UPDATE audit SET seq = 5 WHERE seq = 6; "
                    "UPDATE audit SET seq = 6 WHERE seq = -1", "row 5"),
    }
    failures = [] if intact.returncode == 0 else [f"verify failed on an intact chain: {intact.stderr}"]
    import shutil

    from fireledger.store.sqlitelib import sqlite3

    cases["rechain-unkeyed"] = ("", "row 3")   # edit row 3, recompute links and head the pre-0011 way
    for name, (sql, row) in cases.items():
        copy = work / f"{name}.db"
        shutil.copy(work / "fl.db", copy)
        with sqlite3.connect(copy) as c:
            if sql:
                c.executescript(sql)
            else:
                _rechain_unkeyed(c, from_seq=3)
        # the copy's chain is keyed by the service's KEK (the run's state directory, inherited)
        out = cli("audit", "verify", "--db", f"sqlite:///{copy}", check=False)
        named = out.returncode == 1 and row in out.stderr
        results[name] = out.stderr.strip()
        if not named:
            failures.append(f"{name}: exit {out.returncode}, {out.stderr.strip()!r} does not name {row}")
    return {"passed": not failures, "failures": failures, **results}


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "trust-payload-sentinel", lambda: payload_sentinel(1.0 if quick else 20.0)
    yield "trust-unverified-target-refused", unverified_target_refused
    yield "trust-audit-tamper", audit_tamper
