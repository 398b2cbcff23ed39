"""The keyed payload digest (decision 0186): a trigger view and a dry run agree for payloads equal as
JSON values (key order aside), differ for different payloads and across tenants, never carry the
payload, and a payload that can no longer be opened (its tenant's key destroyed) has none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import SENTINEL, Api
from fireledger.security.digests import stored_payload_digest
from fireledger.security.tenancy import delete_tenant


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


def test_digests_compare_payloads_without_showing_them(api: Api) -> None:
    tenant_id, acme = api.tenant("acme")
    _, globex = api.tenant("globex")
    made = acme.trigger(acme.target()["id"], payload={"secret": SENTINEL, "n": [1, 2]})
    digest = made["payload_digest"]
    assert digest.startswith("hmac-sha256:") and len(digest) == len("hmac-sha256:") + 64
    assert acme.get(f"/v1/triggers/{made['id']}").json()["payload_digest"] == digest

    def dry(session, target_id: str, payload: dict) -> str:
        r = session.post("/v1/triggers/dry-run", json={"name": "d", "schedule": {"every": "1h"},
                                                       "target_id": target_id, "payload": payload})
        assert r.status_code == 200, r.text
        return str(r.json()["definition"]["payload_digest"])

    assert dry(acme, made["target_id"], {"n": [1, 2], "secret": SENTINEL}) == digest   # key order aside
    assert dry(acme, made["target_id"], {"n": [2, 1], "secret": SENTINEL}) != digest
    assert dry(globex, globex.target()["id"], {"secret": SENTINEL, "n": [1, 2]}) != digest   # tenant-bound
    amended = acme.patch(f"/v1/triggers/{made['id']}", json={"payload": {"other": True}}).json()
    assert amended["payload_digest"] == dry(acme, made["target_id"], {"other": True}) != digest
    api.assert_no_sentinel()

    version = api.store.registry.get_version(made["id"], 2)
    assert version is not None
    assert delete_tenant(api.store, tenant_id, "operator", api.clock.now().latest_us) is not None
    assert stored_payload_digest(api.store, tenant_id, made["id"], 2, version.payload) is None
