"""How a client operation turns a call into a request (:meth:`fireledger.client.Op.request`): path
parameters positionally or by name (quoted as one segment), ``from_`` for ``from``, lists
comma-separated, ``None`` left out, a model sent with only the fields set (by alias), exact bytes
with ``content=``, and a wrong call refused with ``TypeError`` naming what is wrong."""

from __future__ import annotations

import pytest

from fireledger.client import Operations
from fireledger.control.backfill import BackfillRequest
from fireledger.control.schemas import TriggerPatch


def test_path_and_query() -> None:
    path, req = Operations.list_fires.request(("tr/1",), {"from_": "2026-01-01T00:00:00Z", "limit": 5,
                                                         "state": ["failed", "expired"], "cursor": None,
                                                         "order": "desc"})
    assert path == "/v1/triggers/tr%2F1/fires"
    assert req == {"params": {"from": "2026-01-01T00:00:00Z", "limit": "5", "state": "failed,expired",
                              "order": "desc"}}
    assert Operations.get_trigger.request((), {"trigger_id": "tr_1"})[0] == "/v1/triggers/tr_1"


def test_bodies() -> None:
    _, req = Operations.amend_trigger.request(("tr_1",), {"body": TriggerPatch(jitter="0s")})
    assert req["json"] == {"jitter": "0s"}   # only the fields set: a PATCH keeps the others
    _, req = Operations.backfill_trigger.request(("tr_1",), {"body": BackfillRequest.model_validate(
        {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"})})
    assert req["json"] == {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}
    _, req = Operations.report_outcome.request(("k",), {"content": b'{"a":1}', "headers": {"webhook-id": "m"}})
    assert req["content"] == b'{"a":1}' and req["headers"] == {"content-type": "application/json", "webhook-id": "m"}


@pytest.mark.parametrize(("op", "args", "kwargs", "message"), [
    (Operations.get_trigger, (), {}, "missing the path parameter 'trigger_id'"),
    (Operations.get_trigger, ("a", "b"), {}, "takes 1 positional argument"),
    (Operations.list_triggers, (), {"colour": "red"}, "unexpected keyword argument 'colour'"),
    (Operations.get_trigger, ("a",), {"body": {}}, "takes no body"),
    (Operations.create_trigger, (), {"body": {}, "content": b"{}"}, "not both"),
])
def test_a_wrong_call_is_refused(op, args, kwargs, message) -> None:
    with pytest.raises(TypeError, match=message):
        op.request(args, dict(kwargs))
