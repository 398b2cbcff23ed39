"""A local HTTP sink that records fireledger dispatches, for end-to-end tests and benchmarks.

Standalone::

    python tests/sink.py --port 0 --port-file sink.port --secret-file secret.txt --out records.jsonl

In-process (its own loop in a thread)::

    sink = SinkServer(secrets=[secret])
    base_url = sink.start_in_thread()
    ...
    sink.wait_for_records(3, timeout_s=10)
    sink.stop()

or inside a running loop: ``base_url = await sink.start()`` ... ``await sink.close()``.

Every POST (any path) is recorded on arrival, before it is answered, as a JSON object:

    seq, arrived_at (the sink's time.time()), method, path, status (the status it answers, None
    for /hang), headers (fireledger-*, webhook-*, authorization, content-type, user-agent),
    fire_key_header, webhook_id, webhook_timestamp, signature_ok, signature_error,
    fire_key, trigger_id, scheduled_instant, attempt, lane, kind, payload, dead_letter (from the JSON body),
    body_error (when the body is not a JSON object), body_size

``signature_ok`` says whether the Standard Webhooks signature verifies (replay window included,
against the sink's clock) with any of the known secrets. Secrets come from the constructor,
``add_secret()``, ``PUT /secrets`` (a JSON list or one per line) or the ``--secret-file`` (one per
line; re-read whenever it changes, so it may be written after the sink starts).

Behaviour by path (a ``behaviours`` mapping of exact paths may override):

    /slow/<s>       answer 200 after <s> seconds (``/slow`` alone: --slow-delay, default 2 s)
    /fail           answer 500
    /status/<code>  answer <code>
    /fail-first/<n> answer 500 to the first <n> requests of each fire key, then 200
    /hang           never answer (until the sink stops)
    /retry-after/<v> answer 503 with ``Retry-After: <v>`` (any text, e.g. an absurd number)
    anything else   answer 200

Admin endpoints (GET only, so they never collide with recorded POSTs): ``GET /records``
(``?since=SEQ`` returns records with seq >= SEQ), ``GET /health``; ``DELETE /records`` clears.

Target ownership challenges: ``GET /.well-known/fireledger-verification/<token>`` answers 200 with
the target's ``verification.response`` as its body for a token registered with
``add_challenge(token, response)`` or ``PUT /challenges/<token>`` (body: the response;
``DELETE /challenges/<token>`` withdraws it), and 404 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

try:
    from fireledger.dispatch.signing import SignatureError, verify
except ImportError:  # pragma: no cover - running without the package on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from fireledger.dispatch.signing import SignatureError, verify

BODY_FIELDS = ("fire_key", "trigger_id", "scheduled_instant", "attempt", "lane", "kind", "payload", "dead_letter")
KEPT_HEADERS = ("authorization", "content-type", "user-agent")


@dataclass(frozen=True)
class Behaviour:
    """How to answer a path: after ``delay_s`` seconds with ``status`` and ``headers``; ``hang``
    never answers."""

    status: int = 200
    delay_s: float = 0.0
    hang: bool = False
    headers: tuple[tuple[str, str], ...] = ()


class SinkServer:
    """Records POSTs and answers them per path; see the module docstring."""

    def __init__(
        self,
        *,
        secrets: Iterable[str] = (),
        secret_file: str | os.PathLike[str] | None = None,
        out: str | os.PathLike[str] | None = None,
        behaviours: Mapping[str, Behaviour] | None = None,
        slow_delay_s: float = 2.0,
        host: str = "127.0.0.1",
        port: int = 0,
        tolerance_s: float = 300,
    ) -> None:
        self.host = host
        self.port = port
        self.base_url: str | None = None
        self._secrets: list[str] = list(secrets)
        self._secret_file = Path(secret_file) if secret_file else None
        self._secret_file_stamp: tuple[int, int, int] | None = None
        self._file_secrets: list[str] = []
        self._out_path = Path(out) if out else None
        self._out: Any = None
        self._behaviours = dict(behaviours or {})
        self._slow_delay_s = slow_delay_s
        self._tolerance_s = tolerance_s
        self._records: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._fail_counts: dict[tuple[str, str], int] = {}
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._challenges: dict[str, str] = {}

    # ---- ownership challenges -----------------------------------------------------------------

    def add_challenge(self, token: str, response: str) -> None:
        """Serve ``response`` (the target's ``verification.response``) at
        ``/.well-known/fireledger-verification/<token>`` (thread-safe)."""
        with self._cond:
            self._challenges[token] = response

    def remove_challenge(self, token: str) -> None:
        with self._cond:
            self._challenges.pop(token, None)

    async def _get_challenge(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        with self._cond:
            answer = self._challenges.get(token)
        return web.Response(text=answer, content_type="text/plain") if answer is not None else web.Response(status=404)

    async def _put_challenge(self, request: web.Request) -> web.StreamResponse:
        response = (await request.text()).strip()
        if not response:
            return web.Response(status=400, text="the body must be the verification response")
        self.add_challenge(request.match_info["token"], response)
        return web.Response(status=204)

    async def _delete_challenge(self, request: web.Request) -> web.StreamResponse:
        self.remove_challenge(request.match_info["token"])
        return web.Response(status=204)

    # ---- secrets ------------------------------------------------------------------------------

    def add_secret(self, secret: str) -> None:
        """Accept signatures made with ``secret`` from now on (thread-safe)."""
        with self._cond:
            if secret not in self._secrets:
                self._secrets.append(secret)

    def _current_secrets(self) -> list[str]:
        if self._secret_file is not None:
            try:
                st = self._secret_file.stat()
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if stamp != self._secret_file_stamp:
                    text = self._secret_file.read_text()
                    self._file_secrets = [line.strip() for line in text.splitlines() if line.strip()]
                    self._secret_file_stamp = stamp
            except FileNotFoundError:
                self._file_secrets = []
                self._secret_file_stamp = None
        with self._cond:
            return [*self._secrets, *self._file_secrets]

    # ---- records ------------------------------------------------------------------------------

    def records(self, since: int = 0) -> list[dict[str, Any]]:
        """A copy of the records with ``seq >= since`` (seq starts at 0), in arrival order."""
        with self._cond:
            return [dict(r) for r in self._records[max(0, since) :]]

    def clear(self) -> None:
        with self._cond:
            self._records.clear()
            self._fail_counts.clear()

    def wait_for_records(self, n: int, timeout_s: float) -> list[dict[str, Any]]:
        """Block until at least ``n`` records exist (threaded mode); ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._records) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"sink has {len(self._records)} records, wanted {n}")
                self._cond.wait(left)
            return [dict(r) for r in self._records]

    # ---- behaviour ----------------------------------------------------------------------------

    def set_behaviour(self, path: str, behaviour: Behaviour) -> None:
        """Answer ``path`` with ``behaviour`` from the next request on (e.g. a target that fails,
        then recovers)."""
        self._behaviours = {**self._behaviours, path: behaviour}

    def _behaviour(self, path: str, fire_key: str | None) -> Behaviour:
        if path in self._behaviours:
            return self._behaviours[path]
        parts = [p for p in path.split("/") if p]
        head = parts[0] if parts else ""
        arg = parts[1] if len(parts) > 1 else None
        try:
            if head == "slow":
                return Behaviour(delay_s=float(arg) if arg is not None else self._slow_delay_s)
            if head == "fail" and arg is None:
                return Behaviour(status=500)
            if head == "status" and arg is not None:
                return Behaviour(status=int(arg))
            if head == "hang":
                return Behaviour(hang=True)
            if head == "retry-after" and arg is not None:
                return Behaviour(status=503, headers=(("Retry-After", arg),))
            if head == "fail-first" and arg is not None:
                key = (path, fire_key or "")
                seen = self._fail_counts.get(key, 0)
                self._fail_counts[key] = seen + 1
                return Behaviour(status=500 if seen < int(arg) else 200)
        except ValueError:
            return Behaviour(status=400)
        return Behaviour()

    # ---- handlers -----------------------------------------------------------------------------

    async def _on_post(self, request: web.Request) -> web.StreamResponse:
        arrived_at = time.time()
        body = await request.read()
        headers = request.headers
        rec: dict[str, Any] = {
            "arrived_at": arrived_at,
            "method": request.method,
            "path": request.path,
            "headers": {
                k.lower(): v
                for k, v in headers.items()
                if k.lower().startswith(("fireledger-", "webhook-")) or k.lower() in KEPT_HEADERS
            },
            "fire_key_header": headers.get("fireledger-fire-key"),
            "webhook_id": headers.get("webhook-id"),
            "webhook_timestamp": headers.get("webhook-timestamp"),
            "body_size": len(body),
            "body_error": None,
        }
        for name in BODY_FIELDS:
            rec[name] = None
        try:
            parsed = json.loads(body)
            if isinstance(parsed, dict):
                for name in BODY_FIELDS:
                    rec[name] = parsed.get(name)
            else:
                rec["body_error"] = "body is not a JSON object"
        except (ValueError, UnicodeDecodeError):
            rec["body_error"] = "body is not JSON"

        secrets = self._current_secrets()
        if not secrets:
            rec["signature_ok"], rec["signature_error"] = False, "sink has no secret"
        else:
            try:
                verify(secrets, headers, body, now=arrived_at, tolerance_s=self._tolerance_s)
                rec["signature_ok"], rec["signature_error"] = True, None
            except SignatureError as exc:
                rec["signature_ok"], rec["signature_error"] = False, exc.reason
            except ValueError as exc:
                rec["signature_ok"], rec["signature_error"] = False, f"bad secret: {exc}"

        fire_key = rec["fire_key"] if isinstance(rec["fire_key"], str) else rec["fire_key_header"]
        behaviour = self._behaviour(request.path, fire_key)
        rec["status"] = None if behaviour.hang else behaviour.status
        self._append(rec)

        if behaviour.hang:
            assert self._release is not None
            await self._release.wait()
            raise web.HTTPServiceUnavailable()
        if behaviour.delay_s > 0:
            await asyncio.sleep(behaviour.delay_s)
        return web.json_response({"ok": 200 <= behaviour.status < 300}, status=behaviour.status,
                                 headers=dict(behaviour.headers))

    def _append(self, rec: dict[str, Any]) -> None:
        with self._cond:
            rec["seq"] = len(self._records)
            self._records.append(rec)
            self._cond.notify_all()
        if self._out is not None:
            self._out.write(json.dumps(rec, separators=(",", ":"), default=str) + "\n")
            self._out.flush()

    async def _get_records(self, request: web.Request) -> web.StreamResponse:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return web.json_response({"error": "since must be an int"}, status=400)
        return web.json_response(self.records(since))

    async def _delete_records(self, request: web.Request) -> web.StreamResponse:
        self.clear()
        return web.Response(status=204)

    async def _put_secrets(self, request: web.Request) -> web.StreamResponse:
        text = (await request.read()).decode("utf-8", "replace")
        try:
            items = json.loads(text)
        except ValueError:
            items = [line.strip() for line in text.splitlines() if line.strip()]
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            return web.json_response({"error": "expected a JSON list of secrets"}, status=400)
        for s in items:
            self.add_secret(s)
        return web.Response(status=204)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True, "records": len(self._records)})

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> str:
        """Start serving in the running loop; returns the base URL (``http://host:port``)."""
        if self._runner is not None:
            raise RuntimeError("sink already started")
        self._release = asyncio.Event()
        if self._out_path is not None:
            self._out = open(self._out_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/records", self._get_records)
        app.router.add_delete("/records", self._delete_records)
        app.router.add_put("/secrets", self._put_secrets)
        app.router.add_get("/health", self._health)
        app.router.add_get("/.well-known/fireledger-verification/{token}", self._get_challenge)
        app.router.add_put("/challenges/{token}", self._put_challenge)
        app.router.add_delete("/challenges/{token}", self._delete_challenge)
        app.router.add_post("/{tail:.*}", self._on_post)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=1024)
        await site.start()
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.port = int(port)
        self.base_url = f"http://{host}:{port}"
        return self.base_url

    async def close(self) -> None:
        """Stop serving (hung requests are released) and close the output file. Idempotent."""
        if self._release is not None:
            self._release.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._out is not None:
            self._out.close()
            self._out = None

    def start_in_thread(self, timeout_s: float = 10.0) -> str:
        """Run the sink on its own event loop in a daemon thread; returns the base URL."""
        if self._thread is not None:
            raise RuntimeError("sink already started")
        started = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failure.append(exc)
                loop.run_until_complete(self.close())
                loop.close()
                started.set()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.close())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name="fireledger-sink", daemon=True)
        self._thread.start()
        if not started.wait(timeout_s):
            raise TimeoutError("sink did not start")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        assert self.base_url is not None
        return self.base_url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop a sink started with :meth:`start_in_thread`. Idempotent."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError("sink thread did not stop")
        self._thread = None
        self._loop = None

    def __enter__(self) -> SinkServer:
        self.start_in_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _serve(args: argparse.Namespace) -> None:
    sink = SinkServer(
        secrets=args.secret or (),
        secret_file=args.secret_file,
        out=args.out,
        slow_delay_s=args.slow_delay,
        host=args.host,
        port=args.port,
    )
    base = await sink.start()
    if args.port_file:
        _write_atomic(Path(args.port_file), f"{sink.port}\n")
    print(f"sink listening on {base}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await sink.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Record fireledger HTTP dispatches.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--secret-file", help="file with one whsec_ secret per line (re-read on change)")
    p.add_argument("--secret", action="append", help="a whsec_ secret (repeatable)")
    p.add_argument("--out", help="append every record to this JSONL file")
    p.add_argument("--slow-delay", type=float, default=2.0, help="delay of /slow without a number")
    args = p.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(_serve(args))
    else:
        uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
