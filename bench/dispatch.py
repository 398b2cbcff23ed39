"""Dispatch-plane benchmark: deliveries/s to a local sink with signing and per-attempt tokens on, and
what signing + token cost per attempt.

N fires are committed to the ledger (embedded default, SQLite), due at once, spread over 100
triggers of one tenant whose quota is out of the way; the real attempt runner (``Dispatcher``,
concurrency 256) drains them with real HTTP to a sink running in its own process. Twice: tokens on
(Standard Webhooks signature + an EdDSA JWT per attempt, as ``fireledger serve`` sends) and tokens
off (signature only), so the token's share shows as a difference, not an estimate.

Prints one JSON object: the keys of DESIGN.md §4 (``fires_per_s`` is deliveries/s with tokens on;
lateness is sink arrival minus scheduled instant, the fires being due when the run starts) and

* ``deliveries_per_s`` / ``deliveries_per_s_tokens_off``;
* ``cpu_us_per_attempt`` / ``…_tokens_off`` — this process's CPU time (dispatcher, store, HTTP client)
  per delivered attempt;
* ``sign_us``, ``token_us``, ``sign_plus_token_us`` — median µs of exactly the runner's credential
  work per attempt on the run's own bodies (the Standard Webhooks HMAC headers; ``body_sha256`` +
  ``mint`` + the header), measured alone;
* ``sign_plus_token_share`` — ``sign_plus_token_us / cpu_us_per_attempt``.

    .venv/bin/python bench/dispatch.py [--n 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
# The sink listens on loopback: a local benchmark, as tests and `make run` allow.
os.environ.setdefault("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1")

from fireledger.clock import SystemClock  # noqa: E402
from fireledger.dispatch.credentials import KeyRingFile, authorization_header, body_sha256, mint  # noqa: E402
from fireledger.dispatch.runner import Dispatcher, dispatch_body  # noqa: E402
from fireledger.dispatch.signing import build_headers  # noqa: E402
from fireledger.domain.keys import FireKey  # noqa: E402
from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire  # noqa: E402
from fireledger.recurrence import parse_instant  # noqa: E402
from fireledger.store import Store  # noqa: E402
from storekit import add_target, add_tenant, add_trigger  # noqa: E402

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ISSUER = "http://127.0.0.1:8080"
S = 1_000_000


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def start_sink(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "port"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "sink.py"), "--port", "0", "--port-file",
                             str(port_file), "--secret", SECRET], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not port_file.exists() or not port_file.read_text().strip():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("sink did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


def records(base: str, since: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/records?since={since}", timeout=60) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def setup(tmp: Path, base: str, n: int, name: str) -> tuple[Store, int]:
    store = Store.open(f"sqlite:///{tmp}/{name}.db")
    clock = SystemClock()
    t = add_tenant(store)
    store.dispatch.set_tenant_quota(t.id, fires_per_s=1e9, inflight=1_000_000)
    tg = add_target(store, t, url=f"{base}/ok", secret=SECRET)
    now = clock.now().latest_us
    triggers = [add_trigger(store, t, tg, {"at": "2035-01-01T00:00:00Z"}, now_us=now, payload={"n": "x" * 64})[0]
                for _ in range(100)]
    due = now + 1 * S
    decisions = []
    for i, trig in enumerate(triggers):
        mine = range(i, n, len(triggers))
        fires = tuple(NewFire(t.id, trig.id, due + k, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.PENDING,
                              due, "2026f", "bench") for k in mine)
        row = store.registry.get_trigger(t.id, trig.id)
        decisions.append(Decision(Advance(trig.id, row.next_us, 1, row.next_us, 1), fires))
    store.timing.apply_decisions(decisions)
    return store, due


async def drain(store: Store, keys: KeyRingFile | None, n: int, due_us: int) -> dict[str, float]:
    clock = SystemClock()
    while clock.now().earliest_us < due_us + 1000 * math.ceil(clock.now().eps_us / 1000):
        await asyncio.sleep(0.01)
    d = Dispatcher(store, clock, "bench-d", concurrency=256, keys=keys, issuer=ISSUER)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    task = asyncio.create_task(d.run())
    deadline = time.monotonic() + 60 + n / 50
    while d.delivered < n and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    d.stop()
    await task
    return {"wall_s": wall, "cpu_s": cpu, "delivered": d.delivered}


def credential_cost(store: Store, keys: KeyRingFile, url: str) -> tuple[float, float]:
    """Median µs per attempt of the runner's HMAC signing and of its token (hash + mint)."""
    from fireledger.dispatch.lanes import DispatchConfig
    from fireledger.dispatch.runner import _Shaper
    from fireledger.dispatch.shaping import Capacity

    fires = []
    clock = SystemClock()
    cap = Capacity(64, {"on-time": 64, "catch-up": 0, "backfill": 0}, 64)
    res = store.dispatch.claim_shaped(clock.now().latest_us + 10 * S, "probe", {"on-time": 64},
                             _Shaper(DispatchConfig(), cap), 5 * S)
    # Payloads and target secrets are stored sealed: open them as the attempt runner does (admission).
    from fireledger.security.envelope import open_job_payload

    fires = [asyncio.run(open_job_payload(store, c.job)) for c in res.jobs]
    if not fires:
        raise RuntimeError("no fire to measure credentials with")
    ring = keys.ring()
    now_s = int(time.time())

    bodies = []
    for job in fires:
        f = job.fire
        key = str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))
        bodies.append((job, key, dispatch_body(job, key)))

    def one_sign(i: int) -> None:
        job, key, body = bodies[i % len(bodies)]
        build_headers(job.target.secret, f"{key}.1", now_s, body)

    def one_token(i: int) -> None:
        job, key, body = bodies[i % len(bodies)]
        authorization_header(mint(ring, issuer=ISSUER, audience=url, subject=job.fire.trigger_id, fire_key=key,
                                  attempt=1, body_sha256=body_sha256(body), now_s=now_s, expires_s=now_s + 31))

    def median_us(fn: Any, rounds: int = 9, batch: int = 1000) -> float:
        fn(0)
        out = []
        for r in range(rounds):
            t0 = time.perf_counter()
            for i in range(batch):
                fn(i + r * batch)
            out.append((time.perf_counter() - t0) / batch * 1e6)
        return statistics.median(out)

    return median_us(one_sign), median_us(one_token)


def main() -> int:
    import uvloop

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        from e2e import use_state_dir  # a state directory (KEK, key ring) for the run, unless one is set

        use_state_dir(tmp / "state")
        sink, base = start_sink(tmp)
        try:
            keys = KeyRingFile(tmp / "keys.json")
            runs: dict[str, dict[str, float]] = {}
            lateness: list[float] = []
            keys_seen: list[str] = []
            bad = 0
            for mode in ("tokens_on", "tokens_off"):
                store, due = setup(tmp, base, n, mode)
                since = len(records(base, 0))
                runs[mode] = uvloop.run(drain(store, keys if mode == "tokens_on" else None, n, due))
                recs = records(base, since)
                if mode == "tokens_on":
                    lateness = [r["arrived_at"] - parse_instant(r["scheduled_instant"]).timestamp() for r in recs]
                    keys_seen = [r["fire_key"] for r in recs]
                    bad = sum(1 for r in recs if not r.get("signature_ok") or not r["headers"].get("authorization"))
                    count = store.history.count_fires()
                    store.close()
                    store, _ = setup(tmp, base, 64, "probe")
                    sign_us, token_us = credential_cost(store, keys, f"{base}/ok")
                store.close()
        finally:
            sink.terminate()
            sink.wait()
    on, off = runs["tokens_on"], runs["tokens_off"]
    cpu_on = on["cpu_s"] / max(1, on["delivered"]) * 1e6
    cpu_off = off["cpu_s"] / max(1, off["delivered"]) * 1e6
    result = {
        "scenario": f"dispatch-deliveries-{n}",
        "system": f"fireledger-sqlite, python {sys.version.split()[0]}, {os.cpu_count()} cpu",
        "n": n,
        "delivered": len(set(keys_seen)),
        "missed": n - len(set(keys_seen)),
        "early": sum(1 for x in lateness if x < 0),
        "duplicate_records": count - n,
        "duplicate_deliveries": len(keys_seen) - len(set(keys_seen)),
        "bad_signatures_or_tokens": bad,
        "fires_per_s": round(on["delivered"] / on["wall_s"], 1),
        "deliveries_per_s": round(on["delivered"] / on["wall_s"], 1),
        "deliveries_per_s_tokens_off": round(off["delivered"] / off["wall_s"], 1),
        "lateness_p50_s": round(pct(lateness, 50), 4),
        "lateness_p99_s": round(pct(lateness, 99), 4),
        "lateness_max_s": round(max(lateness, default=float("nan")), 4),
        "cpu_us_per_attempt": round(cpu_on, 1),
        "cpu_us_per_attempt_tokens_off": round(cpu_off, 1),
        "sign_us": round(sign_us, 2),
        "token_us": round(token_us, 2),
        "sign_plus_token_us": round(sign_us + token_us, 2),
        "sign_plus_token_share": round((sign_us + token_us) / cpu_on, 4),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
