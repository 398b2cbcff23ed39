"""``fireledger tenant create`` and ``fireledger db upgrade``, run as the real console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fireledger.clock import FakeClock
from fireledger.control import create_app
from fireledger.store import Store


def _fireledger() -> str:
    beside = Path(sys.executable).parent / "fireledger"
    found = str(beside) if beside.exists() else shutil.which("fireledger")
    assert found, "the fireledger console script is not installed"
    return found


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "FIRELEDGER_DB"} | (env or {})
    return subprocess.run([_fireledger(), *args], capture_output=True, text=True, timeout=60, env=full_env,
                          cwd=cwd, check=False)


def test_tenant_create_json_token_authenticates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fl.db"
    r = run("tenant", "create", "acme", "--db", url, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"tenant_id", "token"}
    assert out["tenant_id"].startswith("tn_") and out["token"].startswith("fl_") and len(out["token"]) > 40

    store = Store.open(url)
    try:
        # Only the hash is stored.
        conn = store.engine.connection()
        assert out["token"] not in repr(conn.execute("SELECT * FROM principals").fetchall())
        with TestClient(create_app(store, FakeClock(1_800_000_000_000_000))) as client:
            ok = client.get("/v1/triggers", headers={"Authorization": f"Bearer {out['token']}"})
            assert ok.status_code == 200 and ok.json() == {"items": [], "next": None}
            tg = client.post("/v1/targets", headers={"Authorization": f"Bearer {out['token']}"},
                             json={"kind": "http", "url": "https://hooks.example.com/"})
            assert tg.status_code == 201
            bad = client.get("/v1/triggers", headers={"Authorization": f"Bearer {out['token']}x"})
            assert bad.status_code == 401
    finally:
        store.close()


def test_duplicate_and_bad_names_exit_2_with_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fl.db"
    assert run("tenant", "create", "acme", "--db", url, "--json").returncode == 0
    for args in (("acme",), ("   ",), ("x" * 201,)):
        r = run("tenant", "create", *args, "--db", url, "--json")
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fireledger: ") and "Traceback" not in r.stderr
        assert "NAME" in lines[0]
    assert "already exists" in run("tenant", "create", "acme", "--db", url).stderr


def test_bad_db_url_exits_2(tmp_path: Path) -> None:
    for url in ("mysql://nope", f"sqlite:///{tmp_path}/missing-dir/fl.db"):
        r = run("tenant", "create", "acme", "--db", url)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fireledger: ") and "--db" in lines[0]


def test_readable_output_and_env_db(tmp_path: Path) -> None:
    r = run("tenant", "create", "beta", env={"FIRELEDGER_DB": f"sqlite:///{tmp_path}/env.db"})
    assert r.returncode == 0, r.stderr
    assert "tn_" in r.stdout and "fl_" in r.stdout and "only once" in r.stdout
    assert (tmp_path / "env.db").exists()


@pytest.mark.parametrize("engine", ["sqlite"])
def test_db_upgrade_reports_applied_versions(tmp_path: Path, engine: str) -> None:
    url = f"sqlite:///{tmp_path}/up.db"
    first = run("db", "upgrade", "--db", url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied migrations 1")
    again = run("db", "upgrade", "--db", url)
    assert again.returncode == 0 and "nothing to apply" in again.stdout
    store = Store.open(url, migrate=False)  # the schema check passes
    store.close()
