"""The sizes of ``make bench``'s two forms, full and ``--quick``, in one place (``bench/run.py``), and
the total deadline of each scenario group (decision 0215).

A form is what a scenario runs by default; a few command-line flags override single sizes
(``--burst-sizes``, ``--steady-rates``, ``--steady-confirm-s``, ``--overload-sizes``,
``--overload-duration-s``, ``--commit-n``, ``--scale-n``, ``--scale-out-m``) so that each scenario of
the full form can be proved to run to its end with smaller sizes, one at a time.

Each run inside a group is bounded by its own deadline (a burst's, a steady run's drain, the waits
of ``overload``/``cost``/``scale-out``); the group deadline bounds the group as a whole: runs are
started only while it has not passed, and what was not started gets a ``timed_out`` line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

STEADY_TARGET = 5800
LADDER = (250, 500, 1000, 2000, 3000, 4000, STEADY_TARGET)


@dataclass(frozen=True)
class Form:
    """Sizes of one form (the defaults are the full form's)."""

    quick: bool = False
    sink_n: int = 30_000
    burst_sizes: tuple[int, ...] = (10_000, 45_000)
    #: a peer whose schedules alone would take longer than this to add is skipped for that size
    peer_setup_cap_s: float = 180
    #: peers left out of this form's burst and steady runs (a ``skipped`` line says why)
    skip_peers: tuple[str, ...] = ()
    steady_rates: tuple[int, ...] = LADDER
    steady_peer_rates: tuple[int, ...] = LADDER
    #: fireledger on PostgreSQL split planes (``bench/pgsplit.py``)
    steady_split_rates: tuple[int, ...] = LADDER
    steady_probe_s: int = 5
    #: seconds of the confirming run at the best probe (None: the probes are the result: quick)
    steady_confirm_s: int | None = 60
    commit_n: int = 20_000
    #: interleaved rounds of the commit scenario (best of each side)
    commit_rounds: int = 3
    scale_n: int = 1_000_000
    punctuality_s: int = 20
    punctuality_peers: bool = True
    overload_sizes: tuple[int, ...] = (100, 300, 1000, 3000)
    overload_duration_s: int = 60
    scale_out_m: int = 10_000
    scale_out_dispatchers: tuple[int, ...] = (1, 2, 3)
    scale_out_serve: bool = True
    #: total deadline per scenario group, seconds (group name → seconds)
    deadlines: dict[str, float] = field(default_factory=lambda: {
        "sink": 120, "burst": 1200, "steady": 2700, "commit": 600, "scale": 900, "punctuality": 600,
        "overload": 3600, "cost": 600, "scale-out": 900, "profile": 600, "components": 900})

    def burst_deadline_s(self, n: int) -> float:
        """How long a burst of ``n`` may take from its instant to its last delivery."""
        if self.quick:
            return 30
        return 60 if n <= 10_000 else 150


QUICK = Form(
    quick=True, sink_n=10_000, burst_sizes=(2000,), peer_setup_cap_s=30, skip_peers=("apscheduler4-sqlite",),
    steady_rates=(1000, 3000),
    steady_peer_rates=(1000,), steady_split_rates=(1000,), steady_probe_s=10, steady_confirm_s=None,
    commit_n=5000, commit_rounds=2,
    scale_n=100_000,
    punctuality_s=5, punctuality_peers=False, overload_sizes=(300,), overload_duration_s=10, scale_out_m=3000,
    scale_out_dispatchers=(1, 2), scale_out_serve=False,
    deadlines={"sink": 60, "burst": 150, "steady": 180, "commit": 90, "scale": 120, "punctuality": 60,
               "overload": 240, "cost": 150, "scale-out": 180, "profile": 180, "components": 300})


#: why the quick form leaves APScheduler 4 SQLite out (decision 0214)
QUICK_SKIP = ("quick form: left out to keep it under 5 minutes — at ~80 fires/s its 2,000 burst and 10 s of "
              "1,000/s took ~80 s of the budget, and no issue-15 target compares with it; the full form runs it")


def _ints(text: str, flag: str, ap: argparse.ArgumentParser) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        ap.error(f"{flag}: {text!r} is not a comma-separated list of integers")
    if not out or any(x < 1 for x in out):
        ap.error(f"{flag}: give at least one size, each at least 1")
    return out


def add_flags(ap: argparse.ArgumentParser) -> None:
    """The flags that override one size of the form (module docstring)."""
    ap.add_argument("--burst-sizes", help="comma-separated burst sizes (full: 10000,45000; quick: 2000)")
    ap.add_argument("--steady-rates", help="comma-separated steady rates, fireledger and peers "
                    "(full: the ladder 250…5800; quick: 1000,3000 and 1000 for the peers and "
                    "PostgreSQL split planes)")
    ap.add_argument("--steady-confirm-s", type=int, help="full form: seconds of the confirming run (60)")
    ap.add_argument("--overload-sizes", help="tenant-overload: comma-separated N (full: 100,300,1000,3000)")
    ap.add_argument("--overload-duration-s", type=int, help="tenant-overload: seconds of fires (full 60, quick 15)")
    ap.add_argument("--commit-n", type=int, help="commit: fires per run (full 20000, quick 5000)")
    ap.add_argument("--scale-n", type=int, help="scale: live triggers (full 1000000, quick 100000)")
    ap.add_argument("--scale-out-m", type=int, help="scale-out: the backlog (full 10000, quick 3000)")


def form_of(a: argparse.Namespace, ap: argparse.ArgumentParser) -> Form:
    """The form ``--quick`` names, with the size flags applied."""
    form = QUICK if a.quick else Form()
    if a.burst_sizes:
        form = replace(form, burst_sizes=_ints(a.burst_sizes, "--burst-sizes", ap))
    if a.steady_rates:
        rates = _ints(a.steady_rates, "--steady-rates", ap)
        form = replace(form, steady_rates=rates, steady_peer_rates=rates, steady_split_rates=rates)
    if a.overload_sizes:
        form = replace(form, overload_sizes=_ints(a.overload_sizes, "--overload-sizes", ap))
    for flag, name in (("steady_confirm_s", "steady_confirm_s"), ("overload_duration_s", "overload_duration_s"),
                       ("commit_n", "commit_n"), ("scale_n", "scale_n"), ("scale_out_m", "scale_out_m")):
        value = getattr(a, flag)
        if value is not None:
            if value < 1:
                ap.error(f"--{flag.replace('_', '-')}: must be at least 1")
            if flag == "steady_confirm_s" and form.quick:
                ap.error("--steady-confirm-s: the quick form has no confirming run")
            form = replace(form, **{name: value})
    return form
