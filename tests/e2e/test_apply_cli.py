"""Triggers as code on real processes (decision 0185): ``fireledger serve`` and the ``fireledger apply``
command against it, with a real HTTP receiver proving ownership of the file's http target.

apply creates the targets (printing the new http target's challenge), its queue trigger, and makes
the http target's trigger wait (exit 3); once the receiver serves the challenge, apply verifies the
target and creates the trigger; a re-apply plans nothing; an edit plans an amend of exactly the
changed fields (``--plan`` changes nothing) and applies it; a trigger dropped from the file is
unmanaged, and ``--prune`` deletes it; a bad file names file, line and field and changes nothing. The
README's client example runs as written against the same server.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e import Api, Service, cli, new_tenant
from fireledger.client import AsyncClient
from sink import SinkServer

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

FILE = """\
targets:
  hook: {kind: http, url: "SINK/apply-hook"}
  inbox: {kind: queue}
triggers:
  nightly:
    schedule: {cron: "0 2 * * *", zone: Europe/Paris}
    target: hook
    payload: {job: nightly}
  drain:
    schedule: {every: 15m}
    target: inbox
    jitter: 0s
"""


@pytest.fixture
def sink():
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One ``serve`` for the module (decision 0203): each test works as its own tenant, which sees
    nothing of another's (invariant 15), so the tests do not disturb each other."""
    workdir = tmp_path_factory.mktemp("apply-serve")
    db = f"sqlite:///{workdir}/fl.db"
    svc = Service(db, workdir).start(timeout_s=60)
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def served(server: Service):
    _, token = new_tenant(server.db)
    return server, token


def _apply(svc: Service, token: str, path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return cli("apply", "-f", str(path), *flags, check=False,
               env={"FIRELEDGER_URL": svc.base, "FIRELEDGER_TOKEN": token})


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _triggers(api: Api) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in api.ok("GET", "/v1/triggers")["items"]}


def test_apply_converges_plans_nothing_amends_and_prunes(served, sink, tmp_path: Path) -> None:
    svc, token = served
    api = Api(svc.base, token)
    path = tmp_path / "triggers.yaml"
    path.write_text(FILE.replace("SINK", sink.base_url))

    first = _apply(svc, token, path, "--json")
    assert first.returncode == 3, first.stderr   # the http target's trigger waits for ownership
    out = _json(first)
    assert [(a["action"], a["kind"], a["name"]) for a in out["actions"]] == [
        ("create", "target", "hook"), ("create", "target", "inbox"), ("create", "trigger", "drain")]
    assert [(a["action"], a["name"]) for a in out["waiting"]] == [("wait", "nightly")]
    challenge = out["actions"][0]["result"]["verification"]
    assert out["actions"][0]["result"]["secret"].startswith("whsec_")
    assert set(_triggers(api)) == {"drain"}

    sink.add_challenge(challenge["challenge_path"].rsplit("/", 1)[1], challenge["response"])
    second = _apply(svc, token, path, "--json")
    assert second.returncode == 0, second.stderr
    assert [(a["action"], a["kind"], a["name"]) for a in _json(second)["actions"]] == [
        ("verify", "target", "hook"), ("create", "trigger", "nightly")]
    assert set(_triggers(api)) == {"drain", "nightly"}

    again = _apply(svc, token, path, "--plan", "--json")
    assert again.returncode == 0 and _json(again)["actions"] == [] and _json(again)["unmanaged"] == []

    path.write_text(FILE.replace("SINK", sink.base_url).replace('"0 2 * * *"', '"30 2 * * *"')
                    .replace("job: nightly", "job: nightly-v2"))
    before = _triggers(api)["nightly"]
    plan = _apply(svc, token, path, "--plan")   # the rich table, for people
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"amend\s.*trigger\s.*nightly", plan.stdout), plan.stdout
    assert "schedule" in plan.stdout and "payload" in plan.stdout and "nightly-v2" not in plan.stdout
    assert _triggers(api)["nightly"]["version"] == before["version"]   # --plan changed nothing
    amend = _json(_apply(svc, token, path, "--json"))
    [change] = amend["actions"]
    assert change["action"] == "amend" and set(change["changes"]) == {"schedule", "payload"}
    assert change["changes"]["schedule"]["to"]["cron"] == "0 30 2 * * *"
    after = _triggers(api)["nightly"]
    assert after["version"] == before["version"] + 1 and after["payload_digest"] != before["payload_digest"]
    assert _json(_apply(svc, token, path, "--plan", "--json"))["actions"] == []

    path.write_text(path.read_text().split("  drain:")[0].replace("  inbox: {kind: queue}\n", ""))
    kept = _json(_apply(svc, token, path, "--json"))
    assert kept["actions"] == [] and [(u["action"], u["kind"], u["name"]) for u in kept["unmanaged"]] == [
        ("unmanaged", "trigger", "drain"), ("unmanaged", "target", "queue")]
    pruned = _json(_apply(svc, token, path, "--prune", "--json"))
    assert [(a["action"], a["kind"]) for a in pruned["actions"]] == [("delete", "trigger"), ("delete", "target")]
    assert set(_triggers(api)) == {"nightly"} and len(api.ok("GET", "/v1/targets")["items"]) == 1


def test_a_bad_file_names_file_line_and_field_and_changes_nothing(served, tmp_path: Path) -> None:
    svc, token = served
    api = Api(svc.base, token)
    path = tmp_path / "bad.yaml"
    path.write_text(FILE.replace("SINK", "https://hooks.example.com").replace("Europe/Paris", "Europe/Pariss")
                    .replace("every: 15m", "every: 15 minutes"))
    proc = _apply(svc, token, path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"fireledger: apply: {path}:10:23: triggers.drain.schedule.every:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    path.write_text(FILE.replace("SINK", "https://hooks.example.com").replace("Europe/Paris", "Europe/Pariss"))
    proc = _apply(svc, token, path, "--json")   # the server's dry run finds this one: still before any write
    assert proc.returncode == 2, proc.stderr
    assert re.search(rf"{re.escape(str(path))}:6:\d+: triggers\.nightly\.schedule\.zone: ", proc.stderr), proc.stderr
    assert api.ok("GET", "/v1/targets")["items"] == [] and api.ok("GET", "/v1/triggers")["items"] == []
    schema = Api(svc.base).ok("GET", "/v1/schemas/triggers.json")   # public: no token
    assert schema["$schema"].endswith("2020-12/schema") and set(schema["properties"]) == {
        "version", "targets", "triggers"}


def test_the_readme_client_example_runs_against_a_real_server(served) -> None:
    svc, token = served
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- readme-client-example:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) == 5
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=60,
                          env={**_env(), "FIRELEDGER_URL": svc.base, "FIRELEDGER_TOKEN": token})
    assert proc.returncode == 0, proc.stderr
    trigger_id, next_instant, *instants = proc.stdout.split(" ", 2)
    api = Api(svc.base, token)
    made = api.ok("GET", f"/v1/triggers/{trigger_id}")
    assert made["name"] == "report" and made["schedule"]["every"] == "1m30s" and made["next_instant"] == next_instant
    assert instants and instants[0].startswith("['") and next_instant.endswith("Z")

    async def listed() -> list[str]:   # the asyncio twin over real HTTP
        async with AsyncClient(svc.base, token) as aapi:
            return [t.id async for t in aapi.items(aapi.list_triggers)]

    assert asyncio.run(listed()) == [trigger_id]


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
