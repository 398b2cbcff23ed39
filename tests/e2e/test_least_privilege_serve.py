"""The least-privilege grants of issue 17 item 4 on real processes (decisions 0175–0177): a
``fireledger serve`` process, tokens minted through its API. An ``author`` is refused run-now (403
naming ``runner``) and a ``runner`` runs the trigger; the manual fire and the scheduled one reach the
tenant's queue and a ``consumer`` token — refused everything else — pulls and acks both; a
``policy`` token changes the quota through the API and the operator command reads the change from
the store, with its audit row."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from e2e import Api, Service, cli, new_tenant, wait_until
from fireledger.recurrence import format_instant

pytestmark = pytest.mark.e2e


def test_runner_consumer_and_policy_grants_on_serve(e2e_db, tmp_path) -> None:
    db = e2e_db   # [postgres] is a long form (decision 0203)
    svc = Service(db, tmp_path).start(timeout_s=60)
    try:
        tenant_id, token = new_tenant(db)
        owner = Api(svc.base, token)

        def mint(*roles: str) -> Api:
            made = owner.ok("POST", "/v1/principals", {"name": "-".join(roles), "roles": list(roles)}, 201)
            return Api(svc.base, made["token"])

        author, runner, consumer, policy = mint("author", "reader"), mint("runner"), mint("consumer"), mint("policy")
        queue = owner.ok("POST", "/v1/targets", {"kind": "queue"}, 201)["id"]
        at = format_instant(datetime.fromtimestamp(int(time.time()) + 2, tz=UTC))
        trig = author.ok("POST", "/v1/triggers", {"name": "q", "schedule": {"at": at}, "target_id": queue,
                                                   "jitter": "0s", "payload": {"n": 1}}, 201)
        status, problem = author.call("POST", f"/v1/triggers/{trig['id']}/run")
        assert (status, problem["detail"]) == (403, "this token lacks the role 'runner'")
        manual = runner.ok("POST", f"/v1/triggers/{trig['id']}/run", None, 201)
        assert manual["kind"] == "manual"

        got: dict[str, dict] = {}

        def pulled_both() -> bool:
            for m in consumer.ok("POST", f"/v1/queues/{queue}/pull", {"max": 10})["messages"]:
                got[m["fire_key"]] = m
            return len(got) == 2

        wait_until(pulled_both, 30, "the manual and the scheduled fire on the queue")
        assert {m["body"]["kind"] for m in got.values()} == {"manual", "scheduled"}
        assert all(m["body"]["payload"] == {"n": 1} for m in got.values())
        acked = consumer.ok("POST", f"/v1/queues/{queue}/ack", {"fire_keys": sorted(got)})
        assert sorted(acked["acked"]) == sorted(got) and acked["not_found"] == []
        for method, path in (("GET", f"/v1/queues/{queue}"), ("GET", "/v1/triggers"),
                             ("POST", f"/v1/triggers/{trig['id']}/run"), ("PATCH", "/v1/tenant/quota")):
            status, _ = consumer.call(method, path, {"inflight": 5} if method == "PATCH" else None)
            assert status == 403, (method, path)

        status, _ = author.call("PATCH", "/v1/tenant/quota", {"inflight": 5})
        assert status == 403
        changed = policy.ok("PATCH", "/v1/tenant/quota", {"fires_per_s": 40, "inflight": 5})
        assert changed["prior"] == {"fires_per_s": 100.0, "inflight": 100, "catchup_fraction": 0.1}
        seen = json.loads(cli("tenant", "quota", tenant_id, "--db", db, "--json").stdout)
        assert (seen["fires_per_s"], seen["inflight"]) == (40.0, 5)
        rows = [a for a in owner.ok("GET", "/v1/audit?limit=1000")["items"] if a["action"] == "tenant.quota"]
        assert [(r["prior"]["inflight"], r["new"]["inflight"]) for r in rows] == [(100, 5)]
    finally:
        svc.stop()
