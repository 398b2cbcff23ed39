"""The clients: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio), on httpx.

Both carry every operation of :class:`~fireledger.client.ops.Operations` as a method. A response of
2xx is parsed into the operation's model; anything else raises :class:`ApiError` with the problem
details the server sent (RFC 9457: ``status``, ``detail`` and, for a 422, ``errors`` naming each
field). A connection failure raises httpx's own ``TransportError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2 as httpx

from fireledger.errors import FireledgerError

from .ops import Awaiting, Blocking, Bound, Op, Operations, page_items

USER_AGENT = "fireledger-client"
DEFAULT_TIMEOUT_S = 30.0


class ApiError(FireledgerError):
    """The API refused a request: ``status`` and the problem document (``detail``; ``errors`` is the
    list of ``{"field", "problem"}`` of a validation problem, else empty)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
        self.errors: list[dict[str, str]] = [e for e in problem.get("errors") or [] if isinstance(e, dict)]
        fields = "; ".join(f"{e.get('field')}: {e.get('problem')}" for e in self.errors)
        super().__init__(f"HTTP {status}: {self.detail}" + (f" ({fields})" if fields else ""))


def _problem_of(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {"detail": f"HTTP {resp.status_code} {resp.reason_phrase}"}


def _result(op: Op[Any], resp: httpx.Response) -> Any:
    if resp.status_code >= 300:
        raise ApiError(resp.status_code, _problem_of(resp))
    return op.parse(resp.status_code, None if resp.status_code == 204 or not resp.content else resp.json())


def _headers(token: str | None) -> dict[str, str]:
    out = {"user-agent": USER_AGENT, "accept": "application/json"}
    if token:
        out["authorization"] = f"Bearer {token}"
    return out


def _bound(method: Any) -> Op[Any]:
    if not isinstance(method, Bound):
        raise TypeError("pass an operation of this client, e.g. client.list_triggers")
    return method.op


class Client(Operations, Blocking):
    """A blocking client of one deployment as one principal::

        with Client("http://127.0.0.1:8080", token) as api:
            trigger = api.get_trigger("tr_…")

    ``base_url`` is the origin (``/v1`` is part of each operation's path); ``token`` the bearer token;
    ``transport`` an httpx transport (tests may pass an ``ASGITransport``)."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout, transport=transport)

    def call(self, op: Op[Any], *args: Any, **kwargs: Any) -> Any:
        """Send ``op`` (what each operation method does)."""
        path, request = op.request(args, kwargs)
        return _result(op, self.http.request(op.method, path, **request))

    def items(self, method: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Every item of a paged listing (``client.items(client.list_triggers)``), following ``next``."""
        op = _bound(method)
        cursor = kwargs.pop("cursor", None)
        while True:
            items, cursor = page_items(self.call(op, *args, cursor=cursor, **kwargs))
            yield from items
            if not cursor:
                return

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(Operations, Awaiting):
    """The asyncio twin of :class:`Client`: every operation is a coroutine function::

        async with AsyncClient("http://127.0.0.1:8080", token) as api:
            trigger = await api.get_trigger("tr_…")
    """

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, headers=_headers(token), timeout=timeout,
                                      transport=transport)

    async def call(self, op: Op[Any], *args: Any, **kwargs: Any) -> Any:
        """Send ``op`` (what each operation method does)."""
        path, request = op.request(args, kwargs)
        return _result(op, await self.http.request(op.method, path, **request))

    async def items(self, method: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Every item of a paged listing, following ``next``."""
        op = _bound(method)
        cursor = kwargs.pop("cursor", None)
        while True:
            items, cursor = page_items(await self.call(op, *args, cursor=cursor, **kwargs))
            for item in items:
                yield item
            if not cursor:
                return

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = ["ApiError", "AsyncClient", "Client"]
