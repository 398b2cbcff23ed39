"""The figures the ``cost`` and ``scale-out`` bench scenarios derive from their measurements
(bench/cost.py ``_price``, bench/scaleout.py ``_rates`` and ``_vs``): pure arithmetic, checked
against the formulas stated in docs/performance.md ("Cost per million fires", "Scale-out on
PostgreSQL") and decisions 0198, 0199. No benchmark runs here."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_saved = list(sys.path)
sys.path.append(str(ROOT / "bench"))
import cost  # noqa: E402
import scaleout  # noqa: E402

sys.path[:] = _saved   # bench/ module names must not shadow the tests' helpers (sink, …)


def test_a_million_fires_is_priced_from_planes_and_server_cpu_and_wal():
    planes_us, server_us, wal_b = 300.0, 100.0, 3000.0
    got = cost._price(planes_us, wal_b, server_us)
    cpu_s = planes_us + server_us                                   # µs per fire × 10^6 fires = s
    usd_cpu = cpu_s / 3600 * cost.PRICE_VCPU_HOUR
    usd_wal = wal_b * 1e6 / 1e9 * cost.PRICE_PER_GB
    assert got["cpu_s"] == cpu_s and got["planes_cpu_s"] == planes_us and got["store_cpu_s"] == server_us
    assert got["wal_bytes"] == wal_b * 1e6
    assert math.isclose(got["usd_cpu"], round(usd_cpu, 4)) and math.isclose(got["usd_wal"], round(usd_wal, 4))
    assert math.isclose(got["usd"], round(usd_cpu + usd_wal, 4))
    assert math.isclose(got["vs_seed_target"], round((usd_cpu + usd_wal) / 0.60, 3))
    mean_cores = cpu_s * 5800 / 1e6
    peak_cores = cpu_s * 45000 / 1e6
    assert math.isclose(got["cores_for_5800_per_s"], round(mean_cores, 2))
    assert math.isclose(got["cores_for_45000_per_s"], round(peak_cores, 2))
    per_node = cost.NODE_VCPUS * cost.NODE_BUSY
    assert got["nodes_2vcpu_for_5800_per_s"] == math.ceil(mean_cores / per_node)
    assert got["nodes_2vcpu_for_45000_per_s"] == math.ceil(peak_cores / per_node)
    assert "price_basis" in got and got["seed_target_usd"] == cost.SEED_TARGET_PER_MILLION


def test_sqlite_has_no_server_cpu_and_no_cpu_figure_prices_nothing():
    got = cost._price(500.0, 20_000.0)
    assert got["store_cpu_s"] is None and got["cpu_s"] == 500.0
    assert cost._price(None, 1000.0) == {}


def test_drain_rates_leave_out_the_ramp_and_the_tail():
    t0 = 1_000_000_000
    # 100 arrivals: the first ten slow (one every 50 ms), then 90 at one every 1 ms.
    arr = [t0 + (i + 1) * 50_000_000 for i in range(10)]
    arr += [arr[-1] + (i + 1) * 1_000_000 for i in range(90)]
    got = scaleout._rates(arr, t0)
    assert got["delivered"] == 100
    assert math.isclose(got["drain_s"], (arr[-1] - t0) / 1e9, abs_tol=1e-3)
    assert math.isclose(got["delivered_per_s"], round(100 / ((arr[-1] - t0) / 1e9), 1))
    lo, hi = 10, 89
    assert math.isclose(got["steady_per_s"], round((hi - lo) / ((arr[hi] - arr[lo]) / 1e9), 1))
    assert got["steady_per_s"] > got["delivered_per_s"]   # the slow start is outside the 10–90 % span
    assert got["lateness_max_s"] == round((arr[-1] - t0) / 1e9, 4)
    assert scaleout._rates([], t0)["delivered"] == 0


def test_ratios_are_to_the_first_line_of_the_group():
    lines = [{"delivered_per_s": 500.0, "steady_per_s": 600.0, "lateness_p99_s": 4.0,
              "cpu_us_per_fire_by_plane": {"dispatch": 600.0}},
             {"delivered_per_s": 900.0, "steady_per_s": 1200.0, "lateness_p99_s": 2.0,
              "cpu_us_per_fire_by_plane": {"dispatch": 540.0}},
             {"error": "RuntimeError: boom"}]
    scaleout._vs(lines, "vs_n1")
    assert lines[0]["vs_n1"] == {"delivered_per_s": 1.0, "steady_per_s": 1.0, "lateness_p99_s": 1.0,
                                 "dispatch_cpu_us_per_fire": 1.0}
    assert lines[1]["vs_n1"] == {"delivered_per_s": round(900 / 500, 3), "steady_per_s": 2.0,
                                 "lateness_p99_s": 0.5, "dispatch_cpu_us_per_fire": round(540 / 600, 3)}
    assert "vs_n1" not in lines[2]
