"""A receiver as a new user would write one: the standard library's ``ThreadingHTTPServer`` with its
default accept backlog (``request_queue_size`` = 5), an HTTP/1.1 handler that answers 200 (at once, or
after ``delay_s``: a slow application), and target ownership challenges. It counts what it saw: the
requests, the connections open at once (most of them at any time), and each delivery's fire key,
trigger and scheduled instant (never the payload). ``backlog`` replaces the accept backlog and
``accept_pause_s`` makes the server pause before each ``accept()`` (an application slow to accept:
its accept queue stays full longer)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHALLENGE_PREFIX = "/.well-known/fireledger-verification/"


class SmallReceiver:
    def __init__(self, *, delay_s: float = 0.0, backlog: int = 5, accept_pause_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.open_now = 0
        self.max_open = 0
        self.connections = 0
        self.deliveries: list[dict[str, Any]] = []
        self.challenges: dict[str, str] = {}
        rx = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with rx.lock:
                    rx.connections += 1
                    rx.open_now += 1
                    rx.max_open = max(rx.max_open, rx.open_now)

            def finish(self) -> None:
                with rx.lock:
                    rx.open_now -= 1
                super().finish()

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                token = self.path.removeprefix(CHALLENGE_PREFIX)
                with rx.lock:
                    answer = rx.challenges.get(token) if self.path.startswith(CHALLENGE_PREFIX) else None
                self._answer(200, answer.encode()) if answer is not None else self._answer(404)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if rx.delay_s:
                    time.sleep(rx.delay_s)   # the application is slow: this is the receiver under test
                try:
                    doc = json.loads(body)
                    seen = {k: doc.get(k) for k in ("fire_key", "trigger_id", "scheduled_instant", "attempt")}
                except ValueError:
                    seen = {}
                seen["at"] = time.time()
                with rx.lock:
                    rx.deliveries.append(seen)
                self._answer(200)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = backlog   # 5 by default: the standard library's

            def get_request(self) -> Any:
                if accept_pause_s:
                    time.sleep(accept_pause_s)   # the receiver under test accepts slowly
                return super().get_request()

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add_challenge(self, token: str, response: str) -> None:
        with self.lock:
            self.challenges[token] = response

    def start(self) -> SmallReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.deliveries)
