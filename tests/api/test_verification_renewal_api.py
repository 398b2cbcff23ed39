"""Verification that does not lapse silently, through the API (issue 17 item 3, decisions 0170-0174):
``verification.expires_at``/``renews_from``/``method``/``dns_name``; DNS TXT verification against a
REAL local DNS server (tests/dnsserver.py); the control plane's renewal pass (fireledger.reverify)
driven by the fake clock against a real sink — renewed in the last 7 days, a failure leaving the
target verified with its error, then lapsed, each audited; the expiring gauge on /metrics and the
console badge on the trigger page."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from apikit import Api, Session, assert_problem
from dnsserver import DnsServer
from fireledger.reverify import ACTOR, reverify_pass
from fireledger.settings import Settings
from fireledger.store import Store
from fireledger.verifysettings import VerificationSettings
from sink import SinkServer

S = 1_000_000
DAY = 86_400 * S
HOST = "svc.example.test"


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    d = DnsServer()
    d.start()
    yield d
    d.stop()


@pytest.fixture
def api(tmp_path: Path, dns: DnsServer) -> Iterator[Api]:
    settings = Settings(allow_private_targets=True,
                        verification=VerificationSettings(nameservers=(("127.0.0.1", dns.port),)))
    a = Api(tmp_path, allow_private_targets=True, metrics_cache_s=0, settings=settings)
    yield a
    a.assert_no_sentinel()
    a.close()


def renew(api: Api) -> tuple[int, int, int]:
    """One renewal pass of the control plane at the fake clock's instant."""
    vs = api.app.state.fireledger.settings.verification
    return asyncio.run(reverify_pass(api.store, api.clock, vs, allow_private=True))


def verification(s: Session, target_id: str) -> dict:
    r = s.get(f"/v1/targets/{target_id}")
    assert r.status_code == 200, r.text
    return r.json()["verification"]  # type: ignore[no-any-return]


def audit(s: Session) -> list[tuple[str, str]]:
    return [(i["action"], i["actor"]) for i in s.get("/v1/audit").json()["items"]]


def gauge(api: Api) -> dict[str, float]:
    text = api.http.get("/metrics").text
    assert "# TYPE fireledger_targets_verification_expiring gauge" in text
    return {m[0]: float(m[1]) for m in re.findall(
        r'^fireledger_targets_verification_expiring\{tenant="([^"]+)"\} (\S+)$', text, re.M)}


def test_a_verification_shows_its_expiry_method_and_renewal_start(api: Api, sink: SinkServer) -> None:
    _, s = api.tenant("acme")
    tg = s.target(f"{sink.base_url}/hook", verified=False)
    v = tg["verification"]
    assert (v["state"], v["method"], v["expires_at"], v["renews_from"]) == ("unverified", None, None, None)
    assert v["dns_name"] == "_fireledger-verification.127.0.0.1"
    sink.add_challenge(v["token"], v["response"])
    ok = s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "http"}).json()["verification"]
    assert (ok["state"], ok["method"]) == ("verified", "http")
    assert (ok["verified_at"], ok["expires_at"], ok["renews_from"]) == (
        "2026-03-27T12:00:00Z", "2026-04-26T12:00:00Z", "2026-04-19T12:00:00Z")   # 30 days; the last 7 renew
    assert verification(s, tg["id"]) == ok


def test_dns_txt_verifies_an_https_target(api: Api, dns: DnsServer) -> None:
    _, s = api.tenant("acme")
    tg = s.target(f"https://{HOST}/hook", verified=False)
    name = tg["verification"]["dns_name"]
    assert name == f"_fireledger-verification.{HOST}"
    missing = s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "dns"}).json()["verification"]
    assert missing["state"] == "failed" and f"{name} does not exist" in missing["error"]
    dns.set_txt(name, tg["verification"]["response"])
    ok = s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "dns"}).json()["verification"]
    assert (ok["state"], ok["method"], ok["error"], ok["expires_at"]) == ("verified", "dns", None,
                                                                         "2026-04-26T12:00:00Z")
    assert (name.lower(), "TXT") in dns.queries
    assert s.post("/v1/triggers", json={"name": "t", "schedule": {"every": "1m"},
                                        "target_id": tg["id"]}).status_code == 201
    row = s.get("/v1/audit").json()["items"][-1]
    assert row["action"] == "target.verify" and row["new"]["method"] == "dns"


def test_dns_is_refused_for_plain_http_and_the_method_is_checked(api: Api, sink: SinkServer,
                                                                  dns: DnsServer) -> None:
    _, s = api.tenant("acme")
    tg = s.target(f"{sink.base_url}/hook", verified=False)
    dns.set_txt(tg["verification"]["dns_name"], tg["verification"]["response"])
    v = s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "dns"}).json()["verification"]
    assert v["state"] == "failed" and "plain-http" in v["error"] and v["method"] is None
    assert dns.queries == []
    assert_problem(s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "ftp"}), 422, "method")
    assert_problem(s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "dns", "x": 1}), 422)


def test_the_control_plane_renews_in_the_last_7_days_then_a_failure_lapses_at_expiry(
        api: Api, sink: SinkServer) -> None:
    tenant_id, s = api.tenant("acme")
    tg = s.target(f"{sink.base_url}/hook", verified=False)
    token, response = tg["verification"]["token"], tg["verification"]["response"]
    sink.add_challenge(token, response)
    first = s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]
    trig = s.trigger(tg["id"], {"every": "1h"})
    assert renew(api) == (0, 0, 0) and gauge(api) == {}           # 30 days left: nothing to do

    api.clock.advance(23 * DAY + S)                                # inside the last 7 days
    assert gauge(api) == {tenant_id: 1.0}
    assert renew(api) == (0, 1, 0)
    renewed = verification(s, tg["id"])
    assert renewed["state"] == "verified" and renewed["expires_at"] == "2026-05-19T12:00:01Z"
    assert renewed["expires_at"] > first["expires_at"] and gauge(api) == {}
    assert audit(s)[-1] == ("target.verify", ACTOR)

    sink.remove_challenge(token)                                   # the origin stops serving it
    api.clock.advance(23 * DAY + S)
    assert renew(api) == (0, 0, 1)
    failing = verification(s, tg["id"])
    assert failing["state"] == "verified" and failing["expires_at"] == renewed["expires_at"]   # still usable
    assert failing["error"].startswith("automatic re-verification failed: ") and "HTTP 404" in failing["error"]
    assert audit(s)[-1] == ("target.reverify", ACTOR)
    assert renew(api) == (0, 0, 0)                                 # not retried before 6 hours
    assert gauge(api) == {tenant_id: 1.0}
    api.clock.advance(6 * 3600 * S)
    assert renew(api) == (0, 0, 1)                                 # retried

    api.clock.advance(7 * DAY)                                     # past the expiry, never renewed
    assert renew(api) == (1, 0, 0)
    lapsed = verification(s, tg["id"])
    assert lapsed["state"] == "lapsed" and lapsed["error"].startswith("the verification lapsed at 2026-05-19T12:00:01Z")
    assert audit(s)[-1] == ("target.lapse", ACTOR) and renew(api) == (0, 0, 0)
    assert gauge(api) == {}
    refused = assert_problem(s.post("/v1/triggers", json={"name": "u", "schedule": {"every": "1m"},
                                                          "target_id": tg["id"]}), 422, "target_id")
    assert "target verification lapsed" in refused["detail"]
    assert s.get(f"/v1/triggers/{trig['id']}").status_code == 200

    sink.add_challenge(token, response)                            # the tenant fixes it and verifies again
    again = s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]
    assert again["state"] == "verified" and again["error"] is None


def test_a_dns_verification_is_renewed_by_dns(api: Api, dns: DnsServer) -> None:
    _, s = api.tenant("acme")
    tg = s.target(f"https://{HOST}/hook", verified=False)
    dns.set_txt(tg["verification"]["dns_name"], tg["verification"]["response"])
    s.post(f"/v1/targets/{tg['id']}/verify", json={"method": "dns"})
    dns.queries.clear()
    api.clock.advance(25 * DAY)
    assert renew(api) == (0, 1, 0)
    v = verification(s, tg["id"])
    assert (v["state"], v["method"], v["expires_at"]) == ("verified", "dns", "2026-05-21T12:00:00Z")
    assert dns.queries == [(f"_fireledger-verification.{HOST}", "TXT")]


def test_the_console_badge_shows_the_targets_verification(api: Api, sink: SinkServer) -> None:
    _, s = api.tenant("acme")
    tg = s.target(f"{sink.base_url}/hook", verified=False)
    sink.add_challenge(tg["verification"]["token"], tg["verification"]["response"])
    s.post(f"/v1/targets/{tg['id']}/verify")
    trig = s.trigger(tg["id"], {"every": "1h"})

    def badge() -> str:
        """The badge as a signed-in browser sees it (signed in again: a session lasts 8 hours)."""
        page = api.http.get("/console/login")
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
        r = api.http.post("/console/login", data={**fields, "token": s.token}, follow_redirects=False)
        assert r.status_code == 303, r.text
        html = api.http.get(f"/console/triggers/{trig['id']}").text
        m = re.search(r'<p id="target-badge" class="badge badge-(\w+)"[^>]*>(.*?)</p>', html, re.S)
        assert m, html[:600]
        return f"{m.group(1)}: {re.sub(r'<[^>]+>', '', m.group(2))}"

    assert badge().startswith("ok: verified target ") and "until 2026-04-26T12:00:00Z" in badge()
    sink.remove_challenge(tg["verification"]["token"])
    api.clock.advance(24 * DAY)
    renew(api)
    assert badge().startswith("warn: verification expiring") and "last try: automatic re-verification" in badge()
    api.clock.advance(6 * DAY)
    assert badge().startswith("bad: verification lapsed") and "fires are not sent" in badge()


def test_two_control_processes_renew_each_target_once(api: Api, sink: SinkServer, tmp_path: Path) -> None:
    """Two renewal passes at the same instant on two store connections (two control processes, one
    database): every due target is renewed exactly once — one audited renewal each, none repeated."""
    _, s = api.tenant("acme")
    ids = []
    for _ in range(6):
        tg = s.target(f"{sink.base_url}/hook", verified=False)
        sink.add_challenge(tg["verification"]["token"], tg["verification"]["response"])
        assert s.post(f"/v1/targets/{tg['id']}/verify").json()["verification"]["state"] == "verified"
        ids.append(tg["id"])
    other = Store.open(f"sqlite:///{tmp_path}/api.db")
    other.trust.set_audit_key(api.store.trust.audit_key)
    try:
        api.clock.advance(24 * DAY)
        vs = api.app.state.fireledger.settings.verification

        async def both() -> list[tuple[int, int, int]]:
            return list(await asyncio.gather(reverify_pass(api.store, api.clock, vs, allow_private=True),
                                             reverify_pass(other, api.clock, vs, allow_private=True)))

        results = asyncio.run(both())
    finally:
        other.close()
    assert sum(r[1] for r in results) == 6 and sum(r[2] for r in results) == 0
    renewals = [i["new"]["target_id"] for i in s.get("/v1/audit?limit=1000").json()["items"]
                if i["action"] == "target.verify" and i["actor"] == ACTOR]
    assert sorted(renewals) == sorted(ids)
    assert {verification(s, i)["expires_at"] for i in ids} == {"2026-05-20T12:00:00Z"}
