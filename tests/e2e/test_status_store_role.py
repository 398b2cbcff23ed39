"""``fireledger status`` shows the store's role (issue 16): embedded SQLite, or the PostgreSQL
primary the URL reached with whether commits wait for a synchronous standby and how many promotions
its timeline has been through. Real processes on both engines; on the pg_auto_failover cluster the
same fields are checked by ``store-failover-switchover`` and ``store-standby-loss``."""

from __future__ import annotations

import json

import pytest

from e2e import cli

pytestmark = pytest.mark.e2e
WIDE = {"COLUMNS": "200"}


def test_status_shows_the_store_role(db):
    if db.startswith("sqlite"):
        cli("db", "upgrade", "--db", db)
    got = json.loads(cli("status", "--db", db, "--json").stdout)["store"]
    text = cli("status", "--db", db, env=WIDE).stdout
    if db.startswith("sqlite"):
        assert got["role"] == "embedded" and got["server"] == "sqlite"
        assert "store: embedded (SQLite)" in text
    else:
        # The test server is a lone primary: no standby; its promotions are its timeline − 1.
        assert got["role"] == "primary" and got["promotions"] == got["timeline"] - 1 >= 0
        assert got["synchronous"] is False and got["sync_required"] is False and got["sync_standbys"] == 0
        assert "store: primary" in text and "asynchronous" in text and "promotion(s)" in text
