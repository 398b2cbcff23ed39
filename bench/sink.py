"""The benchmark sink: one fast HTTP endpoint shared by every system under test (fireledger and
the peers), in its own process, so the same receiver bounds every figure.

    .venv/bin/python bench/sink.py --port 0 --port-file PATH [--secret whsec_…] [--sample-every 100]

A raw asyncio protocol on uvloop (no framework): HTTP/1.1 keep-alive, ``Content-Length`` bodies.
Every POST (any path) is answered ``200`` at once and recorded on arrival as
``[arrival time.time_ns(), identity]`` where the identity is

* the ``fireledger-fire-key`` header when present (fireledger's dispatch: the key carries the
  scheduled instant), else
* the request body (the peers' jobs POST a small JSON object ``{"id": …, "s": scheduled µs}``).

Signatures are NOT verified per request (that would make the sink the bottleneck). Every
``--sample-every``-th request carrying a ``webhook-signature`` is verified with the Standard
Webhooks secret against its arrival time, to prove that delivery is signed; the counts are in
``/_admin/stats``.

Admin (GET only; GETs are never recorded):

    GET /_admin/count                 {"count": N}
    GET /_admin/records?since=K       {"records": [[ns, identity], ...], "next": K'}
    GET /_admin/stats                 counts, signature sample results, parse errors
    GET /_admin/clear                 forget every record (and reset the counters)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fireledger.dispatch.signing import SignatureError, verify  # noqa: E402

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024


class State:
    def __init__(self, secret: str | None, sample_every: int) -> None:
        self.secret = secret
        self.sample_every = max(1, sample_every)
        self.records: list[tuple[int, str]] = []
        self.signed_seen = 0
        self.sampled = 0
        self.sample_ok = 0
        self.sample_errors: dict[str, int] = {}
        self.parse_errors = 0
        self.connections = 0

    def clear(self) -> None:
        self.records = []
        self.signed_seen = self.sampled = self.sample_ok = 0
        self.sample_errors = {}
        self.parse_errors = 0
        self.connections = 0

    def stats(self) -> dict[str, object]:
        return {"count": len(self.records), "signed_seen": self.signed_seen, "signature_sampled": self.sampled,
                "signature_ok": self.sample_ok, "signature_errors": self.sample_errors,
                "parse_errors": self.parse_errors, "connections_opened": self.connections,
                "sample_every": self.sample_every}


def _header(lower: bytes, head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (lower-case, with leading CRLF and trailing colon) or None."""
    i = lower.find(name)
    if i < 0:
        return None
    j = head.find(b"\r\n", i + len(name))
    return head[i + len(name): j if j >= 0 else len(head)].strip()


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
    return out


class SinkProtocol(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.state.connections += 1

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        st = self.state
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._fail()
                    return
                break
            head = buf[:end]
            lower = head.lower()
            cl = _header(lower, head, b"\r\ncontent-length:")
            try:
                length = int(cl) if cl is not None else 0
            except ValueError:
                self._fail()
                return
            if length > MAX_BODY:
                self._fail()
                return
            total = end + 4 + length
            if len(buf) < total:
                break
            body = buf[end + 4: total]
            buf = buf[total:]
            if head.startswith(b"POST "):
                now_ns = time.time_ns()
                key = _header(lower, head, b"\r\nfireledger-fire-key:")
                ident = key.decode("latin-1") if key is not None else body.decode("utf-8", "replace")
                st.records.append((now_ns, ident))
                if st.secret is not None and b"\r\nwebhook-signature:" in lower:
                    st.signed_seen += 1
                    if st.signed_seen % st.sample_every == 1 or st.sample_every == 1:
                        self._verify(head, body, now_ns)
                out.append(OK)
            elif head.startswith(b"GET "):
                if out:
                    self.transport.write(b"".join(out))  # type: ignore[union-attr]
                    out = []
                self._admin(head)
            else:
                out.append(BAD)
        self.buf = buf
        if out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])  # type: ignore[union-attr]

    def _verify(self, head: bytes, body: bytes, now_ns: int) -> None:
        st = self.state
        st.sampled += 1
        try:
            verify(st.secret or "", _headers(head), body, now=now_ns / 1e9)
            st.sample_ok += 1
        except SignatureError as exc:
            st.sample_errors[exc.reason] = st.sample_errors.get(exc.reason, 0) + 1

    def _admin(self, head: bytes) -> None:
        st = self.state
        target = head.split(b" ", 2)[1].decode("latin-1")
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        if parts.path == "/_admin/count":
            payload: object = {"count": len(st.records)}
        elif parts.path == "/_admin/records":
            since = int(query.get("since", ["0"])[0])
            recs = st.records[since:]
            payload = {"records": recs, "next": since + len(recs)}
        elif parts.path == "/_admin/stats":
            payload = st.stats()
        elif parts.path == "/_admin/clear":
            st.clear()
            payload = {"cleared": True}
        elif parts.path == "/health":
            payload = {"ok": True}
        else:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")  # type: ignore[union-attr]
            return
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "  # type: ignore[union-attr]
                             + str(len(body)).encode() + b"\r\n\r\n" + body)

    def _fail(self) -> None:
        self.state.parse_errors += 1
        assert self.transport is not None
        self.transport.write(BAD)
        self.transport.close()
        self.buf = b""


async def serve(host: str, port: int, port_file: str | None, state: State) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SinkProtocol(state), host, port, backlog=1024, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    if port_file:
        tmp = f"{port_file}.tmp"
        Path(tmp).write_text(str(bound))
        os.replace(tmp, port_file)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> int:
    import uvloop

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--secret", help="Standard Webhooks secret to verify a sample of signed requests with")
    ap.add_argument("--sample-every", type=int, default=100)
    args = ap.parse_args()
    uvloop.run(serve(args.host, args.port, args.port_file, State(args.secret, args.sample_every)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
