"""A trigger's retry policy through the API (decision 0147): set at create, amended field by field (a
new version each time, stored with the version's policies), shown in the trigger, the dry run and the
stored version; bad values refused with a problem naming ``retry.<field>`` and nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apikit import Api, assert_problem

DEFAULT = {"max_attempts": 8, "min_backoff": "1s", "max_backoff": "5m", "max_event_age": None}


@pytest.fixture
def api(tmp_path: Path):
    a = Api(tmp_path)
    yield a
    a.assert_no_sentinel()
    a.close()


def test_retry_is_set_amended_and_stored_with_the_version(api: Api) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    plain = s.trigger(tg["id"])
    assert plain["retry"] == DEFAULT                                # defaults = the behaviour before 0147
    policy = {"max_attempts": 3, "min_backoff": "2s", "max_backoff": "1m", "max_event_age": "10m"}
    t = s.trigger(tg["id"], retry=policy)
    assert t["retry"] == policy
    assert s.get(f"/v1/triggers/{t['id']}").json()["retry"] == policy
    v1 = api.store.registry.get_version(t["id"], 1)
    assert v1 is not None
    assert (v1.policies.max_attempts, v1.policies.min_backoff_s, v1.policies.max_backoff_s,
            v1.policies.max_event_age_s) == (3, 2.0, 60.0, 600)
    # An amendment may send one field: the others keep their value; null removes the age bound.
    r = s.patch(f"/v1/triggers/{t['id']}", json={"retry": {"max_attempts": 185, "max_event_age": None}})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 2
    assert r.json()["retry"] == {**policy, "max_attempts": 185, "max_event_age": None}
    v1_again = api.store.registry.get_version(t["id"], 1)
    assert v1_again is not None and v1_again.policies.max_attempts == 3     # version 1 kept as it was
    # The dry run shows the policy create would store.
    dry = s.post("/v1/triggers/dry-run", json={"name": "d", "schedule": {"every": "60s"}, "target_id": tg["id"],
                                               "retry": {"max_attempts": 2}})
    assert dry.status_code == 200, dry.text
    assert dry.json()["definition"]["retry"] == {**DEFAULT, "max_attempts": 2}


BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_attempts": 0}, "retry.max_attempts"),
    ({"max_attempts": 186}, "retry.max_attempts"),
    ({"max_attempts": True}, "retry.max_attempts"),
    ({"min_backoff": "0s"}, "retry.min_backoff"),
    ({"min_backoff": "soon"}, "retry.min_backoff"),
    ({"max_backoff": "2h"}, "retry.max_backoff"),
    ({"min_backoff": "2m", "max_backoff": "1m"}, "retry.min_backoff"),
    ({"max_event_age": "30s"}, "retry.max_event_age"),
    ({"max_event_age": "1500ms"}, "retry.max_event_age"),
    ({"max_event_age": "25h"}, "retry.max_event_age"),
    ({"attempts": 3}, "retry.attempts"),
]


@pytest.mark.parametrize(("retry", "field"), BAD, ids=[f for _, f in BAD])
def test_a_bad_retry_field_is_named_and_nothing_is_stored(api: Api, retry: dict[str, Any], field: str) -> None:
    _, s = api.tenant("acme")
    tg = s.target()
    t = s.trigger(tg["id"], retry={"max_attempts": 4, "max_backoff": "5m"})
    before = api.snapshot()
    body = {"name": "x", "schedule": {"every": "60s"}, "target_id": tg["id"], "retry": retry}
    assert_problem(s.post("/v1/triggers", json=body), 422, field)
    assert_problem(s.patch(f"/v1/triggers/{t['id']}", json={"retry": retry}), 422, field)
    assert api.snapshot() == before


def test_an_amendment_is_checked_against_the_stored_backoffs(api: Api) -> None:
    _, s = api.tenant("acme")
    t = s.trigger(s.target()["id"], retry={"max_backoff": "30s"})
    # min_backoff alone, above the stored max_backoff: refused naming the field sent.
    p = assert_problem(s.patch(f"/v1/triggers/{t['id']}", json={"retry": {"min_backoff": "1m"}}), 422,
                       "retry.min_backoff")
    assert "max_backoff (30s)" in p["detail"]
    assert_problem(s.patch(f"/v1/triggers/{t['id']}", json={"retry": None}), 422, "retry")
    assert_problem(s.patch(f"/v1/triggers/{t['id']}", json={"retry": 3}), 422, "retry")
