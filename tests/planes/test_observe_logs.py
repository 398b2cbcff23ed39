"""Structured JSON logs: attempt outcomes carry the fire key; nothing but whitelisted evidence fields
ever reaches a line — a payload attached by mistake is dropped."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from fireledger.clock import FakeClock
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import FireKey
from fireledger.observe.logs import JsonFormatter, attempt_fields
from fireledger.store import Store
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_tenant, add_trigger

SENTINEL = "LOG-PAYLOAD-SENTINEL-91c2"
S = 1_000_000


def test_only_whitelisted_fields_reach_a_line() -> None:
    rec = logging.LogRecord("fireledger.dispatch", logging.INFO, __file__, 1, "attempt %s", ("retry",), None)
    for k, v in attempt_fields("tn_a.tr_b.20270115T080000Z.0", 2, "retry", trigger_id="tr_b", lane="on-time",
                               http_status=503, duration_s=0.25).items():
        setattr(rec, k, v)
    rec.payload = {"secret": SENTINEL}
    rec.body = SENTINEL
    line = json.loads(JsonFormatter().format(rec))
    assert line["fire_key"] == "tn_a.tr_b.20270115T080000Z.0" and line["attempt"] == 2
    assert (line["result"], line["http_status"], line["duration_s"], line["lane"]) == ("retry", 503, 0.25, "on-time")
    assert line["msg"] == "attempt retry" and line["level"] == "info"
    assert SENTINEL not in json.dumps(line) and "payload" not in line and "lateness_s" not in line


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("fireledger")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield buf
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_attempt_outcomes_are_logged_with_their_fire_key_and_never_the_payload(
        tmp_path: Path, captured: io.StringIO) -> None:
    sink = SinkServer()
    sink.start_in_thread()
    store = Store.open(f"sqlite:///{tmp_path}/logs.db")
    try:
        t = add_tenant(store)
        ok, _, first = add_trigger(store, t, add_target(store, t, url=f"{sink.base_url}/ok"), {"every": "60s"},
                                   payload={"secret": SENTINEL})
        bad, _, _ = add_trigger(store, t, add_target(store, t, url=f"{sink.base_url}/status/404"),
                                {"every": "60s"}, payload={"secret": SENTINEL})
        clock = FakeClock(first + S)
        assert len(TimingLoop(store, clock, "timing-logs").tick().inserted) == 2

        async def run() -> None:
            # One claim round and the recording of its results: both attempts made, their lines written.
            async with Dispatcher(store, clock, "dispatch-logs") as d:
                assert await d.claim_once() == 2
                assert await d.flush() == 2

        asyncio.run(run())
    finally:
        store.close()
        sink.stop()
    lines = [json.loads(x) for x in captured.getvalue().splitlines()]
    attempts = {ln["trigger_id"]: ln for ln in lines if ln.get("msg", "").startswith("attempt ") and "fire_key" in ln}
    assert attempts[ok.id]["result"] == "delivered" and attempts[ok.id]["level"] == "debug"
    assert attempts[bad.id]["result"] == "failed" and attempts[bad.id]["http_status"] == 404
    assert attempts[bad.id]["level"] == "info"
    assert FireKey.parse(attempts[ok.id]["fire_key"]) == FireKey(t.id, ok.id, first, 0)
    assert SENTINEL not in captured.getvalue()
