"""``trust-key-material``: a fresh clone carries no key material, and the service refuses key files
that others may read (issue 13, high finding 1), with real processes.

1. ``git clone`` of this repository into a temporary directory; every file of the clone is scanned
   for private key material (a PEM private key, a JWK's private ``d``) and for file names of the
   state the service writes (``*-keys.json``, ``*.lock``, ``*-kek.key``, ``.fireledger/``…).
2. In the clone, as an operator starting from the repository root: ``fireledger init`` creates the
   state directory ``./.fireledger`` (0700) with the KEK and the key ring (0600), and ``git status``
   stays clean (the state is ignored, never committed by accident).
3. ``fireledger serve`` with the KEK file at 0644 exits 2 with one line naming the file and
   ``chmod 600 <file>``; likewise with the key ring at 0644 (and, in the full form, ``control`` and
   ``dispatch`` likewise, and a state directory at 0755 with ``chmod 700``).
4. With the modes fixed, ``serve`` starts and answers ``/healthz`` (the refusals were about the modes).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PEM_PRIVATE = re.compile(rb"-----BEGIN [A-Z ]*" + b"PRIVATE" + rb" KEY-----")
JWK_PRIVATE = re.compile(rb'"d"\s*:\s*"[A-Za-z0-9_\-]{40,}')
STATE_NAME = re.compile(r"(^|/)(\.fireledger(/|$)|[^/]*-keys\.json(\.lock)?$|keys\.json$|[^/]*\.lock$|[^/]*\.key$"
                        r"|[^/]*\.db$)")
STATE_ENV = ("FIRELEDGER_STATE_DIR", "FIRELEDGER_KEK", "FIRELEDGER_KEK_FILE", "FIRELEDGER_KEYRING", "FIRELEDGER_DB")


def _scan(clone: Path) -> tuple[int, list[str]]:
    found: list[str] = []
    n = 0
    for path in clone.rglob("*"):
        rel = path.relative_to(clone).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if STATE_NAME.search(rel):
            found.append(f"{rel}: a state/key file name")
        if not path.is_file():
            continue
        n += 1
        data = path.read_bytes()
        if PEM_PRIVATE.search(data):
            found.append(f"{rel}: a PEM private key")
        if JWK_PRIVATE.search(data):
            found.append(f"{rel}: a JWK private part")
    return n, found


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key_material(full: bool) -> dict[str, Any]:
    from e2e import BIN

    failures: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="fireledger-trust-keys-"))
    env = {k: v for k, v in os.environ.items() if k not in STATE_ENV}
    env["FIRELEDGER_ALLOW_PRIVATE_TARGETS"] = "1"
    refusals: dict[str, Any] = {}
    try:
        clone = work / "clone"
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True,
                       capture_output=True, timeout=300)
        scanned, found = _scan(clone)
        failures += [f"key material in a fresh clone: {f}" for f in found]

        def fl(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(BIN), *args], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=timeout)

        init = fl("init")
        state = clone / ".fireledger"
        if init.returncode != 0:
            failures.append(f"fireledger init failed: {init.stderr.strip()}")
        else:
            modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (state, state / "kek.key", state / "keys.json")}
            if modes != {".fireledger": "0o700", "kek.key": "0o600", "keys.json": "0o600"}:
                failures.append(f"state modes after init: {modes}")
            dirty = subprocess.run(["git", "-C", str(clone), "status", "--porcelain", "--untracked-files=all"],
                                   capture_output=True, text=True, check=True).stdout.strip()
            if dirty:
                failures.append(f"state written by init is not ignored by git: {dirty.splitlines()[:5]}")

        cases = [("serve", state / "kek.key", 0o644, 0o600, "chmod 600"),
                 ("serve", state / "keys.json", 0o644, 0o600, "chmod 600")]
        if full:
            cases += [("control", state / "kek.key", 0o604, 0o600, "chmod 600"),
                      ("dispatch", state / "keys.json", 0o640, 0o600, "chmod 600"),
                      ("serve", state, 0o755, 0o700, "chmod 700")]
        for command, victim, bad, good, fix in cases:
            os.chmod(victim, bad)
            args = [command] + (["--listen", f"127.0.0.1:{_free_port()}"] if command != "dispatch" else [])
            name = f"{command}:{victim.name}:{bad:o}"
            try:
                r = fl(*args, timeout=30)
                line = r.stderr.strip()
                refusals[name] = {"exit": r.returncode, "message": line}
                rel = victim.relative_to(clone).as_posix()   # the default state dir is ./.fireledger
                if r.returncode != 2 or f"{fix} {rel}" not in line or len(line.splitlines()) != 1:
                    failures.append(f"{name}: expected exit 2 and one line naming `{fix} {rel}`, got "
                                    f"{r.returncode}: {line[:300]}")
            except subprocess.TimeoutExpired:
                refusals[name] = {"exit": None}
                failures.append(f"{name}: the process started with a key file others may read")
            os.chmod(victim, good)

        # Positive control: with private modes, serve starts from the clone root on its defaults.
        port = _free_port()
        log = open(work / "serve.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([str(BIN), "serve", "--listen", f"127.0.0.1:{port}"], cwd=clone, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started = False
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                        started = resp.status == 200
                except OSError:
                    pass
                if started:
                    break
                time.sleep(0.1)   # poll interval, bounded by the deadline
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            log.close()
        if not started:
            failures.append("serve did not start with private key files: "
                            + (work / "serve.log").read_text(errors="replace")[-500:])
        repo_root_files = sorted(p.name for p in clone.iterdir() if p.name.startswith("fireledger"))
        if repo_root_files:
            failures.append(f"state written to the repository root: {repo_root_files}")
        return {"passed": not failures, "files_scanned": scanned, "key_material_found": len(found),
                "refusals": refusals, "started_with_private_modes": started, "failures": failures}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def scenarios(quick: bool) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    yield "trust-key-material", lambda: key_material(full=not quick)


if __name__ == "__main__":   # python falsify/scenarios/trust_key_material.py
    import json

    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    print(json.dumps(key_material(full=True)))
