"""A real timing-plane cluster for the ``timing-…`` falsification scenarios.

One PostgreSQL server (``FIRELEDGER_TEST_PG_URL`` or a throwaway one, shared by every scenario of the
run), a fresh database per scenario, ``fireledger timing`` / ``dispatch`` / ``control`` processes
(tests/e2e.py ``Service``), an in-process HTTP sink (tests/sink.py) whose clock is the judge of
earliness, and direct SQL reads of the ledger and the lease table for the verdicts.

Also here: a TCP proxy that delays one node's traffic to PostgreSQL (a real round-trip excursion:
the clock cross-check turns it into ε), and the libfaketime preload that steps one process's clock.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import glob
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.domain.keys import to_us
from fireledger.recurrence import format_instant, parse_instant
from fireledger.security.envelope import sealed_target
from pgserver import PgServer, pg_server_from_env
from sink import SinkServer

S = 1_000_000
ROOT = Path(__file__).resolve().parents[1]

_PG: PgServer | None = None
_PG_CM: Any = None
_PG_LOCK = threading.Lock()


def pg_server() -> PgServer:
    """The run's PostgreSQL server (started on first use, stopped at exit)."""
    global _PG, _PG_CM
    with _PG_LOCK:
        if _PG is None:
            _PG_CM = pg_server_from_env()
            _PG = _PG_CM.__enter__()
            atexit.register(lambda: _PG_CM.__exit__(None, None, None))
        return _PG


def libfaketime() -> str:
    """Path of libfaketime (installs Debian's ``faketime`` through scripts/ensure-faketime.sh)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if found:
        return found[0]
    out = subprocess.run([str(ROOT / "scripts" / "ensure-faketime.sh")], capture_output=True, text=True,
                         check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines or not os.path.exists(lines[-1]):
        raise RuntimeError(f"libfaketime is not available: {out.stderr.strip()[-500:]}")
    return lines[-1]


def pct(values: Iterable[float], q: float) -> float | None:
    xs = sorted(values)
    if not xs:
        return None
    i = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return round(xs[i], 3)


class DelayProxy:
    """A TCP proxy to ``upstream`` that delays client→server bytes by ``delay_s`` (settable live)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.delay_s = 0.0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delayed: bool) -> None:
            q: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def send() -> None:
                while True:
                    due, data = await q.get()
                    if not data:
                        break
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    writer.write(data)
                    await writer.drain()
                with contextlib.suppress(Exception):
                    writer.close()

            sender = asyncio.ensure_future(send())
            try:
                while True:
                    data = await reader.read(65536)
                    q.put_nowait((time.monotonic() + (self.delay_s if delayed else 0.0), data))
                    if not data:
                        break
            except Exception:
                q.put_nowait((0.0, b""))
            await sender

        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            try:
                sr, sw = await asyncio.open_connection(*self.upstream)
            except OSError:
                cw.close()
                return
            await asyncio.gather(pipe(cr, sw, True), pipe(sr, cw, False), return_exceptions=True)

        async def main() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            async with server:
                await server.serve_forever()

        with contextlib.suppress(Exception):
            self._loop.run_until_complete(main())

    def url_for(self, url: str) -> str:
        """``url`` (postgresql://user@host:port/db) pointed at the proxy."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit((parts.scheme, f"{user}127.0.0.1:{self.port}", parts.path, parts.query, parts.fragment))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


@dataclass
class Trig:
    id: str
    period_us: int
    anchor_us: int


@dataclass
class Cluster:
    """Processes against one fresh database; ``close()`` stops them all."""

    name: str
    db: str
    work: Path
    sink: SinkServer
    services: list[Service] = field(default_factory=list)
    control: Service | None = None
    apis: list[tuple[Api, str]] = field(default_factory=list)
    _conn: Any = None

    @classmethod
    def create(cls, name: str) -> Cluster:
        from fireledger.store import Store

        db = pg_server().new_database(prefix="fl_falsify")
        Store.open(db, migrate=True).close()   # what `fireledger db upgrade` does, in-process
        work = Path(tempfile.mkdtemp(prefix=f"fireledger-{name}-"))
        sink = SinkServer()
        sink.start_in_thread()
        return cls(name, db, work, sink)

    # --- processes --------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"FIRELEDGER_KEYRING": str(self.work / "keys.json"), "FIRELEDGER_LOG_LEVEL": "info",
                **(extra or {})}

    def start(self, command: str, *, env: dict[str, str] | None = None, db: str | None = None) -> Service:
        """Start ``fireledger <command>`` (control waits for /healthz; timing and dispatch have no HTTP)."""
        svc = Service(db or self.db, self.work, command=command, env=self.env(env))
        svc.start(timeout_s=60)
        self.services.append(svc)
        return svc

    def start_timing(self, n: int = 1, *, env: dict[str, str] | None = None, db: str | None = None,
                     prefix: list[str] | None = None) -> list[Service]:
        out = []
        for _ in range(n):
            svc = Service(db or self.db, self.work, command="timing", env=self.env(env), prefix=prefix)
            svc.start()
            self.services.append(svc)
            out.append(svc)
        return out

    def node_id(self, svc: Service, timeout_s: float = 30) -> str:
        """The node id of a timing process (its session row; the id carries the pid)."""
        assert svc.proc is not None
        pid = svc.proc.pid

        def found() -> str | None:
            if svc.proc is not None and svc.proc.poll() is not None:
                raise RuntimeError(f"timing process exited {svc.proc.returncode}: {svc.log_text()[-1500:]}")
            rows = self.sql("SELECT id FROM nodes WHERE role = 'timing' AND id LIKE %s", (f"timing-%-{pid}-%",))
            return rows[0][0] if rows else None

        return str(wait_until(found, timeout_s, f"timing node {pid} to register", interval_s=0.1))

    def stop_all(self) -> None:
        for svc in self.services:
            if svc.proc is not None and svc.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(svc.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for svc in self.services:
            if svc.proc is None:
                continue
            try:
                svc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(svc.proc.pid, signal.SIGKILL)
                svc.proc.wait(timeout=10)
            if getattr(svc, "log", None):
                svc.log.close()

    def close(self) -> None:
        """Stop every process and the sink; delete the work directory (process logs included) unless
        ``FIRELEDGER_FALSIFY_KEEP=1``."""
        self.stop_all()
        self.sink.stop()
        if self._conn is not None:
            self._conn.close()
        if os.environ.get("FIRELEDGER_FALSIFY_KEEP") != "1":
            import shutil

            shutil.rmtree(self.work, ignore_errors=True)

    # --- the database -----------------------------------------------------------------------

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.db, autocommit=True)
        cur = self._conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def server_us(self) -> int:
        return int(self.sql("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint")[0][0])

    def lease_owners(self) -> dict[int, str | None]:
        return {int(p): o for p, o in self.sql("SELECT partition, owner FROM leases ORDER BY partition")}

    def held_by(self) -> Counter[str | None]:
        return Counter(self.lease_owners().values())

    def wait_owned(self, nodes: set[str], timeout_s: float, what: str) -> float:
        """Wait until every partition is held by one of ``nodes``; returns the seconds waited."""
        t0 = time.monotonic()
        wait_until(lambda: all(o in nodes for o in self.lease_owners().values()), timeout_s, what, interval_s=0.05)
        return time.monotonic() - t0

    # --- tenants, targets, triggers ---------------------------------------------------------

    def setup_api(self, tenants: int = 1) -> list[tuple[Api, str]]:
        if self.control is None:
            self.control = self.start("control")
        for i in range(tenants):
            _, token = new_tenant(self.db, f"{self.name}-{i}")
            api = Api(self.control.base, token)
            target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{self.sink.base_url}/ok"}, 201)
            self.sink.add_secret(target["secret"])
            verify_target(api, self.sink, target)
            self.apis.append((api, target["id"]))
        return self.apis

    def create_triggers(self, n: int, periods_s: Iterable[int] = (1, 2)) -> list[Trig]:
        """``n`` interval triggers spread over the tenants, periods cycling through ``periods_s``."""
        periods = list(periods_s)
        ids = []
        for i in range(n):
            api, target = self.apis[i % len(self.apis)]
            p = periods[i % len(periods)]
            body = {"name": f"t{i}", "schedule": {"every": f"{p}s"}, "target_id": target, "timeout": "5s"}
            ids.append((api.ok("POST", "/v1/triggers", body, 201)["id"], p))
        out = []
        rows = dict(self.sql(
            "SELECT v.trigger_id, v.schedule FROM trigger_versions v JOIN triggers t ON t.id = v.trigger_id "
            "AND t.current_version = v.version"))
        for tid, p in ids:
            anchor = json.loads(rows[tid])["anchor"]
            out.append(Trig(tid, p * S, to_us(parse_instant(anchor))))
        return out

    def create_direct(self, n: int, periods_s: Iterable[int] = (1,), per_tenant: int = 50) -> list[Trig]:
        """``n`` interval triggers written through the store (no control process needed): a tenant
        (with one verified target on the sink) per ``per_tenant`` triggers, so no tenant exceeds its
        default fires/s quota (100), each trigger in its real partition, anchored now."""
        import base64
        import secrets as _secrets

        from fireledger.domain.keys import new_id
        from fireledger.domain.model import Policies, Principal, Target, Tenant
        from fireledger.registry import Registry, definition
        from fireledger.store import Store

        store = Store.open(self.db)
        try:
            now = now_us()

            def tenant() -> tuple[Tenant, Target]:
                tn = Tenant(new_id("tn"), f"{self.name}-{new_id('x')}", now)
                store.trust.create_tenant_with_principal(
                    tn, Principal(new_id("pr"), tn.id, "root", frozenset({"author"}), now), f"hash-{new_id('h')}")
                secret = "whsec_" + base64.b64encode(_secrets.token_bytes(24)).decode()
                self.sink.add_secret(secret)
                tg = Target(new_id("tg"), tn.id, "http", f"{self.sink.base_url}/ok", secret, "verified",
                            new_id("v"), now)
                store.registry.create_target(sealed_target(store, tg))
                return tn, tg

            periods = list(periods_s)
            registry = Registry(store)
            anchor = now - now % S + S
            out = []
            for i in range(n):
                if i % per_tenant == 0:
                    tn, tg = tenant()
                p = periods[i % len(periods)]
                d = definition({"every": f"{p}s"}, tg.id, now_us=now, anchor_us=anchor, name=f"t{i}",
                               policies=Policies(timeout_s=5.0))
                made = registry.create_checked(tn.id, "falsify", d, now_us=now)
                out.append(Trig(made.trigger.id, p * S, anchor))
            return out
        finally:
            store.close()

    # --- verdicts ---------------------------------------------------------------------------

    def ledger_check(self, trigs: list[Trig], from_us: int, to_us_: int) -> dict[str, Any]:
        """Every scheduled instant of ``trigs`` in [from, to] has exactly one fire record (and no
        record exists for an instant the schedule does not have)."""
        by = {t.id: t for t in trigs}
        rows = self.sql("SELECT trigger_id, scheduled_us, seq FROM fires WHERE scheduled_us BETWEEN %s AND %s",
                        (from_us, to_us_))
        got: dict[str, Counter[int]] = defaultdict(Counter)
        for tid, us, _seq in rows:
            if tid in by:
                got[tid][int(us)] += 1
        missing = extra = dup = expected_n = 0
        examples: list[str] = []
        for t in trigs:
            k0 = -((t.anchor_us - from_us) // t.period_us)
            want = set()
            k = k0
            while t.anchor_us + k * t.period_us <= to_us_:
                if t.anchor_us + k * t.period_us >= from_us:
                    want.add(t.anchor_us + k * t.period_us)
                k += 1
            expected_n += len(want)
            have = got.get(t.id, Counter())
            m = want - set(have)
            x = set(have) - want
            d = sum(c - 1 for c in have.values() if c > 1)
            missing += len(m)
            extra += len(x)
            dup += d
            if (m or x or d) and len(examples) < 5:
                examples.append(f"{t.id}: missing {sorted(m)[:3]} extra {sorted(x)[:3]} dup {d}")
        total = int(self.sql("SELECT COUNT(*) FROM fires")[0][0])
        distinct = int(self.sql("SELECT COUNT(*) FROM (SELECT DISTINCT tenant_id, trigger_id, scheduled_us, seq "
                                "FROM fires) x")[0][0])
        return {"instants": expected_n, "missing_records": missing, "unexpected_records": extra,
                "duplicate_records": dup + (total - distinct), "examples": examples}

    def sink_check(self, from_us: int | None = None, to_us_: int | None = None) -> dict[str, Any]:
        """Earliness by the sink's clock and repeated deliveries per fire key."""
        recs = self.sink.records()
        lead: list[float] = []
        per_key: Counter[str] = Counter()
        for r in recs:
            if not r.get("fire_key") or not r.get("scheduled_instant"):
                continue
            sched = to_us(parse_instant(r["scheduled_instant"]))
            if from_us is not None and sched < from_us:
                continue
            if to_us_ is not None and sched > to_us_:
                continue
            lead.append(r["arrived_at"] - sched / S)
            per_key[r["fire_key"]] += 1
        early = sum(1 for x in lead if x < 0)
        extra = sum(c - 1 for c in per_key.values())
        return {"deliveries": len(lead), "fires_delivered": len(per_key), "early": early,
                "earliest_arrival_minus_scheduled_s": round(min(lead), 4) if lead else None,
                "delivery_lateness_p50_s": pct(lead, 50), "delivery_lateness_p99_s": pct(lead, 99),
                "extra_attempts_max": max((c - 1 for c in per_key.values()), default=0),
                "duplicate_attempt_rate": round(extra / len(per_key), 6) if per_key else 0.0}

    def wait_decided(self, trigs: list[Trig], until_us: int, timeout_s: float) -> None:
        """Wait until every trigger has a fire record at or after ``until_us``."""
        ids = [t.id for t in trigs]

        def done() -> bool:
            rows = self.sql("SELECT trigger_id, MAX(scheduled_us) FROM fires WHERE trigger_id = ANY(%s) "
                            "GROUP BY trigger_id", (ids,))
            return len(rows) == len(ids) and all(int(m) >= until_us for _, m in rows)

        wait_until(done, timeout_s, "every trigger to be decided past the window", interval_s=0.2)


class EarlyWatch:
    """Watches the ledger for a fire record that exists *before* its scheduled instant by the
    PostgreSQL server's clock — an early decision, whatever the deciding node's clock said (the
    dispatch plane would hold such a fire until its own clock passes the decided instant, so the sink
    alone cannot see a decision made early by a node whose clock runs ahead)."""

    QUERY = ("SELECT COUNT(*), MAX(f.scheduled_us - n.now_us) FROM fires f, "
             "(SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint AS now_us) n "
             "WHERE f.state IN ('pending', 'dispatching') AND f.scheduled_us > n.now_us")

    def __init__(self, db: str, interval_s: float = 0.05) -> None:
        self.db = db
        self.interval_s = interval_s
        self.samples = 0
        self.early_seen = 0
        self.max_early_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="early-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(self.db, autocommit=True) as conn:
            while not self._stop.is_set():
                n, lead = conn.execute(self.QUERY).fetchone()
                self.samples += 1
                if n:
                    self.early_seen = max(self.early_seen, int(n))
                    self.max_early_s = max(self.max_early_s, int(lead) / S)
                self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(10)
        return {"early_decisions_seen": self.early_seen, "early_decision_max_s": round(self.max_early_s, 3),
                "early_watch_samples": self.samples}


def now_us() -> int:
    return time.time_ns() // 1000


def at_in(seconds: float) -> str:
    """RFC 3339 for now + ``seconds`` (microsecond precision)."""
    from fireledger.domain.keys import from_us

    return format_instant(from_us(now_us() + int(seconds * S)))


__all__ = ["Cluster", "DelayProxy", "S", "Trig", "at_in", "libfaketime", "now_us", "pct", "pg_server"]
