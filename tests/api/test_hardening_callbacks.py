"""Hardening (issue 13, finding 12) — the class: *a signed callback speaks for one fire of a live
target and tenant only*. The body must carry ``fire_key`` equal to the path's key, under the
signature, so a callback signed for one fire cannot be replayed at another fire of the same target;
callbacks for a fire whose target or tenant was deleted are refused with a clear problem. Real API
(TestClient over the app), real SQLite store, real Standard Webhooks signatures."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import Api, assert_problem
from fireledger.control.outcomes import callback
from fireledger.dispatch.signing import build_headers
from fireledger.domain.keys import FireKey
from test_dispatch_api import deliver_all, one_shot

S = 1_000_000


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


def _post(api: Api, key: str, body: bytes, headers: dict[str, str]):
    return api.anon.post(f"/v1/fires/{key}/outcome", content=body, headers=headers)


def test_a_callback_is_bound_to_the_fire_it_names(api: Api) -> None:
    _, s = api.tenant("acme")
    target = s.post("/v1/targets", json={"kind": "queue"}).json()
    secret = target["secret"]
    one_shot(s, target["id"], api)
    one_shot(s, target["id"], api)
    api.clock.advance(61 * S)
    first, second = sorted(deliver_all(api))
    now_s = api.clock.now().latest_us // S

    # A body without the binding, correctly signed: refused, naming the field.
    raw = b'{"outcome": "succeeded"}'
    h = {**build_headers(secret, "m0", now_s, raw), "content-type": "application/json"}
    assert_problem(_post(api, first, raw, h), 422, "fire_key")

    # A callback signed for the first fire, replayed at the second fire's path: refused.
    raw, h = callback(secret, first, "failed", msg_id="m1", timestamp=now_s)
    body = assert_problem(_post(api, second, raw, h), 422, "fire_key")
    assert "path" in body["errors"][0]["problem"]
    assert api.store.dispatch.get_outcome(FireKey.parse(second)) is None

    # At its own path the same callback is accepted; the other fire stays without an outcome.
    assert _post(api, first, raw, h).status_code == 201
    assert api.store.dispatch.get_outcome(FireKey.parse(first))[0] == "failed"
    assert api.store.dispatch.get_outcome(FireKey.parse(second)) is None

    # The binding is under the signature: editing it breaks the signature (401, not a 422).
    forged = json.dumps({"fire_key": second, "outcome": "failed"}).encode()
    assert_problem(_post(api, second, forged, h), 401)


def test_callbacks_for_a_deleted_target_or_tenant_are_refused(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    target = s.post("/v1/targets", json={"kind": "queue"}).json()
    trigger = one_shot(s, target["id"], api)
    api.clock.advance(61 * S)
    [key] = deliver_all(api)
    now_s = api.clock.now().latest_us // S

    assert s.delete(f"/v1/triggers/{trigger['id']}").status_code == 204
    assert s.delete(f"/v1/targets/{target['id']}").status_code == 204
    raw, h = callback(target["secret"], key, "succeeded", msg_id="m1", timestamp=now_s)
    body = assert_problem(_post(api, key, raw, h), 409)
    assert f"target {target['id']} was deleted" in body["detail"]
    assert api.store.dispatch.get_outcome(FireKey.parse(key)) is None

    # Another tenant: its tenant is deleted (the target still exists as a row).
    other_id, o = api.tenant("other")
    t2 = o.post("/v1/targets", json={"kind": "queue"}).json()
    one_shot(o, t2["id"], api)
    api.clock.advance(61 * S)
    [key2] = deliver_all(api)
    assert api.store.trust.delete_tenant(other_id, "test", api.clock.now().latest_us) is not None
    raw, h = callback(t2["secret"], key2, "succeeded", msg_id="m2", timestamp=api.clock.now().latest_us // S)
    body = assert_problem(_post(api, key2, raw, h), 409)
    assert "tenant was deleted" in body["detail"]
    assert api.store.dispatch.get_outcome(FireKey.parse(key2)) is None
    assert tenant_id != other_id
