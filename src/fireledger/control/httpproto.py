"""uvicorn's httptools protocol with bounds on what an unauthenticated peer can hold (decision 0092).

Stock uvicorn (httptools) buffers a request head of any size (a 200 MiB header was read into memory),
keeps a connection that never sends a request open forever, lets a head trickle in a byte at a time
for as long as the peer likes, and accepts connections until the process runs out of file
descriptors (and with them the store's and the dispatcher's sockets). :class:`BoundedHttpToolsProtocol`
closes those gaps; the body is bounded separately by :mod:`fireledger.control.bodylimit`.

Contract (per connection, per process):

* **Head size.** The request line and headers of one request may take at most
  :data:`HEAD_MAX_BYTES` (64 KiB). A head that grows past it is answered ``431`` problem+json with
  ``Connection: close`` and the rest is never read. (The parser holds at most that plus one read.)
* **Head time.** From the connection's start, or from the first byte of a later request's head, the
  whole head must arrive within :data:`HEAD_TIMEOUT_S` (10 s), however slowly bytes trickle in;
  otherwise ``408`` and the connection is closed. Between requests uvicorn's keep-alive timeout
  (5 s) applies as before.
* **Connections.** At most :func:`max_connections` are open at once
  (``FIRELEDGER_MAX_CONNECTIONS``, default the smaller of 1000 and a quarter of the process's
  open-file limit); one more is answered ``503`` with ``Retry-After: 1`` and closed at once,
  without reading from it.
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Largest request head (request line plus headers) accepted.
HEAD_MAX_BYTES = 64 * 1024
#: Time allowed for one request head to arrive completely.
HEAD_TIMEOUT_S = 10.0
#: Environment variable: most simultaneous HTTP connections of one control-plane process.
MAX_CONNECTIONS_ENV = "FIRELEDGER_MAX_CONNECTIONS"


def max_connections(env: dict[str, str] | None = None) -> int:
    """The connection cap: ``FIRELEDGER_MAX_CONNECTIONS`` (an integer ≥ 1), else the smaller of
    1000 and a quarter of the soft open-file limit (at least 16). Raises ``ValueError`` naming the
    variable when it is set to anything else."""
    from fireledger.settings import parse_max_connections, process_env

    return connection_cap(parse_max_connections(process_env() if env is None else env))


def connection_cap(configured: int | None) -> int:
    """``configured`` (``Settings.max_connections``), else the default from the open-file limit."""
    if configured is not None:
        return configured
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 1000
    return max(16, min(1000, soft // 4))


def _problem_bytes(status: int, reason: str, slug: str, detail: str, extra: str = "") -> bytes:
    body = json.dumps({"type": f"urn:fireledger:problem:{slug}", "title": reason, "status": status,
                       "detail": detail}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n").encode() + body


_TOO_LARGE = _problem_bytes(431, "Request Header Fields Too Large", "head-too-large",
                            f"the request line and headers are larger than {HEAD_MAX_BYTES} bytes")
_TOO_SLOW = _problem_bytes(408, "Request Timeout", "head-timeout",
                           f"the request line and headers did not arrive within {HEAD_TIMEOUT_S:g} s")
_BUSY = _problem_bytes(503, "Service Unavailable", "too-many-connections",
                       "too many open connections; retry later", "retry-after: 1\r\n")


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """See the module docstring. Pass it as ``uvicorn.Config(http=...)``; the cap on connections
    is read once per process (:func:`max_connections`)."""

    cap: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True          # waiting for (or reading) a request head
        self._head_bytes = 0          # bytes of the current head fed to the parser so far
        self._heads = 0               # heads completed on this connection
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        if BoundedHttpToolsProtocol.cap is None:
            BoundedHttpToolsProtocol.cap = max_connections()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > (self.cap or 1):
            self._refuse(_BUSY)
            return
        self._arm_head_timer()   # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        was_head, heads = self._in_head, self._heads
        if was_head and self._head_timer is None:
            self._arm_head_timer()
        super().data_received(data)
        if was_head and self._heads == heads and not self._refused:
            # No head was completed by this chunk: all of it belongs to one still incomplete, which
            # the parser holds (a chunk that completes a head is not counted: at most one read).
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_MAX_BYTES:
                self._refuse(_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    # --- helpers ------------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head and not self._refused:
            self._refuse(_TOO_SLOW)

    def _refuse(self, answer: bytes) -> None:
        """Answer ``answer`` (a complete response) and close; nothing more is read."""
        self._refused = True
        self._cancel_head_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()


__all__ = ["HEAD_MAX_BYTES", "HEAD_TIMEOUT_S", "MAX_CONNECTIONS_ENV", "BoundedHttpToolsProtocol",
           "max_connections"]
