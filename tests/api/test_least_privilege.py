"""Least-privilege grants of issue 17 item 4 (seed ADR-15, invariant 13; decisions 0175–0177):

* ``runner`` runs a trigger now; ``author`` alone no longer may (403 naming ``runner``, audited);
* ``consumer`` pulls and acks its tenant's queues and nothing else; ``admin`` still may;
* the tenant's dispatch quota is read by a ``reader`` and changed by ``policy`` through the API,
  audited with the prior value, bounded by the operator's ceiling, and in force at the next claim.

Each grant and each refusal is checked on the real app over a real SQLite store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apikit import Api, Session, assert_problem
from fireledger.control.auth import hash_token
from test_dispatch_api import deliver_all, one_shot

S = 1_000_000


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a   # (no sentinel check: a queue pull hands the payload to its consumer, by design)
    a.close()


def _principal(owner: Session, *roles: str) -> Session:
    r = owner.post("/v1/principals", json={"name": "-".join(roles), "roles": list(roles)})
    assert r.status_code == 201, r.text
    assert r.json()["roles"] == sorted(roles)
    return Session(owner.api, r.json()["token"])


def _denials(api: Api, head: int) -> list[dict[str, Any]]:
    return [a.as_json() for a in api.store.trust.audit_rows(head) if a.action == "denied"]


def _forbidden(api: Api, resp: Any, role: str, request: str, head: int) -> None:
    """A 403 problem naming ``role``, and exactly one audited refusal saying the same."""
    body = assert_problem(resp, 403)
    assert body["detail"] == f"this token lacks the role {role!r}"
    [row] = _denials(api, head)
    assert row["new"]["missing_role"] == role and row["new"]["request"] == request


def test_run_now_needs_the_runner_grant_and_an_author_alone_is_refused(api: Api) -> None:
    _, owner = api.tenant("acme")
    trigger = owner.trigger(owner.target()["id"], {"every": "1h"})
    author = _principal(owner, "author", "reader")
    runner = _principal(owner, "runner")
    head, _ = api.store.trust.audit_head()
    before = api.snapshot()
    _forbidden(api, author.post(f"/v1/triggers/{trigger['id']}/run"), "runner",
               f"POST /v1/triggers/{trigger['id']}/run", head)
    assert api.snapshot() == before                       # nothing written for the refusal
    r = runner.post(f"/v1/triggers/{trigger['id']}/run")
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "manual" and r.json()["state"] == "pending"
    # The runner grant is for manual runs only: it cannot author, read or redrive.
    head, _ = api.store.trust.audit_head()
    _forbidden(api, runner.post(f"/v1/triggers/{trigger['id']}/pause"), "author",
               f"POST /v1/triggers/{trigger['id']}/pause", head)
    assert_problem(runner.get("/v1/triggers"), 403)
    # The owner's token (tenant create) carries every role, the new ones included.
    api.clock.advance(S)   # a second manual run at the same instant would be the same fire (409)
    assert owner.post(f"/v1/triggers/{trigger['id']}/run").status_code == 201


def test_a_consumer_pulls_and_acks_its_queues_and_nothing_else(api: Api) -> None:
    _, owner = api.tenant("acme")
    qid = owner.post("/v1/targets", json={"kind": "queue"}).json()["id"]
    trigger = one_shot(owner, qid, api)
    one_shot(owner, qid, api)
    api.clock.advance(61 * S)
    assert len(deliver_all(api)) == 2
    consumer = _principal(owner, "consumer")
    got = consumer.post(f"/v1/queues/{qid}/pull", json={"max": 1, "visibility_timeout": "10s"})
    assert got.status_code == 200, got.text
    [msg] = got.json()["messages"]
    assert msg["body"]["fire_key"] == msg["fire_key"] and msg["receives"] == 1
    acked = consumer.post(f"/v1/queues/{qid}/ack", json={"fire_keys": [msg["fire_key"]]})
    assert acked.status_code == 200 and acked.json() == {"acked": [msg["fire_key"]], "not_found": []}
    # An admin keeps pulling (what queue consumers held before the consumer grant existed).
    [left] = owner.post(f"/v1/queues/{qid}/pull", json={}).json()["messages"]
    assert left["fire_key"] != msg["fire_key"]
    # Nothing else: reading the queue, triggers, history, running, principals — each refused by name.
    for method, path, role in (("GET", f"/v1/queues/{qid}", "reader"), ("GET", "/v1/triggers", "reader"),
                               ("GET", f"/v1/fires/{msg['fire_key']}", "reader"),
                               ("POST", f"/v1/triggers/{trigger['id']}/run", "runner"),
                               ("GET", "/v1/principals", "admin"), ("GET", "/v1/tenant/quota", "reader")):
        head, _ = api.store.trust.audit_head()
        _forbidden(api, consumer.request(method, path), role, f"{method} {path}", head)
    # Other principals without consumer or admin are refused the pull and the ack, naming consumer.
    for roles in (("reader",), ("author", "runner", "policy", "backfill", "reader")):
        s = _principal(owner, *roles)
        head, _ = api.store.trust.audit_head()
        _forbidden(api, s.post(f"/v1/queues/{qid}/pull", json={}), "consumer", f"POST /v1/queues/{qid}/pull", head)
        head, _ = api.store.trust.audit_head()
        _forbidden(api, s.post(f"/v1/queues/{qid}/ack", json={"fire_keys": [left["fire_key"]]}), "consumer",
                   f"POST /v1/queues/{qid}/ack", head)
    # Another tenant's consumer sees no such queue.
    _, other = api.tenant("other")
    assert_problem(_principal(other, "consumer").post(f"/v1/queues/{qid}/pull", json={}), 404)


def test_the_policy_role_changes_the_quota_audited_with_the_prior_value(api: Api) -> None:
    tenant_id, owner = api.tenant("acme")
    reader = _principal(owner, "reader")
    policy = _principal(owner, "policy")
    author = _principal(owner, "author", "runner", "backfill", "consumer", "reader")
    assert reader.get("/v1/tenant/quota").json() == {"fires_per_s": 100.0, "inflight": 100,
                                                     "catchup_fraction": 0.1, "catchup_per_s": 10.0, "prior": None}
    head, _ = api.store.trust.audit_head()
    _forbidden(api, author.patch("/v1/tenant/quota", json={"fires_per_s": 500}), "policy",
               "PATCH /v1/tenant/quota", head)
    assert api.store.dispatch.tenant_quota(tenant_id) == (100.0, 100, 0.1)
    r = policy.patch("/v1/tenant/quota", json={"fires_per_s": 250, "catchup_fraction": 0.2})
    assert r.status_code == 200, r.text
    assert r.json() == {"fires_per_s": 250.0, "inflight": 100, "catchup_fraction": 0.2, "catchup_per_s": 50.0,
                        "prior": {"fires_per_s": 100.0, "inflight": 100, "catchup_fraction": 0.1}}
    assert api.store.dispatch.tenant_quota(tenant_id) == (250.0, 100, 0.2)   # what the next claim reads
    [row] = [a for a in owner.get("/v1/audit", params={"limit": 1000}).json()["items"]
             if a["action"] == "tenant.quota"]
    assert row["prior"] == {"fires_per_s": 100.0, "inflight": 100, "catchup_fraction": 0.1}
    assert row["new"] == {"fires_per_s": 250.0, "inflight": 100, "catchup_fraction": 0.2}
    assert row["actor"] == api.store.trust.principal_by_token_hash(hash_token(policy.token or "")).id
    # Bad input is refused by name and changes nothing; another tenant's quota is untouched.
    other_id, _ = api.tenant("other")
    for body, field in (({}, "body"), ({"fires_per_s": 0.001}, "fires_per_s"),
                        ({"catchup_fraction": 0.001}, "catchup_fraction"), ({"inflight": 0}, "inflight"),
                        ({"catchup_fraction": 1.5}, "catchup_fraction"), ({"fires_per_s": None}, "fires_per_s"),
                        ({"burst": 3}, "burst"), ({"fires_per_s": 1001}, "fires_per_s"),
                        ({"inflight": 1001}, "inflight")):
        assert_problem(policy.patch("/v1/tenant/quota", json=body), 422, field)
    assert api.store.dispatch.tenant_quota(tenant_id) == (250.0, 100, 0.2)
    assert api.store.dispatch.tenant_quota(other_id) == (100.0, 100, 0.1)


def test_the_operator_ceiling_bounds_what_a_tenant_gives_itself(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant_id, owner = api.tenant("acme")
    monkeypatch.setenv("FIRELEDGER_MAX_QUOTA_FIRES_PER_S", "5000")
    monkeypatch.setenv("FIRELEDGER_MAX_QUOTA_INFLIGHT", "20")
    assert owner.patch("/v1/tenant/quota", json={"fires_per_s": 5000}).status_code == 200
    body = assert_problem(owner.patch("/v1/tenant/quota", json={"inflight": 21}), 422, "inflight")
    assert "ceiling 20" in body["detail"]
    assert owner.patch("/v1/tenant/quota", json={"inflight": 20}).status_code == 200
    assert api.store.dispatch.tenant_quota(tenant_id) == (5000.0, 20, 0.1)
