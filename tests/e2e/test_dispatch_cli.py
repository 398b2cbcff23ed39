"""``fireledger tenant quota``: show and change a tenant's dispatch quota (audited); bad input is one
line and exit 2; and the dispatch settings in the environment are checked before a plane starts."""

from __future__ import annotations

import json
import sys

import pytest

from e2e import cli, new_tenant
from fireledger.cli import main
from fireledger.store import Store


def run(monkeypatch, capsys, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The CLI in this process (same entry point as the installed command, minus the start-up)."""
    monkeypatch.setattr(sys, "argv", ["fireledger", *args])
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main()
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def test_tenant_quota_show_change_and_audit(tmp_path):
    db = f"sqlite:///{tmp_path}/fl.db"
    tenant_id, _ = new_tenant(db)
    shown = json.loads(cli("tenant", "quota", tenant_id, "--db", db, "--json").stdout)
    assert shown == {"tenant_id": tenant_id, "fires_per_s": 100.0, "inflight": 100, "catchup_fraction": 0.1,
                     "catchup_per_s": 10.0}
    out = cli("tenant", "quota", tenant_id, "--db", db, "--fires-per-s", "40", "--catchup-fraction", "0.05")
    assert "40 fires/s, 100 in flight" in out.stdout and "(2/s each)" in out.stdout and "audited" in out.stdout
    store = Store.open(db)
    try:
        assert store.dispatch.tenant_quota(tenant_id) == (40.0, 100, 0.05)
        [row] = [r for r in store.trust.audit_rows(tenant_id=tenant_id) if r.action == "tenant.quota"]
        assert json.loads(row.prior)["fires_per_s"] == 100.0 and json.loads(row.new)["catchup_fraction"] == 0.05
        assert row.actor == "operator"
    finally:
        store.close()


def test_tenant_quota_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from fireledger.control.auth import create_tenant

    db = f"sqlite:///{tmp_path}/fl.db"
    store = Store.open(db)
    tenant_id, _ = create_tenant(store, "acme", 0)
    store.close()
    cases = ((["--fires-per-s", "0"], "--fires-per-s"), (["--inflight", "0"], "--inflight"),
             (["--catchup-fraction", "1.5"], "--catchup-fraction"), (["--fires-per-s", "nan"], "--fires-per-s"))
    for args, flag in cases:
        code, _, err = run(monkeypatch, capsys, "tenant", "quota", tenant_id, "--db", db, *args)
        assert code == 2 and flag in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    code, _, err = run(monkeypatch, capsys, "tenant", "quota", "tn_nope", "--db", db)
    assert code == 2 and "TENANT_ID" in err


def test_bad_lane_settings_stop_a_dispatch_plane_before_it_starts(tmp_path, monkeypatch, capsys):
    db = f"sqlite:///{tmp_path}/fl.db"
    code, _, err = run(monkeypatch, capsys, "dispatch", "--db", db, env={"FIRELEDGER_LANE_CATCH_UP": "rate=fast"})
    assert code == 2 and "FIRELEDGER_LANE_CATCH_UP" in err and "Traceback" not in err
    monkeypatch.delenv("FIRELEDGER_LANE_CATCH_UP")
    code, _, err = run(monkeypatch, capsys, "serve", "--db", db, env={"FIRELEDGER_INTERNAL_MODULES": "no.such.module"})
    assert code == 2 and "FIRELEDGER_INTERNAL_MODULES" in err
