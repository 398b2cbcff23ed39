"""A small receiver as users run one: Python's standard ``http.server.ThreadingHTTPServer`` with its
default accept backlog (``request_queue_size`` = 5), HTTP/1.1, answering every POST ``200`` at once.

    .venv/bin/python bench/stdlib_receiver.py --port 0 --port-file PATH

It records each POST on arrival as ``[time.time_ns(), fireledger-fire-key header]`` and answers the
same admin GETs as ``bench/sink.py`` (``/_admin/count``, ``/_admin/records?since=K``,
``/_admin/stats``, ``/_admin/clear``), so the bench reads both receivers alike. Nothing else is
tuned: the point is a receiver whose accept queue is small (decision 0121).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

RECORDS: list[tuple[int, str]] = []
LOCK = threading.Lock()
STATS = {"posts": 0, "connections": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive, as the receiver

    def setup(self) -> None:
        super().setup()
        with LOCK:
            STATS["connections"] += 1

    def log_message(self, format: str, *args: object) -> None:
        return   # quiet: one line per request would cost more than the request

    def _answer(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_POST(self) -> None:
        arrived = time.time_ns()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        key = self.headers.get("fireledger-fire-key") or ""
        with LOCK:
            RECORDS.append((arrived, key))
            STATS["posts"] += 1
        self._answer(200)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        with LOCK:
            if url.path == "/_admin/count":
                out: object = {"count": len(RECORDS)}
            elif url.path == "/_admin/records":
                since = int(parse_qs(url.query).get("since", ["0"])[0])
                out = {"records": RECORDS[since:], "next": len(RECORDS)}
            elif url.path == "/_admin/stats":
                out = dict(STATS)
            elif url.path == "/_admin/clear":
                RECORDS.clear()
                STATS.update(posts=0, connections=0)
                out = {"cleared": True}
            else:
                out = None
        if out is None:
            self._answer(404)
        else:
            self._answer(200, json.dumps(out).encode())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--backlog", type=int, default=None,
                    help="accept backlog (default: the standard library's, 5; the issue's comparison used 1024)")
    a = ap.parse_args()
    if a.backlog is not None:
        ThreadingHTTPServer.request_queue_size = a.backlog
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)   # default request_queue_size: 5
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    Path(a.port_file).write_text(str(server.server_address[1]))
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
