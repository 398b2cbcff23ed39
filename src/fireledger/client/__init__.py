"""A typed Python client of the ``/v1`` API, blocking (:class:`Client`) and asyncio
(:class:`AsyncClient`), on httpx (decision 0187)::

    from fireledger.client import Client
    with Client("http://127.0.0.1:8080", token) as api:
        target = api.create_target(body={"kind": "queue"})
        trigger = api.create_trigger(body={"name": "report", "schedule": {"every": "90s"}, "target_id": target.id})
        print(api.preview_trigger(trigger.id, count=3).items[0].instant)

Every ``/v1`` operation is a method named after the server's handler (:class:`~.ops.Operations`,
one line each); request and response models are the server's own pydantic models, so they cannot
drift from ``/openapi.json`` (``tests/api/test_client_schema.py`` checks the table against it). A
refusal raises :class:`ApiError` carrying the problem details.
"""

from __future__ import annotations

from .core import ApiError, AsyncClient, Client
from .ops import Op, Operations, operations

__all__ = ["ApiError", "AsyncClient", "Client", "Op", "Operations", "operations"]
