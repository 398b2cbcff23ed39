"""`make bench`: the benchmark suite — fireledger (embedded default: ``fireledger serve`` on SQLite,
durable commit + signed HTTP delivery) and its peers (APScheduler 3.11 memory / SQLite job stores,
APScheduler 4.0 alpha memory / SQLite data stores) on the same workloads, in the same run, against
the same sink (``bench/sink.py``, its own process). One JSON object per line on stdout, per
scenario and system; progress on stderr. See docs/performance.md.

    .venv/bin/python bench/run.py [--quick] [--only burst,steady,...] [--profile] [--out FILE]
    .venv/bin/python bench/report.py < FILE > docs/performance-results.md     # the tables (make bench-report)

The sizes of both forms, the flags that lower one of them and each group's total deadline are in
``bench/forms.py``; every line carries ``scenario_wall_s`` and the run ends with a ``bench-run`` line
(decisions 0214–0217). The quick form leaves APScheduler 4 SQLite out (a ``skipped`` line says why).

Scenarios (``--quick`` forms in brackets):

* ``sink-capacity``  requests/s the sink absorbs from one aiohttp client — the ceiling of every figure;
* ``burst-N``        N triggers/jobs due at one instant, N = 10,000 and 45,000 [2,000]; for
  APScheduler 3 also with its default 1 s misfire grace (``burst-N-grace1s``);
* ``steady-R``       R fires/s (R interval triggers of 1 s, spread over the second): 5 s probes at
  R = 250, 500, 1000, 2000, 3000, 4000, 5800 until one fails (p99 lateness > 1 s or fires missed),
  then 60 s at the highest R that passed (one rung lower if that fails) [10 s at 1000 and 3000;
  peers and PostgreSQL split planes 1000]; on ``fireledger serve`` (SQLite) and on PostgreSQL split
  planes (control + 2 dispatch + 1 timing, durable server: ``bench/pgsplit.py``); ``steady-max`` per
  system: the highest R sustained with p99 ≤ 1 s and nothing missed;
* ``commit-N``       the timing plane alone vs the raw batched insert+update rate, SQLite and
  PostgreSQL, N = 20,000 [5,000];
* ``scale-N``        1,000,000 [100,000] live triggers against 1,000: idle cycle cost, RSS, start-up;
* ``punctuality``    50 triggers every 1 s for 20 s [5 s]: lateness at light load;
* ``tenant-overload`` one tenant at its default quota (100 fires/s), N = 100, 300, 1,000, 3,000 triggers
  of 1 s for 60 s on SQLite ``serve``, PostgreSQL ``serve`` and PostgreSQL split planes (control + 2
  dispatch + 1 timing), against the bench sink and a standard-library ``ThreadingHTTPServer``
  (default backlog) [N = 300 on both ``serve`` forms, 10 s] (``bench/overload.py``; group ``overload``);
* ``cost``           CPU-µs per delivered fire per plane and store work per fire (statements, rows
  written, WAL bytes), priced per million fires: 1,000 fires/s for 10 s [5 s] on SQLite and
  PostgreSQL, ``serve`` and split planes (``bench/cost.py``);
* ``scale-out``      PostgreSQL split planes, control + timing + N = 1, 2, 3 dispatch processes draining a
  backlog of 10,000 [3,000] fires: delivered/s, waiting p99, CPU-µs per fire per plane (and the
  server's), transactions / rows / WAL per fire, ratios to N = 1; and ``serve`` with
  ``FIRELEDGER_DISPATCH_PROCESSES`` = 1 and 2 on SQLite and PostgreSQL (a burst of the same size)
  (``bench/scaleout.py``);
* ``profile-burst-N`` a fireledger burst under py-spy: the top frames (``--profile``);
* ``component-*``    the older micro-benchmarks: recurrence, dispatch, credentials, and the dispatch
  plane's HTTP client against aiohttp on the same requests (``sender_ab.py``, decision 0261)
  (``--only components``).

Lines of one scenario are printed together once every system has run, with ratios: fireledger's
line carries ``vs_peers`` (fireledger ÷ peer) and each peer's ``vs_fireledger`` (peer ÷ fireledger)
for ``fires_per_s`` and ``lateness_p99_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import BENCH, Deadline, Sink, cpu_s, emit, machine, ratios, say, tee, timed, walled
from forms import QUICK_SKIP, STEADY_TARGET, Form, add_flags, form_of

ALL = ("sink", "burst", "steady", "commit", "scale", "punctuality", "overload", "cost", "scale-out", "profile",
       "components")
DEFAULT_OFF = {"profile", "components"}   # opt in: --profile, --only components
STEADY_P99_S = 1.0
RESULTS = BENCH / "results" / "latest.jsonl"


def sink_capacity(sink: Sink, quick: bool, n: int) -> dict[str, Any]:
    sink.clear()
    say(f"sink-capacity: {n} POSTs from one aiohttp client (64 connections, 64 in flight)")
    cpu0 = cpu_s(sink.proc.pid)
    out = subprocess.run([sys.executable, str(BENCH / "sinkload.py"), "--url", sink.url, "--n", str(n)],
                         capture_output=True, text=True, check=True)
    sink_cpu_us = (cpu_s(sink.proc.pid) - cpu0) / n * 1e6
    client = json.loads(out.stdout)
    got = sink.count()
    return {"scenario": "sink-capacity", "system": "bench-sink", "durable": False, "n": n, "delivered": got,
            "missed": n - got, "early": 0, "duplicate_records": 0, "fires_per_s": round(client["per_s"], 1),
            "lateness_p50_s": round(client["rtt_p50_s"], 4), "lateness_p99_s": round(client["rtt_p99_s"], 4),
            "lateness_max_s": round(client["rtt_max_s"], 4),
            "sink_cpu_us_per_request": round(sink_cpu_us, 1),
            "sink_ceiling_per_s_one_core": round(1e6 / sink_cpu_us) if sink_cpu_us > 0 else None,
            "note": "fires_per_s = requests/s absorbed from one client process (the client is the limit "
                    "when sink_ceiling_per_s_one_core is far above it); lateness_* = the client's round trip",
            **machine()}


def _bad(line: dict[str, Any], p99: float | None = None) -> bool:
    """A run that does not count as sustained/valid."""
    if line.get("skipped") or line.get("error") or line.get("invalid") or line.get("timed_out"):
        return True
    if p99 is not None:
        n = line.get("n") or 0
        return (line.get("lateness_p99_s") is None or line["lateness_p99_s"] > p99
                or (line.get("missed") or 0) > 0.001 * n)
    return False


def _bounded(line: dict[str, Any], deadline_s: float) -> dict[str, Any]:
    """Mark a burst that was cut at its deadline: ``timed_out`` (the figures are those of the
    deliveries that arrived before it)."""
    if line.get("complete") is False and not line.get("error") and not line.get("skipped"):
        line["timed_out"] = f"not every fire delivered within the {deadline_s:.0f} s deadline; stopped there"
    return line


def burst(sink: Sink, tmp: Path, form: Form, systems: set[str] | None, dl: Deadline) -> None:
    import fl
    import peers

    for n in form.burst_sizes:
        name = f"burst-{n}"
        deadline = form.burst_deadline_s(n)
        lines = []
        if systems is None or fl.SYSTEM in systems:
            lines.append(dl.line(name, fl.SYSTEM, n) if dl.over() else
                         _bounded(timed(fl.burst, sink, tmp, name, n, deadline_s=deadline), deadline))
        for peer in peers.PEERS:
            if systems is not None and peer.system not in systems:
                continue
            if peer.system in form.skip_peers:
                lines.append(peers.skipped(name, peer, QUICK_SKIP, n))
                continue
            est = n * peer.setup_s_per_job
            if est > form.peer_setup_cap_s:
                lines.append(peers.skipped(name, peer, f"adding {n} schedules alone would take ~{est:.0f}s "
                                           f"({peer.setup_s_per_job * 1000:.1f} ms each, measured); "
                                           "see the smaller burst", n))
                continue
            lines.append(dl.line(name, peer.system, n) if dl.over() else
                         _bounded(timed(peers.burst, peer, sink, tmp, name, n, deadline_s=deadline), deadline))
        ratios(lines)
        for line in lines:
            emit(line)
        if n == form.burst_sizes[0]:   # APScheduler's default misfire grace (1 s) on the first size
            for peer in peers.PEERS:
                if peer.runner != "peer_aps3.py" or (systems is not None and peer.system not in systems):
                    continue
                if dl.over():
                    emit(dl.line(f"{name}-grace1s", peer.system, n))
                    continue
                g = timed(peers.burst, peer, sink, tmp, f"{name}-grace1s", n, deadline_s=deadline, grace="1")
                outc = g.get("scheduler_outcomes") or {}
                g["missed_ratio"] = round((g["missed"] or 0) / n, 4) if g.get("missed") is not None else None
                g["scheduler_missed"] = outc.get("missed")
                emit(g)


def _steady_runners(sink: Sink, tmp: Path, form: Form,
                    systems: set[str] | None) -> list[tuple[str, Any, tuple[int, ...]]]:
    import fl
    import peers
    import pgsplit

    runners: list[tuple[str, Any, tuple[int, ...]]] = []
    if systems is None or fl.SYSTEM in systems:
        runners.append((fl.SYSTEM, lambda name, r, d, dr: fl.steady(sink, tmp, name, r, d, drain_s=dr),
                        form.steady_rates))
    if systems is None or pgsplit.SYSTEM in systems:   # its PostgreSQL server: stopped by steady()
        runners.append((pgsplit.SYSTEM, pgsplit.Steady(sink, tmp), form.steady_split_rates))
    for peer in peers.PEERS:
        if systems is None or peer.system in systems:
            run: Any = (lambda name, r, d, dr, p=peer: {**peers.skipped(name, p, QUICK_SKIP, r * d), "rate": r,
                                                        "duration_s": d}) \
                if peer.system in form.skip_peers else \
                (lambda name, r, d, dr, p=peer: peers.steady(p, sink, tmp, name, r, d, drain_s=dr))
            runners.append((peer.system, run, form.steady_peer_rates))
    return runners


def steady(sink: Sink, tmp: Path, form: Form, systems: set[str] | None, dl: Deadline) -> None:
    """Quick: 10 s at 1000 and 3000 fires/s (peers and PostgreSQL split planes: 1000). Full: 5 s probes
    up the ladder until one fails (p99 > 1 s or fires missed), then 60 s at the highest rate that
    passed its probe, and one rung lower if that fails. Each runner's ``close`` (a PostgreSQL server)
    runs at the end."""
    runners = _steady_runners(sink, tmp, form, systems)
    try:
        _steady_ladders(runners, form, dl)
    finally:
        for _, run, _ in runners:
            getattr(run, "close", lambda: None)()


def _steady_ladders(runners: list[tuple[str, Any, tuple[int, ...]]], form: Form, dl: Deadline) -> None:
    """Each runner's ladder (:func:`steady`), then the lines by (rate, duration) and each ``steady-max``."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    final: dict[str, dict[str, Any] | None] = {}
    tried: dict[str, list[dict[str, Any]]] = {}

    def one(system: str, run: Any, rate: int, duration: int, phase: str) -> dict[str, Any]:
        name = f"steady-{rate}"
        if dl.over():
            line = dl.line(name, system, rate * duration, rate=rate, duration_s=duration)
        else:
            line = timed(run, name, rate, duration, 3 if duration <= 10 else 10)
        line.update({"phase": phase, "p99_target_s": STEADY_P99_S})
        line["sustained"] = not _bad(line, STEADY_P99_S)
        groups.setdefault((rate, duration), []).append(line)
        tried.setdefault(system, []).append(line)
        return line

    for system, run, rates in runners:
        passed: list[dict[str, Any]] = []
        for rate in rates:
            line = one(system, run, rate, form.steady_probe_s, "run" if form.quick else "probe")
            if not line["sustained"]:
                break   # a higher rate would only be worse
            passed.append(line)
        final[system] = passed[-1] if form.steady_confirm_s is None and passed else None
        if form.steady_confirm_s is not None:
            for cand in passed[::-1][:2]:   # the best probe; if the confirming run fails there, one rung lower
                conf = one(system, run, cand["rate"], form.steady_confirm_s, "confirm")
                if conf["sustained"]:
                    final[system] = conf
                    break
    for key in sorted(groups):
        ratios(groups[key])
        for line in groups[key]:
            emit(line)
    for system, _, _ in runners:
        emit(_steady_max(system, final.get(system), tried.get(system, [])))


def _steady_max(system: str, top: dict[str, Any] | None, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system: the highest rate sustained (only a confirming run of 60 s counts for the target)."""
    base = top or (lines[-1] if lines else {"system": system})
    out = {k: base.get(k) for k in ("n", "delivered", "missed", "early", "duplicate_records", "fires_per_s",
                                     "lateness_p50_s", "lateness_p99_s", "lateness_max_s", "durable",
                                     "duration_s")}
    return {"scenario": "steady-max", "system": system, **out, "max_rate": top["rate"] if top else 0,
            "max_rate_over_s": top["duration_s"] if top else None,
            "runs": [[x.get("rate"), x.get("duration_s"), x["sustained"]] for x in lines],
            "target_rate": STEADY_TARGET,
            "target_met": bool(top and top["rate"] >= STEADY_TARGET and top["duration_s"] >= 60),
            "scenario_wall_s": round(sum(x.get("scenario_wall_s") or 0 for x in lines), 1), **machine()}


def punctuality(sink: Sink, tmp: Path, form: Form, systems: set[str] | None, dl: Deadline) -> None:
    import fl
    import peers

    rate, duration = 50, form.punctuality_s
    name = "punctuality"
    lines = []
    if systems is None or fl.SYSTEM in systems:
        lines.append(timed(fl.steady, sink, tmp, name, rate, duration, drain_s=3))
    if form.punctuality_peers:
        for peer in peers.PEERS:
            if systems is None or peer.system in systems:
                lines.append(dl.line(name, peer.system, rate * duration) if dl.over() else
                             timed(peers.steady, peer, sink, tmp, name, rate, duration, drain_s=3))
    ratios(lines)
    for line in lines:
        line["p99_target_s"] = 0.05
        if line["system"] == fl.SYSTEM:
            line["target_met"] = not _bad(line) and line["lateness_p99_s"] is not None \
                and line["lateness_p99_s"] <= 0.05
        emit(line)


def profile(sink: Sink, tmp: Path, quick: bool) -> None:
    import fl

    n = 2000 if quick else 10_000
    line = timed(fl.burst, sink, tmp, f"profile-burst-{n}", n, deadline_s=60 if quick else 180, profile=True)
    line["note"] = "under py-spy (250 Hz): slower than the unprofiled burst; read the frames, not the rates"
    emit(line)


def components(quick: bool) -> None:
    keys = {"n": None, "delivered": None, "missed": None, "early": None, "duplicate_records": None,
            "fires_per_s": None, "lateness_p50_s": None, "lateness_p99_s": None, "lateness_max_s": None}
    for script, args in (("recurrence.py", ["--quick"] if quick else []), ("dispatch.py", []),
                         ("credentials.py", []),
                         ("sender_ab.py", ["--n", "5000", "--rounds", "2"] if quick else [])):
        if not (BENCH / script).exists():
            continue
        say(f"component: {script}")
        proc = subprocess.run([sys.executable, str(BENCH / script), *args], stdout=subprocess.PIPE, text=True)
        for raw in proc.stdout.splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            obj.setdefault("scenario", f"component-{script.removesuffix('.py')}")
            obj.setdefault("system", "fireledger-sqlite")
            for k, v in keys.items():
                obj.setdefault(k, v)
            emit(obj)


def _cost(ap: argparse.ArgumentParser, a: argparse.Namespace, tmp: Path, sink: Sink) -> Any:
    """The ``cost`` lines, with ``--cost-topologies`` and ``--cost-rate``."""
    import cost

    topos = tuple(a.cost_topologies.split(",")) if a.cost_topologies else None
    if topos is not None and set(topos) - set(cost.TOPOLOGIES):
        ap.error(f"--cost-topologies: choose from {', '.join(cost.TOPOLOGIES)}")
    return cost.scenario(tmp, a.quick, topologies=topos, sink=sink, rate=a.cost_rate or cost.RATE)


def _parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short forms (under 5 minutes on a quiet machine)")
    ap.add_argument("--only", help=f"comma-separated scenario groups: {', '.join(ALL)}")
    ap.add_argument("--systems", help="comma-separated systems (fireledger-sqlite, apscheduler3-memory, …)")
    ap.add_argument("--profile", action="store_true", help="also profile a fireledger burst with py-spy")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"also write the JSON lines to this file (make bench: {RESULTS.relative_to(BENCH.parent)})")
    add_flags(ap)
    ap.add_argument("--overload-topologies",
                    help="tenant-overload: comma-separated sqlite-serve,postgres-serve,postgres-split "
                         "(default: all; --quick: the two serve forms)")
    ap.add_argument("--cost-topologies", help="cost: comma-separated sqlite-serve,sqlite-split,postgres-serve,"
                    "postgres-split (default: all)")
    ap.add_argument("--cost-rate", type=int, default=None, help="cost: fires/s (default 1000)")
    ap.add_argument("--dispatch-processes", type=int, default=None,
                    help="fireledger serve dispatches from N processes (FIRELEDGER_DISPATCH_PROCESSES; "
                         "default: the service's, min(usable cores, 2))")
    return ap


def _groups(ap: argparse.ArgumentParser, a: argparse.Namespace) -> set[str]:
    only = set(a.only.split(",")) if a.only else set(ALL)
    unknown = only - set(ALL)
    if unknown:
        ap.error(f"--only: unknown scenario group {sorted(unknown)[0]!r} (choose from {', '.join(ALL)})")
    if not a.only:
        only -= DEFAULT_OFF
    if a.profile:
        only.add("profile")
    return only


def _run_group(group: str, ctx: dict[str, Any]) -> None:
    """One scenario group under its deadline (``forms.Form.deadlines``)."""
    import fl

    form: Form = ctx["form"]
    sink, tmp, systems = ctx["sink"], ctx["tmp"], ctx["systems"]
    dl = Deadline(group, form.deadlines[group])
    ours = systems is None or fl.SYSTEM in systems
    if group == "sink":
        emit(timed(sink_capacity, sink, form.quick, form.sink_n))
    elif group == "burst":
        burst(sink, tmp, form, systems, dl)
    elif group == "steady":
        steady(sink, tmp, form, systems, dl)
    elif group == "punctuality":
        punctuality(sink, tmp, form, systems, dl)
    elif group == "profile":
        profile(sink, tmp, form.quick)
    elif group == "components":
        components(form.quick)
    elif ours:
        for line in dl.cap(walled(_lines(group, ctx)), group, fl.SYSTEM):
            emit(line)


def _one_pass(scenario: Any, *args: Any) -> Any:
    """The lines of a scenario that measures in one pass and returns them together: each carries the
    pass's wall time (``scenario_wall_s``; decision 0217)."""
    t0 = time.monotonic()
    lines = scenario(*args)
    wall = round(time.monotonic() - t0, 1)
    for line in lines:
        line.setdefault("scenario_wall_s", wall)
        yield line


def _lines(group: str, ctx: dict[str, Any]) -> Any:
    """The lines of a group whose scenario module yields one line per run."""
    form: Form = ctx["form"]
    tmp = ctx["tmp"]
    if group == "commit":
        import commit

        return _one_pass(commit.scenario, tmp, form.commit_n, form.commit_rounds)
    if group == "scale":
        import scale

        return _one_pass(scale.scenario, tmp, form.scale_n)
    if group == "overload":
        import overload

        return overload.scenario(tmp, form.quick, sizes=list(form.overload_sizes), topologies=ctx["topos"],
                                 duration_s=form.overload_duration_s)
    if group == "cost":
        return _cost(ctx["parser"], ctx["args"], tmp, ctx["sink"])
    import scaleout

    return scaleout.scenario(tmp, form.quick, sink=ctx["sink"], dispatchers=form.scale_out_dispatchers,
                             serve=scaleout.SERVE_TOPOLOGIES if form.scale_out_serve else (), m=form.scale_out_m)


def _commit() -> str | None:
    """The tree the run measured: ``git describe``-style short commit, ``+dirty`` when changed."""
    try:
        head = subprocess.run(["git", "-C", str(BENCH), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(BENCH), "status", "--porcelain", "--", "../src", "."],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def main() -> int:
    ap = _parser()
    a = ap.parse_args()
    from e2e import use_state_dir  # one state directory (KEK, key ring) for the run, not the checkout's

    use_state_dir(Path(tempfile.mkdtemp(prefix="fireledger-bench-state-")) / "state")
    if a.dispatch_processes is not None:
        os.environ["FIRELEDGER_DISPATCH_PROCESSES"] = str(a.dispatch_processes)   # before `fl` is imported
    only = _groups(ap, a)
    form = form_of(a, ap)
    systems = set(a.systems.split(",")) if a.systems else None
    import fl
    import overload
    import peers
    import pgsplit

    known = {fl.SYSTEM, pgsplit.SYSTEM, *(p.system for p in peers.PEERS)}
    if systems is not None and systems - known:
        ap.error(f"--systems: unknown system {sorted(systems - known)[0]!r} (choose from {', '.join(sorted(known))})")
    topos = tuple(a.overload_topologies.split(",")) if a.overload_topologies else None
    if topos is not None and set(topos) - set(overload.TOPOLOGIES):
        ap.error(f"--overload-topologies: choose from {', '.join(overload.TOPOLOGIES)}")
    tee(a.out)
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    walls: dict[str, float] = {}
    order = [g for g in ALL if g in only]
    say(f"start: {'quick' if form.quick else 'full'} run of {', '.join(order)}")
    with tempfile.TemporaryDirectory(prefix="fireledger-bench-") as d:
        ctx = {"form": form, "tmp": Path(d), "systems": systems, "args": a, "parser": ap, "topos": topos}
        ctx["sink"] = sink = Sink(Path(d))
        try:
            for group in order:
                g0 = time.monotonic()
                try:
                    _run_group(group, ctx)
                except Exception as exc:   # one broken group must not stop the run (decision 0215)
                    say(f"{group}: failed: {type(exc).__name__}: {exc}")
                    emit({"scenario": group, "system": "bench", "n": None, "delivered": None,
                          "error": f"the group failed: {type(exc).__name__}: {exc}"[:500],
                          "traceback": traceback.format_exc()[-2000:], **machine()})
                walls[group] = round(time.monotonic() - g0, 1)
                say(f"{group}: {walls[group]:.0f}s")
        finally:
            sink.close()
    total = round(time.monotonic() - t0, 1)
    emit({"scenario": "bench-run", "system": "bench", "form": "quick" if form.quick else "full",
          "groups": order, "group_wall_s": walls, "scenario_wall_s": total, "argv": sys.argv[1:],
          "started_utc": started, "finished_utc": time.strftime("%H:%M", time.gmtime()), "commit": _commit(),
          **machine()})
    say(f"done in {total:.0f}s")
    tee(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
