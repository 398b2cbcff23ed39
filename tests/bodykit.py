"""Raw-socket HTTP senders for the body-cap tests and the ``trust-oversized-body`` scenario: a
generated chunked body streamed until the server answers, so a test can tell how much of the body
the server took before it refused it."""

from __future__ import annotations

import select
import socket
import time
from typing import Any


def read_response(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response (headers and a Content-Length body) from ``sock``."""
    sock.setblocking(True)
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            break
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        got = sock.recv(65536)
        if not got:
            break
        body += got
    return status, headers, body


def send_chunked(port: int, method: str, path: str, headers: dict[str, str], planned: int,
                 chunk: int = 64 * 1024, timeout_s: float = 60) -> dict[str, Any]:
    """Stream a generated chunked body of up to ``planned`` bytes, watching for an early answer.

    Returns ``status``, ``headers``, ``body`` of the answer, ``sent`` (body bytes written when the
    answer was seen, or when the server stopped taking them) and ``finished`` (the whole body went).
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Transfer-Encoding: chunked",
            *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    sock.sendall("\r\n".join(head).encode("latin-1"))
    frame = f"{chunk:x}\r\n".encode() + b"a" * chunk + b"\r\n"
    sent, finished = 0, False
    sock.settimeout(0.5)
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break   # the server answered (or closed) while the body was still coming
            if sent >= planned:
                sock.sendall(b"0\r\n\r\n")
                finished = True
                break
            try:
                sock.sendall(frame)
            except TimeoutError:
                continue   # the server is not reading: wait for its answer
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += chunk
        status, resp_headers, body = read_response(sock, deadline)
    finally:
        sock.close()
    return {"status": status, "headers": resp_headers, "body": body, "sent": sent, "finished": finished}
