"""Hardening, class "key material and state" (issue 13, findings 1 and 5's KEK part).

* No private key material is tracked by git (a JWK's private ``d``, a PEM private key, a file of a
  kind the service writes as state).
* State lives in one state directory (``FIRELEDGER_STATE_DIR``, default ``./.fireledger/``, 0700),
  never the working directory; ``fireledger init`` creates it, the KEK (0600) and the key ring (0600),
  idempotently; the default store of every command is the one in that directory.
* ``serve``/``control``/``dispatch`` never create a KEK: without one they refuse to start (exit 2,
  naming ``fireledger init``); a key file group or others may access is refused, naming the
  ``chmod`` that fixes it.
* ``fireledger keys rotate|prune|show``: the JWKS publishes the old key until its window ends, and
  after ``prune`` past it only the new one.

Every check runs the real ``fireledger`` console script in a subprocess, as an operator would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from e2e import Service, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "fireledger"
# Built from parts so that this file does not match itself.
PEM_PRIVATE = re.compile(rb"-----BEGIN [A-Z ]*" + b"PRIVATE" + rb" KEY-----")
JWK_PRIVATE = re.compile(rb'"d"\s*:\s*"[A-Za-z0-9_\-]{40,}')
STATE_NAMES = re.compile(r"(^|/)(\.fireledger/|[^/]*-keys\.json$|[^/]*-keys\.json\.lock$|keys\.json$|[^/]*-kek\.key$"
                         r"|[^/]*\.key$|[^/]*\.db$)")
STATE_ENV = ("FIRELEDGER_STATE_DIR", "FIRELEDGER_KEK", "FIRELEDGER_KEK_FILE", "FIRELEDGER_KEYRING", "FIRELEDGER_DB")


def _tracked() -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to inspect")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_private_key_material_is_tracked_by_git():
    offenders = []
    for rel in _tracked():
        path = ROOT / rel
        if STATE_NAMES.search(rel):
            offenders.append(f"{rel}: a state/key file name")
        if not path.is_file():
            continue
        data = path.read_bytes()
        if PEM_PRIVATE.search(data):
            offenders.append(f"{rel}: a PEM private key")
        if JWK_PRIVATE.search(data):
            offenders.append(f"{rel}: a JWK private part (\"d\")")
    assert not offenders, "private key material is committed: " + "; ".join(offenders)


def test_gitignore_covers_every_state_file_the_service_writes(tmp_path):
    _tracked()
    names = [".fireledger/keys.json", ".fireledger/kek.key", ".fireledger/fireledger.db", "fireledger-keys.json",
             "fireledger-keys.json.lock", "fireledger-kek.key", "store-kek.key", "x-keys.json"]
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *names], capture_output=True, text=True)
    ignored = set(r.stdout.split())
    assert ignored == set(names), f"not ignored: {sorted(set(names) - ignored)}"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STATE_ENV}
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_init_creates_the_state_directory_once_and_the_default_store_lives_there(tmp_path):
    checkout = tmp_path / "checkout"      # stands for the repository root an operator starts from
    checkout.mkdir()
    env = _env()
    first = _run(["init"], checkout, env)
    assert first.returncode == 0, first.stderr
    state = checkout / ".fireledger"
    assert _mode(state) == 0o700
    assert _mode(state / "kek.key") == 0o600 and _mode(state / "keys.json") == 0o600
    assert "created" in first.stdout and str(Path(".fireledger") / "kek.key") in first.stdout
    before = {p.name: p.read_bytes() for p in state.iterdir()}
    again = _run(["init", "--json"], checkout, env)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["changed"] is False and doc["created"] == []                    # idempotent: says so
    assert {p.name: p.read_bytes() for p in state.iterdir()} == before          # and changes nothing
    assert "nothing to do" in _run(["init"], checkout, env).stdout
    created = _run(["tenant", "create", "acme", "--json"], checkout, env)
    assert created.returncode == 0, created.stderr
    assert (state / "fireledger.db").exists()                                   # the default store
    assert sorted(p.name for p in checkout.iterdir()) == [".fireledger"]       # nothing in the CWD
    other = tmp_path / "elsewhere" / "state"                                    # FIRELEDGER_STATE_DIR
    assert _run(["init"], checkout, _env(FIRELEDGER_STATE_DIR=str(other))).returncode == 0
    assert _mode(other) == 0o700 and (other / "kek.key").exists() and (other / "keys.json").exists()


@pytest.mark.parametrize("command", ["serve", "control", "dispatch"])
def test_a_process_without_a_kek_refuses_to_start_and_creates_none(tmp_path, command):
    env = _env(FIRELEDGER_STATE_DIR=str(tmp_path / "state"))
    args = [command, "--db", f"sqlite:///{tmp_path}/fl.db"]
    if command != "dispatch":
        args += ["--listen", "127.0.0.1:0"]
    try:
        r = _run(args, tmp_path, env, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`fireledger {command}` started without a key-encryption key")
    assert r.returncode == 2
    assert "fireledger init" in r.stderr and "kek.key" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "state" / "kek.key").exists() and not list(tmp_path.glob("*kek*"))


def _init_state(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    state = tmp_path / "state"
    env = _env(FIRELEDGER_STATE_DIR=str(state))
    r = _run(["init"], tmp_path, env)
    assert r.returncode == 0, r.stderr
    return state, env


@pytest.mark.parametrize(("victim", "mode", "fix"), [
    ("kek.key", 0o644, "chmod 600"), ("kek.key", 0o640, "chmod 600"), ("keys.json", 0o644, "chmod 600"),
    ("keys.json", 0o604, "chmod 600"), ("", 0o755, "chmod 700"),
])
def test_a_key_file_open_to_group_or_others_is_refused_naming_the_chmod(tmp_path, victim, mode, fix):
    state, env = _init_state(tmp_path)
    target = state / victim if victim else state
    os.chmod(target, mode)
    try:
        r = _run(["serve", "--db", f"sqlite:///{tmp_path}/fl.db", "--listen", "127.0.0.1:0"], tmp_path, env,
                 timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`fireledger serve` started with {target} at mode {mode:o}")
    assert r.returncode == 2
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and f"{fix} {target}" in line, line
    os.chmod(target, 0o600 if victim else 0o700)


def test_an_explicit_kek_file_open_to_others_is_refused(tmp_path):
    state, env = _init_state(tmp_path)
    kek = tmp_path / "named.key"
    shutil.copy(state / "kek.key", kek)
    os.chmod(kek, 0o644)
    env["FIRELEDGER_KEK_FILE"] = str(kek)
    r = _run(["dispatch", "--db", f"sqlite:///{tmp_path}/fl.db"], tmp_path, env, timeout=20)
    assert r.returncode == 2 and f"chmod 600 {kek}" in r.stderr


def _jwks_kids(base: str) -> set[str]:
    with urllib.request.urlopen(base + "/.well-known/jwks.json", timeout=10) as r:
        return {k["kid"] for k in json.loads(r.read())["keys"]}


def test_keys_rotate_publishes_both_until_the_window_ends_and_prune_drops_the_old(tmp_path):
    state, env = _init_state(tmp_path)
    show = json.loads(_run(["keys", "show", "--json"], tmp_path, env).stdout)
    assert [k["state"] for k in show["keys"]] == ["current"] and not any("d" in k for k in show["keys"])
    old = show["keys"][0]["kid"]
    svc = Service(f"sqlite:///{tmp_path}/fl.db", tmp_path, env={"FIRELEDGER_STATE_DIR": str(state)}).start()
    try:
        assert _jwks_kids(svc.base) == {old}
        too_short = _run(["keys", "rotate", "--overlap", "60s"], tmp_path, env)
        assert too_short.returncode == 2 and "--overlap" in too_short.stderr
        rotated = _run(["keys", "rotate", "--json"], tmp_path, env)
        assert rotated.returncode == 0, rotated.stderr
        new = json.loads(rotated.stdout)["current"]
        assert new != old and json.loads(rotated.stdout)["retired"] == old
        wait_until(lambda: _jwks_kids(svc.base) == {old, new}, 10, "the JWKS to publish the old and new keys")
        kept = _run(["keys", "prune", "--json"], tmp_path, env)
        assert json.loads(kept.stdout) == {"pruned": []}                 # inside the window: kept
        assert _jwks_kids(svc.base) == {old, new}
        shown = {k["kid"]: k for k in json.loads(_run(["keys", "show", "--json"], tmp_path, env).stdout)["keys"]}
        assert shown[new]["signs"] and shown[old]["state"] == "retired" and shown[old]["published"]
        # Past the window: the ring file as it reads once the overlap (>= the longest token lifetime)
        # has gone by — the retired key's publication end lies in the past.
        ring = json.loads((state / "keys.json").read_text())
        for k in ring["keys"]:
            if k["kid"] == old:
                k["fireledger_publish_until_s"] = k["fireledger_retired_s"] - 1
        tmp = state / "keys.json.new"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(ring, f)
        os.replace(tmp, state / "keys.json")
        pruned = _run(["keys", "prune", "--json"], tmp_path, env)
        assert json.loads(pruned.stdout) == {"pruned": [old]}
        assert [k["kid"] for k in json.loads(_run(["keys", "show", "--json"], tmp_path, env).stdout)["keys"]] == [new]
        wait_until(lambda: _jwks_kids(svc.base) == {new}, 10, "the JWKS to publish only the new key")
        assert _mode(state / "keys.json") == 0o600
    finally:
        svc.stop()


def test_keys_commands_without_a_ring_say_to_run_init(tmp_path):
    env = _env(FIRELEDGER_STATE_DIR=str(tmp_path / "none"))
    r = _run(["keys", "show"], tmp_path, env)
    assert r.returncode == 2 and "fireledger init" in r.stderr


def test_serve_refuses_a_new_default_store_beside_the_old_one(tmp_path):
    """Upgrading from ./fireledger.db: starting on a new, empty default store would stop every trigger."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    env = _env()
    assert _run(["init"], checkout, env).returncode == 0
    old = checkout / "fireledger.db"
    old.write_bytes(b"")
    r = _run(["serve", "--listen", "127.0.0.1:0"], checkout, env, timeout=20)
    assert r.returncode == 2 and "mv fireledger.db .fireledger/fireledger.db" in r.stderr
    assert not (checkout / ".fireledger" / "fireledger.db").exists()


def test_a_history_archive_is_written_readable_by_the_service_user_only(tmp_path):
    """Red team (decision 0092): a retention archive (every tenant's fire history) was created with
    the process umask — 0644 under the usual 022, in a directory made 0755 — so any local user could
    read other tenants' history. The directory is made 0700 and each archive 0600, whatever the umask."""
    from fireledger.clock import FakeClock
    from fireledger.domain.model import Advance, Decision, FireKind, FireState, Lane, NewFire
    from fireledger.retention import DAY_US, run_once
    from storekit import T0, add_target, add_tenant, add_trigger, open_store

    store = open_store("sqlite", tmp_path, None)
    old_umask = os.umask(0o022)
    try:
        t = add_tenant(store)
        trig, _, first = add_trigger(store, t, add_target(store, t), {"every": "60s"})
        fire = NewFire(t.id, trig.id, T0, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.EXPIRED, T0, "2026f",
                       "n", cause="expired: test")
        store.timing.apply_decisions([Decision(Advance(trig.id, first, 1, first, 1), (fire,))])
        archive_dir = tmp_path / "archives" / "history"
        assert run_once(store, FakeClock(T0 + 200 * DAY_US), 90, archive_dir)[0] == 1
    finally:
        os.umask(old_umask)
        store.close()
    [archive] = list(archive_dir.iterdir())
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600, oct(archive.stat().st_mode)
    assert stat.S_IMODE(archive_dir.stat().st_mode) == 0o700, oct(archive_dir.stat().st_mode)
