"""``make test`` runs the quick form of ``store-failover-primary-kill`` (issue 16): a pg_auto_failover
cluster on this machine, control + dispatch + two timing processes on its multi-host URL, one kill
of the primary's node. Skipped only when pg_auto_failover cannot be installed here (the reason is
the skip message); the full form runs in ``make falsify``."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_primary_kill_quick_form():
    from falsify.scenarios.store_failover import RTO_LIMIT_S, scenarios

    from hacluster import HaCluster

    reason = HaCluster.available()
    if reason is not None:
        pytest.skip(reason)
    [(name, fn)] = list(scenarios(quick=True))
    res = fn()
    assert res["passed"], (res.get("failures") or res.get("error"), res)
    assert name == "store-failover-primary-kill"
    assert res["deliveries_without_record"] == 0 and res["early_deliveries"] == 0
    assert res["promoted"] != res["killed_node"]
    assert res["rto_decided_s"] is not None and res["rto_decided_s"] <= RTO_LIMIT_S
