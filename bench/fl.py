"""fireledger as a system under test: the embedded default, ``fireledger serve --db sqlite:///…`` in its
own process (every plane in one process, as a user runs it), delivering over real signed HTTP to the
shared sink.

The bench process creates a fresh store with a tenant (its quota out of the way) and one verified
HTTP target pointing at the sink, starts ``serve`` and waits for ``/healthz``, then bulk-loads the
triggers into the running service's store (``bench/load.py``; the due rows are picked up within the
timing loop's 0.5 s re-read) with the first instant a little after the load ends. While it waits for
the deliveries it polls the ledger's fire count (every 0.2 s: ``committed_all_s`` is when the last
fire of the window was committed, ±0.2 s). Afterwards it reads the ledger.

Durability: SQLite in WAL mode with ``synchronous=NORMAL`` (the store's setting): a committed fire
survives a process crash (``kill -9``); the last commits before an OS crash or power loss may not.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchkit import SECRET, S, Sink, machine, pct, rnd, say, summarise, wait_until
from fireledger.domain.keys import from_us
from fireledger.recurrence import format_instant
from fireledger.settings import parse_dispatch_processes
from fireledger.store import Store
from load import compiled, load_triggers, tenant_and_target

#: `serve` dispatches from this many processes: the service's own default (min(usable cores, 2), decision
#: 0239) unless FIRELEDGER_DISPATCH_PROCESSES is set (passed through to the serve process). The bench never
#: pins it, so `make bench` measures what a user gets; each line records the count, and a count set
#: explicitly shows in the system name.
DISPATCH_PROCESSES = parse_dispatch_processes(os.environ)
SYSTEM = "fireledger-sqlite" + (f"-{DISPATCH_PROCESSES}dispatch" if os.environ.get("FIRELEDGER_DISPATCH_PROCESSES")
                                else "")
LOAD_S_PER_TRIGGER = 0.0001   # bulk clone cost per trigger (measured ~30 µs), for the lead time


class Serve:
    """A fresh store with the bench tenant and target, and ``fireledger serve`` running on it."""

    def __init__(self, db: Path, tmp: Path, sink: Sink) -> None:
        from e2e import Service

        self.db = db
        self.url = f"sqlite:///{db}"
        now = time.time_ns() // 1000
        store = Store.open(self.url)
        try:
            self.tenant, self.target = tenant_and_target(store, sink.url, SECRET, now)
        finally:
            store.close()
        self.svc = Service(self.url, tmp, command="serve",
                           env={"FIRELEDGER_KEYRING": str(tmp / f"{db.stem}-keys.json"),
                                "FIRELEDGER_LOG_LEVEL": "warning"})
        t0 = time.monotonic()
        self.svc.start(timeout_s=90)
        self.start_s = time.monotonic() - t0

    @property
    def pid(self) -> int:
        assert self.svc.proc is not None
        return self.svc.proc.pid

    def load(self, specs: Iterable[dict[str, Any]]) -> dict[str, Any]:
        now = time.time_ns() // 1000
        store = Store.open(self.url)
        try:
            return load_triggers(store, self.tenant, self.target, compiled(specs, now), now)
        finally:
            store.close()

    def stop(self) -> None:
        self.svc.stop()


def ledger_facts(db: Path | str, window: tuple[int, int]) -> dict[str, Any]:
    """The ledger's records, states, attempts and lateness split of the fires scheduled in ``window``;
    ``db``: a SQLite file, or a store URL (PostgreSQL: ``bench/pgsplit.py``)."""
    store = Store.open(db if isinstance(db, str) else f"sqlite:///{db}")
    where = "scheduled_us >= ? AND scheduled_us < ?" if store.engine_name == "sqlite" else \
        "scheduled_us >= %s AND scheduled_us < %s"
    try:
        with store.engine.read() as c:
            row = c.execute(
                "SELECT COUNT(*), COUNT(DISTINCT trigger_id || ':' || scheduled_us), MIN(decided_us), "
                f"MAX(decided_us) FROM fires WHERE {where}", window).fetchone()
            states = dict(c.execute(f"SELECT state, COUNT(*) FROM fires WHERE {where} GROUP BY state",
                                    window).fetchall())
            attempts = c.execute(f"SELECT COUNT(*) FROM attempts WHERE {where}", window).fetchone()[0]
            gaps = c.execute("SELECT decided_us - scheduled_us, dispatched_us - scheduled_us FROM fires "
                             f"WHERE {where}", window).fetchall()
    finally:
        store.close()
    decided = [g[0] / S for g in gaps]
    dispatched = [g[1] / S for g in gaps if g[1] is not None]
    return {"records": int(row[0]), "distinct": int(row[1]), "first_decided_us": row[2], "last_decided_us": row[3],
            "states": {str(k): int(v) for k, v in states.items()}, "attempts": int(attempts),
            # Where the lateness is spent: the clock bound at the claim (decided_us is the interval's
            # earliest bound when claimed), then the dispatcher's claim of the committed fire.
            "ledger_lateness_s": {"decided_p50": rnd(pct(decided, 50)), "decided_p99": rnd(pct(decided, 99)),
                                  "dispatched_first": rnd(min(dispatched)) if dispatched else None,
                                  "dispatched_p50": rnd(pct(dispatched, 50)),
                                  "dispatched_p99": rnd(pct(dispatched, 99))}}


def _frame(raw: str) -> tuple[str, str]:
    """(short name, source path) of one py-spy frame ``function (path:line)``."""
    func, _, rest = raw.partition(" (")
    path = rest.rsplit(":", 1)[0] if rest else ""
    parts = path.split("/")
    short = "/".join(parts[parts.index("fireledger") + 1:]) if "fireledger" in parts[:-1] else parts[-1]
    return f"{func} ({short})", path


def profile_top(raw: Path, top: int = 12) -> dict[str, Any]:
    """Top frames of a py-spy ``--format raw`` profile (collapsed stacks): ``self`` — the share of
    samples in which a function was running; ``inclusive`` — the share in which a fireledger
    function was on the stack (entry points ``cli``/``service`` left out)."""
    self_c: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        k = int(count)
        total += k
        frames = [_frame(f) for f in stack.split(";")]
        self_c[frames[-1][0]] = self_c.get(frames[-1][0], 0) + k
        for name in {n for n, path in frames if "fireledger" in path.split("/")[:-1]   # py-spy shortens paths
                     and not path.endswith(("fireledger/cli/__init__.py", "fireledger/cli/run.py",
                                                "fireledger/service.py"))}:
            incl[name] = incl.get(name, 0) + k
    if not total:
        return {"samples": 0}

    def best(d: dict[str, int]) -> list[list[Any]]:
        return [[name, round(v / total, 3)] for name, v in sorted(d.items(), key=lambda x: -x[1])[:top]]

    return {"samples": total, "self": best(self_c), "inclusive": best(incl)}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (threads included:
    ``serve`` with ``FIRELEDGER_DISPATCH_PROCESSES`` > 1 dispatches from child processes), from /proc."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue   # ended meanwhile
    return total


def watch_window(url: str, pids: list[int], sink: Sink, n: int, window: tuple[int, int],
                 until_us: int) -> tuple[list[int], float]:
    """Wait for ``n`` deliveries at the sink (or ``until_us``), polling the ledger's count of the
    window's fires every 0.2 s. Returns ([when the last fire of the window was seen committed, ±0.2 s]
    or [], the CPU seconds ``pids`` and their children used over the wait)."""
    reader = Store.open(url)
    mark = "?" if reader.engine_name == "sqlite" else "%s"
    sql = f"SELECT COUNT(*) FROM fires WHERE scheduled_us >= {mark} AND scheduled_us < {mark}"
    committed_at: list[int] = []
    cpu0 = sum(_cpu_s(pid) for pid in pids)

    def done() -> bool:
        if not committed_at:
            with reader.engine.read() as c:
                if c.execute(sql, window).fetchone()[0] >= n:
                    committed_at.append(time.time_ns() // 1000)
        return sink.count() >= n or time.time_ns() // 1000 > until_us

    try:
        wait_until(done, (until_us - time.time_ns() // 1000) / S + 30, interval_s=0.2, what="deliveries")
    except TimeoutError:
        pass
    finally:
        reader.close()
    return committed_at, sum(_cpu_s(pid) for pid in pids) - cpu0


def _wait(serve: Serve, tmp: Path, sink: Sink, *, n: int, t0_us: int, window: tuple[int, int], until_us: int,
          loaded_us: int, profile: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for ``n`` deliveries (or ``until_us``), stop ``serve``, read the sink and the ledger."""
    prof = None
    spy = None
    try:
        if profile:
            raw = tmp / f"{serve.db.stem}.pyspy"
            exe = Path(sys.executable).parent / "py-spy"
            spy = subprocess.Popen([str(exe) if exe.exists() else "py-spy", "record", "--pid", str(serve.pid),
                                    "--format", "raw", "--output", str(raw), "--rate", "250", "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        committed_at, cpu = watch_window(serve.url, [serve.pid], sink, n, window, until_us)
        complete = sink.count() >= n
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
            prof = profile_top(raw) if raw.exists() else {"error": "py-spy wrote no profile"}
    finally:
        serve.stop()
    facts = ledger_facts(serve.db, window)
    facts["complete"] = complete
    facts["committed_all_s"] = round((committed_at[0] - t0_us) / S, 2) if committed_at else None
    facts["margin_s"] = round((t0_us - loaded_us) / S, 3)
    facts["profile"] = prof
    # CPU of the serve process (user + system) from just before the instant to the last delivery:
    # on a loaded machine a steadier figure than wall-clock throughput.
    facts["serve_cpu_us_per_fire"] = round(cpu * S / max(1, sink.count()), 1)
    summary = summarise(sink.records(), n, t0_us=t0_us, window=window)
    return summary, facts


def _line(scenario: str, summary: dict[str, Any], facts: dict[str, Any], t0_us: int,
          extra: dict[str, Any]) -> dict[str, Any]:
    line = {"scenario": scenario, "system": SYSTEM, "durable": True, **summary,
            "duplicate_records": facts["records"] - facts["distinct"],
            "ledger_records": facts["records"], "committed_all_s": facts["committed_all_s"],
            "states": facts["states"], "attempts": facts["attempts"], "complete": facts["complete"],
            "ledger_lateness_s": facts["ledger_lateness_s"],
            "serve_cpu_us_per_fire": facts.get("serve_cpu_us_per_fire"),
            "setup_margin_s": facts["margin_s"], "dispatch_processes": DISPATCH_PROCESSES, **extra, **machine()}
    if facts["margin_s"] < 0:
        line["invalid"] = "setup overran the first instant"
    if facts.get("profile"):
        line["profile"] = facts["profile"]
    return line


def burst(sink: Sink, tmp: Path, scenario: str, n: int, *, deadline_s: float, profile: bool = False) -> dict[str, Any]:
    """``n`` one-shot triggers due at one instant."""
    sink.clear()
    serve = Serve(tmp / f"fl-{scenario}.db", tmp, sink)
    try:
        now = time.time_ns() // 1000
        at = (now // S + math.ceil(2 + n * LOAD_S_PER_TRIGGER * 3)) * S
        spec = {"at": format_instant(from_us(at))}
        info = serve.load(spec for _ in range(n))
    except BaseException:
        serve.stop()
        raise
    loaded = time.time_ns() // 1000
    say(f"{SYSTEM} {scenario}: serve up in {serve.start_s:.1f}s, {info['triggers']} triggers loaded in "
        f"{info['load_s']:.1f}s; the instant in {(at - loaded) / S:.1f}s")
    summary, facts = _wait(serve, tmp, sink, n=n, t0_us=at, window=(at, at + 1), until_us=at + int(deadline_s * S),
                           loaded_us=loaded, profile=profile)
    return _line(scenario, summary, facts, at, {"deadline_s": deadline_s, "sink": sink.stats()})


def steady(sink: Sink, tmp: Path, scenario: str, rate: int, duration_s: int, *, drain_s: float = 10,
           profile: bool = False) -> dict[str, Any]:
    """``rate`` interval triggers of 1 s, anchored evenly over the second: ``rate`` fires every second
    for ``duration_s`` seconds (``not_after`` closes the window)."""
    sink.clear()
    serve = Serve(tmp / f"fl-{scenario}.db", tmp, sink)
    try:
        now = time.time_ns() // 1000
        base = (now // S + math.ceil(2 + rate * LOAD_S_PER_TRIGGER * 3)) * S
        end = base + duration_s * S
        not_after = format_instant(from_us(end - 1))
        info = serve.load({"every": "1s", "anchor": format_instant(from_us(base + i * S // rate)),
                           "not_after": not_after} for i in range(rate))
    except BaseException:
        serve.stop()
        raise
    loaded = time.time_ns() // 1000
    say(f"{SYSTEM} {scenario}: serve up in {serve.start_s:.1f}s, {info['triggers']} triggers loaded in "
        f"{info['load_s']:.1f}s; first instant in {(base - loaded) / S:.1f}s, {duration_s}s of fires")
    n = rate * duration_s
    summary, facts = _wait(serve, tmp, sink, n=n, t0_us=base, window=(base, end), until_us=end + int(drain_s * S),
                           loaded_us=loaded, profile=profile)
    return _line(scenario, summary, facts, base, {"rate": rate, "duration_s": duration_s, "sink": sink.stats()})
