"""The run-now grant's migration (decision 0175) on a real SQLite file and a real PostgreSQL database:
principals that held ``author`` before it keep running triggers (they are granted ``runner``); those
without ``author`` gain nothing; a principal that already holds ``runner`` is left as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fireledger.domain.model import Principal, Tenant
from fireledger.store import Store
from storekit import T0


def _grant_version(engine: str) -> int:
    """The number of the runner-grant migration (found by name: the coordinator may renumber it)."""
    from importlib import resources

    tree = resources.files("fireledger.store").joinpath("sql", engine)
    [name] = [e.name for e in tree.iterdir() if e.name.endswith("_runner_grant.sql")]
    return int(name[:4])


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_authors_before_the_migration_keep_run_now(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   request: pytest.FixtureRequest) -> None:
    import fireledger.store.root as store_root
    from fireledger.store.engine import engine_for_url, migration_files

    pg: Any = request.getfixturevalue("pg_server") if kind == "postgres" else None
    monkeypatch.setenv("FIRELEDGER_KEK", "A" * 43 + "=")   # no KEK file needed on either engine
    url = f"sqlite:///{tmp_path}/store.db" if kind == "sqlite" else pg.new_database()
    version = _grant_version(kind)
    held = {"pr_author": {"author", "reader"}, "pr_reader": {"reader"}, "pr_admin": {"admin", "author"},
            "pr_both": {"author", "runner"}, "pr_policy": {"policy", "backfill"}}
    with monkeypatch.context() as m:
        m.setattr(store_root, "migration_files", lambda engine: [f for f in migration_files(engine) if f[0] < version])
        old = Store(engine_for_url(url))
        old.migrate()
    try:
        tenant = Tenant("tn_m", "m", T0)
        first, *rest = held.items()
        old.trust.create_tenant_audited(tenant, Principal(first[0], "tn_m", first[0], frozenset(first[1]), T0),
                                        "h0", "operator")
        for i, (pid, roles) in enumerate(rest, start=1):
            old.trust.create_principal(Principal(pid, "tn_m", pid, frozenset(roles), T0), f"h{i}")
    finally:
        old.close()
    store = Store(engine_for_url(url))
    try:
        store.migrate()   # what `fireledger db upgrade` runs
        got = {p.id: set(p.roles) for p in store.trust.list_principals("tn_m")}
    finally:
        store.close()
    assert got == {"pr_author": {"author", "reader", "runner"}, "pr_reader": {"reader"},
                   "pr_admin": {"admin", "author", "runner"}, "pr_both": {"author", "runner"},
                   "pr_policy": {"policy", "backfill"}}
