"""Shared pieces of the benchmark suite: the sink process, result lines, percentiles, summaries, and
the fireledger processes of a topology with their stores (``Planes``, ``Stores``, ``load_stream``).

Every scenario prints one JSON object per system on stdout (``emit``); progress goes to stderr
(``say``). Lateness is always *arrival at the shared sink* minus *scheduled instant*, both read from
this machine's clock (the sink stamps ``time.time_ns()`` on arrival).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for p in (ROOT / "src", ROOT / "tests", BENCH):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
S = 1_000_000
_T0 = time.monotonic()


def say(msg: str) -> None:
    """Progress on stderr (stdout carries only JSON lines)."""
    sys.stderr.write(f"[bench {time.monotonic() - _T0:7.1f}s] {msg}\n")
    sys.stderr.flush()


_TEE: Any = None


def tee(path: Path | None) -> None:
    """Also write every emitted line to ``path`` (truncated first; flushed per line, so a run that
    stops half-way leaves the lines it produced): ``bench/run.py --out``."""
    global _TEE
    if _TEE is not None:
        _TEE.close()
        _TEE = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _TEE = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the next tee(None)


def emit(obj: dict[str, Any]) -> None:
    """One result line on stdout (and in the ``tee`` file)."""
    text = json.dumps(obj, separators=(", ", ": ")) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    if _TEE is not None:
        _TEE.write(text)
        _TEE.flush()


def timed(run: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``run(*args, **kwargs)``'s line with ``scenario_wall_s``: the wall seconds the run took, its
    set-up and teardown included (what the run costs the bench, not what it measures)."""
    t0 = time.monotonic()
    line = run(*args, **kwargs)
    line.setdefault("scenario_wall_s", round(time.monotonic() - t0, 1))
    return line


def walled(lines: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """``lines`` (a generator yielding one line per run as it ends), each with ``scenario_wall_s`` =
    the wall seconds since the previous line (unless the scenario set its own)."""
    t0 = time.monotonic()
    for line in lines:
        now = time.monotonic()
        line.setdefault("scenario_wall_s", round(now - t0, 1))
        t0 = now
        yield line


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of ``values`` (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


def rnd(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


def wait_until(pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)   # polling with a deadline


def http_json(url: str, timeout_s: float = 120) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "load1": round(os.getloadavg()[0], 2)}


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, KiB (Linux /proc)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the sink --------------------------------------------------------------------------------------


class Sink:
    """``bench/sink.py`` in its own process."""

    def __init__(self, tmp: Path, secret: str | None = SECRET, sample_every: int = 100) -> None:
        port_file = tmp / "sink.port"
        cmd = [sys.executable, str(BENCH / "sink.py"), "--port", "0", "--port-file", str(port_file),
               "--sample-every", str(sample_every)]
        if secret:
            cmd += ["--secret", secret]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        wait_until(lambda: port_file.exists() or self.proc.poll() is not None, 20, what="the sink to listen")
        if self.proc.poll() is not None:
            raise RuntimeError("the sink did not start")
        self.base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        self.url = f"{self.base}/hook"

    def count(self) -> int:
        return int(http_json(f"{self.base}/_admin/count")["count"])

    def records(self, since: int = 0) -> list[tuple[int, str]]:
        return [(int(ns), ident) for ns, ident in http_json(f"{self.base}/_admin/records?since={since}")["records"]]

    def stats(self) -> dict[str, Any]:
        return http_json(f"{self.base}/_admin/stats")  # type: ignore[no-any-return]

    def clear(self) -> None:
        http_json(f"{self.base}/_admin/clear")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- identities and summaries ---------------------------------------------------------------------


def identify(ident: str) -> tuple[str, int] | None:
    """(identity, scheduled µs) of one sink record: a fireledger fire key, or a peer's JSON body."""
    if ident.startswith("{"):
        try:
            body = json.loads(ident)
            return f"{body['id']}@{body['s']}", int(body["s"])
        except (ValueError, KeyError, TypeError):
            return None
    from fireledger.domain.keys import FireKey

    try:
        return ident, FireKey.parse(ident).scheduled_us
    except ValueError:
        return None


def summarise(records: Iterable[tuple[int, str]], n: int, *, t0_us: int,
              window: tuple[int, int] | None = None) -> dict[str, Any]:
    """The DESIGN §4 keys from sink records. ``n`` fires were expected (with scheduled instants in
    ``window`` = [lo, hi) µs when given; records outside it are ignored). ``fires_per_s`` is
    deliveries per second from ``t0_us`` (the burst instant / the start of the steady window) to the
    last first arrival. Lateness is taken at each fire's first arrival."""
    first: dict[str, tuple[int, int]] = {}
    total = 0
    unknown = 0
    for ns, raw in records:
        got = identify(raw)
        if got is None:
            unknown += 1
            continue
        key, sched = got
        if window is not None and not window[0] <= sched < window[1]:
            continue
        total += 1
        arr_us = ns // 1000
        prev = first.get(key)
        if prev is None or arr_us < prev[0]:
            first[key] = (arr_us, sched)
    lat = [(a - s) / S for a, s in first.values()]
    last = max((a for a, _ in first.values()), default=None)
    delivered = len(first)
    return {
        "n": n,
        "delivered": delivered,
        "missed": max(0, n - delivered),
        "early": sum(1 for x in lat if x < 0),
        "duplicate_deliveries": total - delivered,
        "fires_per_s": rnd(delivered / max(1e-6, (last - t0_us) / S), 1) if last is not None else 0.0,
        "lateness_p50_s": rnd(pct(lat, 50)),
        "lateness_p99_s": rnd(pct(lat, 99)),
        "lateness_max_s": rnd(max(lat, default=None)),
        "unparsed_records": unknown,
    }


def ratios(lines: list[dict[str, Any]], ours: str = "fireledger") -> None:
    """Add ``vs_fireledger`` to each peer line (peer ÷ fireledger) and ``vs_peers`` to fireledger's
    (fireledger ÷ peer) for fires/s and p99 lateness. Fireledger's first line is ``mine``; its other
    forms (``fireledger-postgres-split``) are not peers and get no ratio."""
    mine = next((x for x in lines if x["system"].startswith(ours)), None)
    if mine is None:
        return

    def ratio(a: float | None, b: float | None) -> float | None:
        if a is None or b is None or b == 0:
            return None
        return round(a / b, 3)

    vs = {}
    for x in lines:
        if x is mine or x["system"].startswith(ours):
            continue
        vs[x["system"]] = {"fires_per_s": ratio(mine["fires_per_s"], x["fires_per_s"]),
                           "lateness_p99_s": ratio(mine["lateness_p99_s"], x["lateness_p99_s"])}
        x["vs_fireledger"] = {"fires_per_s": ratio(x["fires_per_s"], mine["fires_per_s"]),
                              "lateness_p99_s": ratio(x["lateness_p99_s"], mine["lateness_p99_s"])}
    mine["vs_peers"] = vs


# --- the fireledger processes of one topology (bench/cost.py, bench/overload.py) -------------------


def roles_for(topology: str, split: list[str]) -> list[str]:
    """The processes of ``topology``: ``["serve"]`` for a ``*-serve`` one, else ``split`` (in start order)."""
    return ["serve"] if topology.endswith("-serve") else list(split)


class Planes:
    """The fireledger processes ``roles`` on the store at ``url``, each a ``tests/e2e.py`` ``Service``
    (its own process group, key ring per run, log level ``warning``, ``env`` added), started in order;
    a failure to start stops those already started. ``prefix`` runs each under a wrapper
    (``bench/costhook.py``)."""

    def __init__(self, url: str, tmp: Path, roles: list[str], env: dict[str, str] | None = None,
                 prefix: list[str] | None = None) -> None:
        from e2e import Service

        self.url = url
        self.roles = roles
        base = {"FIRELEDGER_KEYRING": str(tmp / f"keys-{time.monotonic_ns()}.json"), "FIRELEDGER_LOG_LEVEL": "warning"}
        self.services = [Service(url, tmp, command=r, env={**base, **(env or {})}, prefix=prefix) for r in roles]
        try:
            for svc in self.services:
                svc.start(timeout_s=90)
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [svc.proc.pid for svc in self.services if svc.proc is not None]

    def stop(self) -> None:
        """Stop every process at once (SIGTERM to all, then wait for each): teardown is not measured,
        and stopping them one after another only adds each one's shutdown to the run's wall time."""
        live = [svc for svc in self.services if svc.proc is not None and svc.proc.poll() is None]
        for svc in live:
            try:
                os.killpg(svc.proc.pid, signal.SIGTERM)   # type: ignore[union-attr]
            except ProcessLookupError:
                pass
        for svc in self.services:
            svc.stop()   # waits (SIGKILL after 20 s); a no-op for one already gone


def load_stream(url: str, tenant: Any, target: Any, n: int, base_us: int, end_us: int, *,
                spread: bool) -> dict[str, Any]:
    """``n`` interval triggers of 1 s from ``base_us`` to ``end_us`` (``not_after``), anchored evenly
    over the second (``spread``: a distinct instant every 1/n s) or all at ``base_us`` (``n`` fires
    due at each whole second), bulk-loaded (``bench/load.py``); returns count and load time."""
    from fireledger.domain.keys import from_us
    from fireledger.recurrence import format_instant
    from fireledger.store import Store
    from load import compiled, load_triggers

    now = time.time_ns() // 1000
    specs = ({"every": "1s", "anchor": format_instant(from_us(base_us + (i * S // n if spread else 0))),
              "not_after": format_instant(from_us(end_us - 1))} for i in range(n))
    store = Store.open(url)
    try:
        return load_triggers(store, tenant, target, compiled(specs, now), now)
    finally:
        store.close()


class Stores:
    """A fresh store per run: a SQLite file in ``tmp``, or a new, upgraded database on one throwaway
    PostgreSQL server (``tests/pgserver.py``, started on first use, stopped by :meth:`close`).
    ``durable``: switch the private server's ``fsync``, ``synchronous_commit`` and
    ``full_page_writes`` back on (the test server runs without them); an external server
    (``FIRELEDGER_TEST_PG_URL``) is used as it is configured — :meth:`pg_settings` says which."""

    def __init__(self, tmp: Path, durable: bool = False) -> None:
        from contextlib import ExitStack

        self.tmp = tmp
        self.durable = durable
        self._stack = ExitStack()
        self._pg: Any = None
        self._previous: Path | str | None = None   # the store fresh() returned last (retired by the next call)

    def fresh(self, topology: str, name: str) -> tuple[str, Path | None]:
        """``(url, SQLite file or None)`` of a new store for ``topology`` (``sqlite-*`` or ``postgres-*``).

        The store this method returned before is retired first (its runs are over: callers use one
        store at a time): a SQLite file is deleted with its WAL; a PostgreSQL database is dropped and
        the server checkpointed, so that no run pays for its predecessor's WAL flush or for autovacuum
        of its tables (decision 0255: a confirming run straight after a 60 s run at a higher rate
        measured the server's leftovers, not its own load)."""
        self._retire_previous()
        if topology.startswith("sqlite"):
            db = self.tmp / f"{name}-{topology}-{time.monotonic_ns()}.db"
            self._previous = db
            return f"sqlite:///{db}", db
        from pgserver import pg_server_from_env

        if self._pg is None:
            self._pg = self._stack.enter_context(pg_server_from_env())
            if self.durable and getattr(self._pg, "_proc", None) is not None:
                import psycopg

                with psycopg.connect(self._pg.url, autocommit=True) as c:
                    for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                        c.execute(f"ALTER SYSTEM SET {setting} = on")
                    c.execute("SELECT pg_reload_conf()")
        # PostgreSQL's test server takes a short identifier as the prefix (a unique suffix is added).
        url = migrated_database(self._pg, "fl_" + re.sub(r"[^a-z0-9_]", "_", name.lower())[:28])
        self._previous = url
        return url, None

    def _retire_previous(self) -> None:
        """Delete the SQLite file or drop the PostgreSQL database :meth:`fresh` returned last (see there)."""
        prev, self._previous = self._previous, None
        if isinstance(prev, Path):
            for suffix in ("", "-wal", "-shm", "-writer.lock", "-fires.bell"):
                Path(f"{prev}{suffix}").unlink(missing_ok=True)
        elif isinstance(prev, str) and self._pg is not None:
            import psycopg
            from psycopg import sql

            dbname = psycopg.conninfo.conninfo_to_dict(prev)["dbname"]
            with psycopg.connect(self._pg.url, autocommit=True) as c:
                c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(dbname))))
                try:
                    c.execute("CHECKPOINT")
                except psycopg.errors.InsufficientPrivilege:
                    pass   # an external server's role may not checkpoint (FIRELEDGER_TEST_PG_URL): as it is

    def pg_settings(self) -> dict[str, str] | None:
        """The PostgreSQL server's durability settings as it runs them (None before it started)."""
        if self._pg is None:
            return None
        import psycopg

        with psycopg.connect(self._pg.url, autocommit=True) as c:
            return {k: str(c.execute(f"SHOW {k}").fetchone()[0])   # type: ignore[index]
                    for k in ("fsync", "synchronous_commit", "full_page_writes", "server_version")}

    def close(self) -> None:
        self._stack.close()


_TEMPLATES: dict[str, str] = {}   # server URL → its template database


def migrated_database(server: Any, prefix: str) -> str:
    """The URL of a new database on ``server`` (``tests/pgserver.py``) with the schema at head: a copy
    of a template database that ``fireledger db upgrade`` migrated once per server. Upgrading each
    fresh database took seconds of set-up per run (a subprocess, every migration, fsync on); a copy
    is one ``CREATE DATABASE … TEMPLATE`` (decision 0214)."""
    import psycopg

    from e2e import cli

    tmpl = _TEMPLATES.get(server.url)
    if tmpl is None:
        url = server.new_database("fl_bench_template")
        cli("db", "upgrade", "--db", url)   # its own process: no connection to the template stays open
        tmpl = _TEMPLATES[server.url] = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    return str(server.new_database(prefix, template=tmpl))


def failed_line(scenario: str, topology: str, n: int, exc: BaseException, **extra: Any) -> dict[str, Any]:
    """The line of a run that failed (one failed run must not lose the others): the keys every line
    has, empty, and the error."""
    return {"scenario": scenario, "system": f"fireledger-{topology}", "topology": topology, **extra, "n": n,
            "delivered": None, "missed": None, "early": None, "duplicate_records": None, "fires_per_s": None,
            "lateness_p50_s": None, "lateness_p99_s": None, "lateness_max_s": None,
            "error": f"{type(exc).__name__}: {exc}"[:500], **machine()}


class Deadline:
    """A scenario group's total deadline (``bench/run.py``): each run inside the group is bounded by
    its own deadline; this one bounds the group, so the full form cannot hang on one scenario. A run
    is started only while time is left; what was not started gets a ``timed_out`` line."""

    def __init__(self, group: str, seconds: float) -> None:
        self.group = group
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def over(self) -> bool:
        return time.monotonic() >= self.end

    def line(self, scenario: str, system: str, n: int | None = None, *, rest: bool = False,
             **extra: Any) -> dict[str, Any]:
        """The line of a run not started because the group's deadline had passed (``rest``: it
        stands for the group's remaining runs, if there were any)."""
        what = "its remaining runs, if any, were not started" if rest else "not run"
        return {"scenario": scenario, "system": system, **extra, "n": n, "delivered": None, "missed": None,
                "early": None, "duplicate_records": None, "fires_per_s": None, "lateness_p50_s": None,
                "lateness_p99_s": None, "lateness_max_s": None,
                "timed_out": f"the {self.group} group's deadline ({self.seconds:.0f} s) had passed; {what}",
                **machine()}

    def cap(self, lines: Iterable[dict[str, Any]], scenario: str, system: str) -> Iterable[dict[str, Any]]:
        """``lines`` until the deadline passes between two of them; then the source is closed (its
        clean-up runs) and one ``timed_out`` line stands for the runs it did not start."""
        it = iter(lines)
        try:
            for line in it:
                yield line
                if self.over():
                    yield self.line(scenario, system, rest=True)
                    return
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
