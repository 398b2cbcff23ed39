"""Real processes for end-to-end tests: ``fireledger serve`` (or one plane) in a subprocess, the
``fireledger`` CLI, and a tiny JSON HTTP client. Waiting is always polling with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent / "fireledger"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)   # poll with a deadline


def group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` is still running (a zombie waiting to be reaped does not count)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
            if state != "Z" and int(pgrp) == pgid:
                return True
    return False


def prepare_state_dir(path: Path) -> Path:
    """What ``fireledger init`` does for a test deployment, in-process: the state directory (0700)
    and its key-encryption key file (0600, created once by the same function ``init`` uses). The
    key ring is created by the first process that needs it."""
    from fireledger.security.envelope import create_kek

    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    create_kek(path / "kek.key")
    return path


def use_state_dir(path: Path) -> Path:
    """Make ``path`` this process's state directory (``FIRELEDGER_STATE_DIR``, inherited by every
    process it starts) unless one is set already, and prepare it; returns the one in force. In-process
    code (sealing payloads, reading the ledger) and the services then share one KEK and key ring."""
    current = os.environ.get("FIRELEDGER_STATE_DIR")
    if not current:
        os.environ["FIRELEDGER_STATE_DIR"] = current = str(path)
    return prepare_state_dir(Path(current))


def cli(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"fireledger {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


class Api:
    def __init__(self, base: str, token: str | None = None) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None,
             raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        tok = token if token is not None else self.token
        if tok:
            req.add_header("authorization", f"Bearer {tok}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text

    def ok(self, method: str, path: str, body: Any = None, expect: int | tuple[int, ...] = (200, 201, 204)) -> Any:
        status, out = self.call(method, path, body)
        exp = (expect,) if isinstance(expect, int) else expect
        assert status in exp, f"{method} {path} -> {status}: {out}"
        return out


class Service:
    """``fireledger <roles> --db URL`` in its own process group, with its log in a file."""

    def __init__(self, db: str, workdir: Path, *, command: str = "serve", port: int | None = None,
                 env: dict[str, str] | None = None, prefix: list[str] | None = None) -> None:
        self.db = db
        self.workdir = workdir
        self.command = command
        self.port = port if port is not None else (free_port() if command in ("serve", "control") else None)
        # State (KEK, key ring): the run's state directory (tests/conftest.py, falsify/run.py and
        # bench set one), else one in the workdir; an ``env`` of the caller may name its own.
        self.env = {**os.environ, "FIRELEDGER_ALLOW_PRIVATE_TARGETS": "1", **(env or {})}
        if not self.env.get("FIRELEDGER_STATE_DIR"):
            self.env["FIRELEDGER_STATE_DIR"] = str(workdir / ".fireledger")
        if not self.env.get("FIRELEDGER_KEK") and not self.env.get("FIRELEDGER_KEK_FILE"):
            prepare_state_dir(Path(self.env["FIRELEDGER_STATE_DIR"]))
        self.prefix = prefix or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{command}-{time.monotonic_ns()}.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> Service:
        args = [*self.prefix, str(BIN), self.command, "--db", self.db]
        if self.port is not None:
            args += ["--listen", f"127.0.0.1:{self.port}"]
        self.log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        if self.port is not None:
            try:
                wait_until(self._healthy, timeout_s, f"{self.command} to answer /healthz")
            except TimeoutError as exc:   # say what the process was doing (its log), not only that it was slow
                tail = self.log_text()[-2000:]
                self.kill9()   # the caller never gets a Service to stop: leave no process behind
                raise TimeoutError(f"{exc}; its log ends: {tail}") from None
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.command} exited {self.proc.returncode}: {self.log_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.base + "/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM to the process group; returns once no process of the group is left (``serve``'s
        extra dispatch process may outlive ``serve`` by its drain: a caller that copies or replaces
        the database files next must not race its last close, which checkpoints and deletes the
        ``-wal`` by name). SIGKILL after 20 s."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
                wait_until(lambda: not group_alive(self.proc.pid), 20, "the service's process group to end")
            except (subprocess.TimeoutExpired, TimeoutError):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
                wait_until(lambda: not group_alive(self.proc.pid), 20, "the killed process group to end")
        if getattr(self, "log", None):
            self.log.close()


def verify_target(api: Api, sink: Any, target: dict[str, Any]) -> dict[str, Any]:
    """Prove ownership of ``target`` (a create response): the sink serves its challenge response, then
    ``POST /v1/targets/{id}/verify``; returns the verified target view."""
    sink.add_challenge(target["verification"]["token"], target["verification"]["response"])
    out = api.ok("POST", f"/v1/targets/{target['id']}/verify", None, 200)
    assert out["verification"]["state"] == "verified", out
    return out  # type: ignore[no-any-return]


def new_tenant(db: str, name: str = "acme") -> tuple[str, str]:
    out = json.loads(cli("tenant", "create", f"{name}-{time.monotonic_ns()}", "--db", db, "--json").stdout)
    return out["tenant_id"], out["token"]
