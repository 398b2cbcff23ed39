"""A dead letter's one delivery to its trigger's dead-letter target on real processes (decision 0178):
``fireledger serve`` and a real HTTP receiver. A one-shot trigger whose target answers 500, with
``retry.max_attempts`` 2 and a dead-letter target on the same receiver: the fire ends ``failed``;
the dead-letter target then receives exactly one signed POST under the derived key (kind
``dead-letter``) carrying the dead fire's history (its key, cause and both attempts) and the
trigger's payload; the trigger's history shows the delivery record delivered, and no other request
reaches the dead-letter target."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from e2e import Api, Service, new_tenant, verify_target, wait_until
from fireledger.domain.keys import FireKey, dead_letter_key
from fireledger.recurrence import format_instant
from sink import SinkServer

pytestmark = pytest.mark.e2e


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


def test_a_dead_fire_is_delivered_once_with_its_history(e2e_db, sink, tmp_path) -> None:
    db = e2e_db   # [postgres] is a long form (decision 0203)
    svc = Service(db, tmp_path).start(timeout_s=60)
    try:
        _, token = new_tenant(db)
        api = Api(svc.base, token)
        targets = []
        for path in ("/status/500", "/dlq"):
            t = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}{path}"}, 201)
            sink.add_secret(t["secret"])
            verify_target(api, sink, t)
            targets.append(t["id"])
        at = format_instant(datetime.fromtimestamp(int(time.time()) + 2, tz=UTC))
        trig = api.ok("POST", "/v1/triggers", {
            "name": "once", "schedule": {"at": at}, "target_id": targets[0], "jitter": "0s",
            "payload": {"invoice": 42}, "dead_letter_target_id": targets[1],
            "retry": {"max_attempts": 2, "min_backoff": "1s", "max_backoff": "1s"}}, 201)
        assert trig["dead_letter_target_id"] == targets[1]

        def delivered_to_dlq() -> list:
            return [r for r in sink.records() if r["path"] == "/dlq"]

        [rec] = wait_until(delivered_to_dlq, 40, "the dead letter's delivery")
        [dead] = [f for f in api.ok("GET", f"/v1/triggers/{trig['id']}/fires")["items"] if f["kind"] == "scheduled"]
        want = str(dead_letter_key(FireKey.parse(dead["key"])))
        assert dead["state"] == "failed"
        assert dead["cause"] == "failed: retries exhausted after 2 attempts (last: HTTP 500)"
        assert rec["signature_ok"] and rec["fire_key"] == want == rec["fire_key_header"]
        assert (rec["kind"], rec["attempt"], rec["lane"]) == ("dead-letter", 1, "catch-up")
        assert rec["payload"] == {"invoice": 42}
        history = rec["dead_letter"]
        assert history["key"] == dead["key"] and history["cause"] == dead["cause"] and history["state"] == "failed"
        assert [(a["attempt"], a["http_status"]) for a in history["attempts"]] == [(1, 500), (2, 500)]
        assert "payload" not in history

        def recorded() -> dict | None:
            f = api.ok("GET", f"/v1/fires/{want}")
            return f if f["state"] == "delivered" else None

        delivery = wait_until(recorded, 20, "the delivery record to be settled delivered")
        assert delivery["kind"] == "dead-letter" and [a["http_status"] for a in delivery["attempts"]] == [200]
        assert [f["key"] for f in api.ok("GET", f"/v1/triggers/{trig['id']}/fires")["items"]] == [dead["key"], want]
        assert len(delivered_to_dlq()) == 1 and len([r for r in sink.records() if r["path"] == "/status/500"]) == 2
    finally:
        svc.stop()
