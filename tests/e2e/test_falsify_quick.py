"""The short form of the fault-injection suite runs in `make test`: every quick scenario passes."""

from __future__ import annotations

import pytest
from falsify.run import discover, run_one

pytestmark = pytest.mark.e2e

# store-*: tests/e2e/test_store_failover.py runs them, skipped when pg_auto_failover cannot be installed.
# time-dst-weekend: tests/e2e/test_time_dst_weekend.py runs it (with per-segment assertions).
SCENARIOS = [(n, fn) for n, fn in discover(quick=True) if not n.startswith(("store-", "time-dst-"))]


@pytest.mark.parametrize(("name", "fn"), SCENARIOS, ids=[n for n, _ in SCENARIOS])
def test_quick_scenario_passes(name, fn):
    res = run_one(name, fn)
    assert res["passed"], (res.get("failures") or res.get("error"), res)
