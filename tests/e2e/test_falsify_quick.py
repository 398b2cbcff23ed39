"""The short form of the fault-injection suite runs in `make test`: every quick scenario passes."""

from __future__ import annotations

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


@pytest.mark.parametrize(("name", "fn"), PARAMS)
def test_quick_scenario_passes(name, fn):
    res = run_one(name, fn)
    assert res["passed"], (res.get("failures") or res.get("error"), res)
