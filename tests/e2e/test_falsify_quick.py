"""The short form of the fault-injection suite runs in `make test`: every quick scenario passes."""

from __future__ import annotations

import json

import pytest
from falsify.run import discover, run_one

pytestmark = pytest.mark.e2e

# store-*: tests/e2e/test_store_failover.py runs them, skipped when pg_auto_failover cannot be installed.
# time-dst-weekend: tests/e2e/test_time_dst_weekend.py runs it (with per-segment assertions).
SCENARIOS = [(n, fn) for n, fn in discover(quick=True) if not n.startswith(("store-", "time-dst-"))]
# long (decision 0203): tests/e2e/test_hardening_key_material.py checks the same on real processes in
# `make test` (no key material tracked, state names ignored, init's modes, each refusal naming its chmod).
LONG = {"trust-key-material"}
PARAMS = [pytest.param(n, fn, id=n, marks=[pytest.mark.long] if n in LONG else []) for n, fn in SCENARIOS]


@pytest.fixture(scope="module", autouse=True)
def _scenarios_on_the_sessions_postgresql(pg_server):
    """The scenarios that need PostgreSQL make their databases on the session's throwaway server
    (``falsify.timing_cluster.pg_server`` would start a second one; decision 0238); each test's are
    dropped after it, as any test's (decision 0223)."""
    import falsify.timing_cluster as tc

    before, tc._PG = tc._PG, pg_server
    yield
    tc._PG = before


@pytest.mark.parametrize(("name", "fn"), PARAMS)
def test_quick_scenario_passes(name, fn):
    res = run_one(name, fn)
    assert res["passed"], json.dumps(res, indent=1, default=str)   # every figure, not pytest's cut repr
