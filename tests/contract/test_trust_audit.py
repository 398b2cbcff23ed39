"""The audit is tamper-evident: an edited, deleted or reordered row makes `audit verify` fail and name
the row — in the library on both engines, and through the real `fireledger audit` CLI."""

from __future__ import annotations

import json

from e2e import cli
from fireledger.control.tenants import create_tenant
from fireledger.domain.trust_records import GENESIS_HASH
from fireledger.security.auditlog import verify_chain
from fireledger.store import Store
from storekit import T0


def _fill(store: Store, n: int = 5) -> None:
    for i in range(1, n + 1):
        store.trust.append_audit("tn_a", f"pr_{i}", "trigger.policy", T0 + i, {"catchup_horizon": "1h"},
                           {"catchup_horizon": f"{i}h"})


def _tamper(store: Store, *statements: str) -> None:
    """Run SQL as someone with full database rights: the append-only triggers are dropped first."""
    with store.engine.write() as c:
        if store.engine_name == "sqlite":
            for trigger in ("audit_no_update", "audit_no_delete", "audit_insert_at_head", "audit_head_advances",
                            "audit_head_no_delete"):
                c.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        else:
            c.execute("ALTER TABLE audit DISABLE TRIGGER USER")
            c.execute("ALTER TABLE audit_head DISABLE TRIGGER USER")
        for sql in statements:
            c.execute(sql)


TAMPERING = {
    "edit": (["UPDATE audit SET new = '{\"catchup_horizon\":\"24h\"}' WHERE seq = 3"], 3, "edited"),
    "edit-actor": (["UPDATE audit SET actor = 'pr_innocent' WHERE seq = 2"], 2, "edited"),
    "delete": (["DELETE FROM audit WHERE seq = 3"], 3, "missing"),
    "delete-tail": (["DELETE FROM audit WHERE seq = 5"], 5, "missing"),
    "delete-and-renumber": (["DELETE FROM audit WHERE seq = 3", "UPDATE audit SET seq = seq - 1 WHERE seq > 3"],
                            3, "reordered"),
    "reorder": (["UPDATE audit SET seq = 1000 WHERE seq = 2", "UPDATE audit SET seq = 2 WHERE seq = 3",
                 "UPDATE audit SET seq = 3 WHERE seq = 1000"], 2, "reordered"),
    "rehash-one": (["UPDATE audit SET hash = prev_hash WHERE seq = 4"], 4, "edited"),
}


def _reset(store: Store) -> None:
    _tamper(store, "DELETE FROM audit", f"UPDATE audit_head SET seq = 0, hash = '{GENESIS_HASH}'")


def test_tampering_is_detected_and_the_row_named(store):
    for how, (statements, row, kind) in sorted(TAMPERING.items()):
        _reset(store)
        _fill(store)
        assert verify_chain(store).ok, how
        _tamper(store, *statements)
        report = verify_chain(store)
        assert not report.ok and report.broken_seq == row, (how, report)
        assert report.problem.startswith(kind) and f"row {row}" in report.line(), (how, report.line())


def test_cli_verify_and_export(tmp_path):
    db = f"sqlite:///{tmp_path}/fl.db"
    store = Store.open(db)
    for name in ("acme", "globex"):
        create_tenant(store, name, T0)
    store.close()
    ok = cli("audit", "verify", "--db", db)
    assert ok.stdout.startswith("audit chain intact: 2 rows"), ok.stdout
    lines = [json.loads(x) for x in cli("audit", "export", "--db", db).stdout.splitlines()]
    assert [x["seq"] for x in lines] == [1, 2] and {x["action"] for x in lines} == {"tenant.create"}
    assert all(x["at"].endswith("Z") and len(x["hash"]) == 64 for x in lines)
    assert lines[1]["prev_hash"] == lines[0]["hash"]
    one = cli("audit", "export", "--db", db, "--tenant", lines[0]["tenant_id"]).stdout.splitlines()
    assert [json.loads(x)["seq"] for x in one] == [1]

    store = Store.open(db)
    try:
        _tamper(store, "UPDATE audit SET actor = 'someone else' WHERE seq = 2")
    finally:
        store.close()
    bad = cli("audit", "verify", "--db", db, check=False)
    assert bad.returncode == 1 and "row 2" in bad.stderr and "edited" in bad.stderr, bad.stderr
    assert bad.stderr.count("\n") == 1
    usage = cli("audit", "verify", "--db", "mysql://nope", check=False)
    assert usage.returncode == 2 and usage.stderr.startswith("fireledger:") and "Traceback" not in usage.stderr
