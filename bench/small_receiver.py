"""N requests at once from the dispatch plane's HTTP sender to the standard library's
``ThreadingHTTPServer`` with its default accept backlog (5): outcomes and durations (issue 15).

    PYTHONPATH=src python bench/small_receiver.py 300 10      # N, attempt timeout in seconds
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fireledger.dispatch.http import HttpRequest, HttpSender
from fireledger.security.egress import EgressPolicy


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


async def main(n: int, timeout_s: float) -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    async with HttpSender(limit=256, limit_per_host=64, egress=EgressPolicy(allow_private=True)) as s:
        reqs = [HttpRequest(url=url, secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", fire_key=f"k{i}",
                            msg_id=f"m{i}", timestamp=int(time.time()), body=b"{}", timeout_s=timeout_s)
                for i in range(n)]
        t0 = time.monotonic()
        res = await asyncio.gather(*(s.send(r) for r in reqs))
        elapsed = time.monotonic() - t0
    srv.shutdown()
    outcomes = collections.Counter(r.outcome for r in res)
    d = sorted(r.duration_s for r in res)
    print(f"N={n} elapsed={elapsed:.2f}s outcomes={dict(outcomes)} "
          f"p50={d[len(d) // 2]:.3f}s p99={d[max(0, int(len(d) * 0.99) - 1)]:.3f}s max={d[-1]:.3f}s")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300,
                     float(sys.argv[2]) if len(sys.argv) > 2 else 10.0))
