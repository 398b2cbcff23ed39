"""Dead letter and redrive on real processes (decision 0148): ``fireledger serve`` and a real HTTP
receiver that fails the first two requests of each fire key, then recovers. A one-shot trigger with
``retry.max_attempts`` 2 ends ``failed`` (its cause naming the attempts bound) and is listed at
``GET /v1/dead-letters``; ``POST /v1/fires/{key}/redrive`` then delivers it under the ORIGINAL key as
attempt 3, the fire's history shows the redrive, and the audit log the act."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.recurrence import format_instant
from sink import SinkServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def test_a_dead_letter_is_redriven_under_its_original_key(e2e_db, sink, tmp_path) -> None:
    db = e2e_db   # [postgres] is a long form (decision 0203)
    svc = Service(db, tmp_path).start(timeout_s=60)
    try:
        _, token = new_tenant(db)
        api = Api(svc.base, token)
        target = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/fail-first/2"}, 201)
        sink.add_secret(target["secret"])
        verify_target(api, sink, target)
        at = format_instant(datetime.fromtimestamp(int(time.time()) + 2, tz=UTC))
        trig = api.ok("POST", "/v1/triggers", {
            "name": "once", "schedule": {"at": at}, "target_id": target["id"], "jitter": "0s",
            "retry": {"max_attempts": 2, "min_backoff": "1s", "max_backoff": "1s"}}, 201)
        assert trig["retry"]["max_attempts"] == 2

        def dead() -> list:
            return api.ok("GET", f"/v1/dead-letters?trigger_id={trig['id']}")["items"]

        [letter] = wait_until(dead, 30, "the fire to end failed and be listed as a dead letter")
        assert letter["state"] == "failed" and letter["attempts"] == 2
        assert letter["cause"] == "failed: retries exhausted after 2 attempts (last: HTTP 500)"
        key = letter["key"]
        redriven = api.ok("POST", f"/v1/fires/{key}/redrive", None, 200)
        assert redriven["key"] == key and redriven["state"] in ("pending", "dispatching", "delivered")

        def delivered() -> dict | None:
            f = api.ok("GET", f"/v1/fires/{key}")
            return f if f["state"] == "delivered" else None

        fire = wait_until(delivered, 30, "the redriven fire to be delivered")
        assert dead() == []
        assert fire["redriven_at"] is not None and [a["attempt"] for a in fire["attempts"]] == [1, 2, 3]
        assert [a["http_status"] for a in fire["attempts"]] == [500, 500, 200]
        history = api.ok("GET", f"/v1/triggers/{trig['id']}/fires")["items"]
        assert [f["key"] for f in history] == [key]                       # never a new fire
        got = [(r["fire_key"], r["attempt"]) for r in sink.records()]
        assert got == [(key, 1), (key, 2), (key, 3)]
        audit = api.ok("GET", "/v1/audit")["items"]
        assert [a["action"] for a in audit].count("fire.redrive") == 1
        assert api.call("POST", f"/v1/fires/{key}/redrive")[0] == 409          # delivered: not dead
    finally:
        svc.stop()
