"""The typed client (``fireledger.client``) against the server's ``/openapi.json`` and the live app.

* Every ``/v1`` operation of the schema has a client operation, and each one's query and path
  parameters and request/response model fields (names, required-ness, types; nested models too)
  match the schema. The failure names each missing operation and gives the line to add.
* The comparison is not vacuous: a doctored schema (a new route, a changed field, a dropped
  parameter, a removed route) yields exactly those disagreements.
* Both clients (blocking and asyncio) drive the real app: models parsed, problems raised as
  :class:`ApiError` naming the field, paging followed, payload digests as the dry run computes them.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from apikit import Api
from fireledger.client import ApiError, AsyncClient, Client, operations
from fireledger.client.conformance import disagreements
from fireledger.control.schemas import TriggerView


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path, allow_private_targets=True)
    yield a
    a.close()


def _schema(api: Api) -> dict[str, Any]:
    doc: dict[str, Any] = api.anon.get("/openapi.json").json()
    return doc


def test_client_covers_every_v1_operation_and_matches_its_models(api: Api) -> None:
    doc = _schema(api)
    found = disagreements(doc)
    assert found == [], "the client and /openapi.json disagree:\n" + "\n".join(found)
    v1 = {(m.upper(), p) for p, ops in doc["paths"].items() if p.startswith("/v1") for m in ops}
    assert {(op.method, op.path) for op in operations().values()} == v1
    assert len(v1) >= 37   # the routes of this release (more may come)


def test_a_disagreement_names_the_operation_and_the_field(api: Api) -> None:
    doc = copy.deepcopy(_schema(api))
    doc["paths"]["/v1/calendars"] = {"post": {
        "operationId": "create_calendar_v1_calendars_post",
        "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicyPatch"}}}},
        "responses": {"201": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/TriggerView"}}}}},
    }}
    doc["components"]["schemas"]["RetryView"]["properties"]["max_attempts"] = {"type": "string"}
    doc["paths"]["/v1/targets"]["get"]["parameters"] = [
        p for p in doc["paths"]["/v1/targets"]["get"]["parameters"] if p["name"] != "cursor"]
    del doc["paths"]["/v1/audit"]
    found = disagreements(doc)
    assert found[0] == ('missing: POST /v1/calendars (operationId create_calendar_v1_calendars_post): add to '
                        'fireledger.client.ops.Operations: create_calendar = Op[TriggerView]("POST", "/v1/calendars", '
                        'TriggerView, body=PolicyPatch)')
    assert "stale: GET /v1/audit (list_audit) is not in the schema" in found
    assert ("GET /v1/targets (list_targets): query parameters ['cursor', 'limit'] in the client, ['limit'] "
            "in the schema") in found
    assert ("GET /v1/triggers/{trigger_id} (get_trigger) response RetryView: field 'max_attempts' is required "
            "integer in the client, required string in the schema") in found


def _client(api: Api, token: str | None) -> Client:
    # The app under the test client's own transport: the same event loop and lifespan as apikit's.
    return Client("http://testserver", token, transport=api.http._transport)


def test_the_blocking_client_drives_the_api(api: Api) -> None:
    _, owner = api.tenant("acme")
    with _client(api, owner.token) as c:
        target = c.create_target(body={"kind": "queue"})
        assert target.secret.startswith("whsec_") and target.verification.state == "verified"
        made = [c.create_trigger(body={"name": f"t{i}", "schedule": {"every": "90s"}, "target_id": target.id,
                                       "payload": {"n": i, "k": "v"}}) for i in range(3)]
        assert isinstance(made[0], TriggerView) and made[0].schedule["every"] == "1m30s"
        dry = c.dry_run_create(body={"name": "t0", "schedule": {"every": "90s"}, "target_id": target.id,
                                     "payload": {"k": "v", "n": 0}}, count=2)
        assert dry.definition.payload_digest == made[0].payload_digest != made[1].payload_digest
        assert sorted(t.name for t in c.items(c.list_triggers, limit=2)) == ["t0", "t1", "t2"]   # two pages
        paused = c.pause_trigger(made[0].id)
        assert paused.state == "paused" and c.get_trigger(made[0].id).state == "paused"
        assert c.preview_trigger(made[1].id, count=2).items[0].instant.endswith("Z")
        assert c.delete_trigger(made[2].id) is None
        with pytest.raises(ApiError) as bad:
            c.create_trigger(body={"name": "bad", "schedule": {"cron": "61 * * * *", "zone": "UTC"},
                                   "target_id": target.id})
        assert bad.value.status == 422 and any(e["field"].startswith("schedule") for e in bad.value.errors)
        with pytest.raises(ApiError) as gone:
            c.get_trigger(made[2].id)
        assert gone.value.status == 404
        with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
            c.list_triggers(colour="red")
    with _client(api, None) as anon:
        with pytest.raises(ApiError) as unauth:
            anon.list_triggers()
        assert unauth.value.status == 401
        assert anon.triggers_schema()["$id"].endswith("/triggers.json")   # public: no token


def test_the_async_client_drives_the_api(api: Api) -> None:
    _, owner = api.tenant("acme")

    async def scenario() -> tuple[list[str], int]:
        transport = httpx2.ASGITransport(app=api.app)
        async with AsyncClient("http://testserver", owner.token, transport=transport) as c:
            target = await c.create_target(body={"kind": "queue"})
            for name in ("a", "b", "c"):
                await c.create_trigger(body={"name": name, "schedule": {"every": "1h"}, "target_id": target.id})
            names = [t.name async for t in c.items(c.list_triggers, limit=1)]
            try:
                await c.get_target("tg_missing")
            except ApiError as exc:
                return names, exc.status
            return names, 200

    names, status = asyncio.run(scenario())
    assert sorted(names) == ["a", "b", "c"] and status == 404
