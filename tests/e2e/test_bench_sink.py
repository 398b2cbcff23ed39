"""A one-second smoke of the benchmark sink (bench/sink.py) — the receiver every benchmark figure
depends on — and of the suite's summary: real process, real HTTP, no benchmark run."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench"))   # last: bench/ module names never shadow anything

from benchkit import SECRET, Sink, summarise  # noqa: E402
from fireledger.dispatch.signing import build_headers  # noqa: E402
from fireledger.domain.keys import FireKey  # noqa: E402

pytestmark = pytest.mark.e2e


def test_sink_records_identities_and_verifies_a_sample_of_signatures(tmp_path):
    sink = Sink(tmp_path, sample_every=2)
    try:
        port = int(sink.base.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)   # one keep-alive connection
        sched = 1_800_000_000_000_000
        keys = [str(FireKey("tn_a", f"tr_{i}", sched, 0)) for i in range(3)]
        for i, key in enumerate(keys):
            body = json.dumps({"fire_key": key}).encode()
            headers = {"content-type": "application/json", "fireledger-fire-key": key,
                       **build_headers(SECRET, f"{key}.1", int(time.time()), body)}
            if i == 2:   # a forged signature on a sampled request (the 3rd signed one: 1st, 3rd sampled)
                headers["webhook-signature"] = "v1,AAAA"
            conn.request("POST", "/hook", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
        conn.request("POST", "/hook", body=b'{"id":"j7","s":1800000000500000}')   # a peer's job body
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        conn.close()

        recs = sink.records()
        assert [r[1] for r in recs[:3]] == keys
        stats = sink.stats()
        assert stats["count"] == 4 and stats["signed_seen"] == 3
        assert stats["signature_sampled"] == 2 and stats["signature_ok"] == 1
        assert sum(stats["signature_errors"].values()) == 1   # the forged one, caught by the sample

        s = summarise(recs + recs[:1], 5, t0_us=sched)   # one duplicate arrival, one fire never sent
        assert s["delivered"] == 4 and s["missed"] == 1 and s["duplicate_deliveries"] == 1
        assert s["early"] == 4   # every instant above lies in the future of the arrivals
        sink.clear()
        assert sink.count() == 0
    finally:
        sink.close()


def test_bench_run_help_exits_zero():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--quick" in out.stdout
