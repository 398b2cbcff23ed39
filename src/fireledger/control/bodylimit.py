"""One streaming cap on request bodies, in front of every route (pure ASGI middleware; decision 0085).

Contract:

* Every HTTP request passes through :class:`BodyLimitMiddleware` before any other middleware,
  authentication or routing. Its body is read here, chunk by chunk as it arrives (``Content-Length``
  or chunked alike), counted, and kept only up to the route's limit (:func:`limit_for`); the inner
  app is then called with the body replayed from memory. So nothing behind this middleware ever
  holds more than one limit's worth of body per request, whatever it does with the body.
* A declared ``Content-Length`` over the limit is refused before a byte of the body is read; a body
  that grows past the limit while it arrives is refused at the first chunk that crosses it. Either
  way the answer is ``413`` ``application/problem+json`` (RFC 9457, slug ``body-too-large``) with
  ``Connection: close``: the rest of the body is never read (the server closes the connection).
* A malformed ``Content-Length`` (not digits, or more than one different value) is refused ``400``.
* The inner app is not called for a refused request: an unknown route, a route that ignores its
  body, or an unauthenticated one are all capped the same way.

Time and total (decision 0092): the whole body must arrive within :data:`BODY_TIMEOUT_S` of the
first read (else ``408``, ``Connection: close``), and the bodies all requests of the process hold
at once may total at most :data:`BODY_BUDGET_BYTES` (a chunk that would pass it is answered ``503``
with ``Retry-After: 1``) — so slow or parallel bodies from unauthenticated peers cannot hold more
than that, whatever the number of connections.

Limits (bytes): ``/v1/…`` 1 MiB (a trigger's payload is capped at 64 KiB; this bounds parsing), the
signed outcome callback ``POST /v1/fires/{key}/outcome`` 64 KiB, the console's forms 4 KiB, and
every other path (health, metrics, JWKS, OpenAPI, unknown routes — none takes a body) 4 KiB.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .problems import problem

#: Largest request body accepted under ``/v1`` (the JSON API).
API_BODY_BYTES = 1024 * 1024
#: Largest signed outcome callback body (``POST /v1/fires/{key}/outcome``).
CALLBACK_BODY_BYTES = 64 * 1024
#: Largest console form body (a token of at most 512 characters and a CSRF token).
CONSOLE_BODY_BYTES = 4 * 1024
#: Every other path: none of them takes a body.
DEFAULT_BODY_BYTES = 4 * 1024
#: Time allowed for one request body to arrive, from the first read.
BODY_TIMEOUT_S = 30.0
#: Most body bytes held at once by all requests of one process.
BODY_BUDGET_BYTES = 64 * 1024 * 1024


#: The one route that authenticates by signature instead of a bearer token (the outcome callback of
#: :mod:`fireledger.control.outcomes`; the guard and this cap both recognise it by this pattern).
SIGNED_CALLBACK = re.compile(r"^/v1/fires/[^/]+/outcome$")


def is_signed_callback(method: str, path: str) -> bool:
    """Whether a request is an outcome callback (authenticated by its signature, not a bearer token)."""
    return method == "POST" and SIGNED_CALLBACK.fullmatch(path) is not None


def limit_for(method: str, path: str) -> int:
    """The body limit (bytes) of a request to ``path`` with ``method``: the smallest that applies."""
    if is_signed_callback(method, path):
        return CALLBACK_BODY_BYTES
    if path == "/v1" or path.startswith("/v1/"):
        return API_BODY_BYTES
    if path == "/console" or path.startswith("/console/"):
        return CONSOLE_BODY_BYTES
    return DEFAULT_BODY_BYTES


class BodyLimitMiddleware:
    """See the module docstring. ``limits`` maps ``(method, path)`` to a byte limit (for tests)."""

    def __init__(self, app: ASGIApp, limits: Callable[[str, str], int] = limit_for,
                 budget: int = BODY_BUDGET_BYTES, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.limits = limits
        self.budget = budget
        self.timeout_s = timeout_s
        self.held = 0   # body bytes held by requests in progress (one event loop: no lock needed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits(scope.get("method", ""), scope.get("path", ""))
        declared = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
        if declared:
            values = {v.strip() for v in declared}
            text = next(iter(values)).decode("latin-1") if len(values) == 1 else ""
            if not text.isdigit() or len(text) > 18:
                await _refuse(scope, receive, send, 400, "the Content-Length header is not one number of bytes",
                              "bad-request")
                return
            if int(text) > limit:
                await _too_large(scope, receive, send, limit)
                return
        chunks: list[bytes] = []
        size = 0
        try:
            try:
                async with asyncio.timeout(self.timeout_s):
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            return   # the client went away: nothing to answer
                        body = message.get("body", b"")
                        if size + len(body) > limit:
                            await _too_large(scope, receive, send, limit)
                            return
                        if self.held + len(body) > self.budget:
                            await _refuse(scope, receive, send, 503, "too many request bodies in progress; "
                                          "retry later", "busy", retry_after=True)
                            return
                        size += len(body)
                        self.held += len(body)
                        if body:
                            chunks.append(body)
                        if not message.get("more_body", False):
                            break
            except TimeoutError:
                await _refuse(scope, receive, send, 408, f"the request body did not arrive within "
                              f"{self.timeout_s:g} s", "body-timeout")
                return
            data = b"".join(chunks)
            del chunks
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": data, "more_body": False}
                return await receive()   # after the body: wait for the disconnect, as the server would

            await self.app(scope, replay, send)
        finally:
            self.held -= size


async def _too_large(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    await _refuse(scope, receive, send, 413, f"the request body is larger than {limit} bytes", "body-too-large")


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str, slug: str,
                  retry_after: bool = False) -> None:
    """Answer a problem and close the connection (the unread rest of the body is never read)."""
    headers = {"Connection": "close", **({"Retry-After": "1"} if retry_after else {})}
    await problem(status, detail, slug=slug, headers=headers)(scope, receive, send)


__all__ = ["API_BODY_BYTES", "BODY_BUDGET_BYTES", "BODY_TIMEOUT_S", "CALLBACK_BODY_BYTES", "CONSOLE_BODY_BYTES",
           "DEFAULT_BODY_BYTES", "SIGNED_CALLBACK", "BodyLimitMiddleware", "is_signed_callback", "limit_for"]
