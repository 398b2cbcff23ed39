"""Verification that does not lapse silently, on a real ``fireledger serve`` (issue 17 item 3,
decisions 0170-0174), with a short configured validity (``FIRELEDGER_VERIFICATION_VALIDITY_S=8``:
renewal in its last 4 s, a pass every 0.2 s), a real HTTP sink serving the challenge and a real local
DNS server (``FIRELEDGER_DNS_NAMESERVER``):

* an http-verified target is renewed automatically before its expiry (audited as the job's act);
* a dns-verified https target is verified by its TXT record and renewed by DNS;
* once the origin stops serving the challenge, the renewal fails and the target stays verified with
  the error, then lapses at its expiry (audited); its trigger's next fires are refused, each with a
  warning in the fire's history; the expiring gauge counts the tenant's targets until then."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator

import pytest

from dnsserver import DnsServer
from e2e import Api, Service, cli, new_tenant, verify_target, wait_until
from fireledger.reverify import ACTOR
from sink import SinkServer

pytestmark = pytest.mark.e2e


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


def expiring(base: str, tenant_id: str) -> float | None:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf'^fireledger_targets_verification_expiring\{{tenant="{tenant_id}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_renewed_by_http_and_dns_then_lapsed_with_a_warning_in_history(e2e_db, sink, dns, tmp_path) -> None:
    db = e2e_db   # [postgres] is a long form (decision 0203)
    svc = Service(db, tmp_path, env={"FIRELEDGER_VERIFICATION_VALIDITY_S": "8",
                                     "FIRELEDGER_DNS_NAMESERVER": dns.nameserver}).start(timeout_s=60)
    try:
        tenant_id, token = new_tenant(db)
        api = Api(svc.base, token)
        web = api.ok("POST", "/v1/targets", {"kind": "http", "url": f"{sink.base_url}/hook"}, 201)
        sink.add_secret(web["secret"])
        first = verify_target(api, sink, web)["verification"]
        named = api.ok("POST", "/v1/targets", {"kind": "http", "url": "https://svc.example.test/hook"}, 201)
        dns.set_txt(named["verification"]["dns_name"], named["verification"]["response"])
        by_dns = api.ok("POST", f"/v1/targets/{named['id']}/verify", {"method": "dns"})["verification"]
        assert (by_dns["state"], by_dns["method"]) == ("verified", "dns")
        trig = api.ok("POST", "/v1/triggers", {"name": "every second", "schedule": {"every": "1s"},
                                               "target_id": web["id"], "jitter": "0s"}, 201)
        assert expiring(svc.base, tenant_id) == 2.0                 # 8 s left: both inside 7 days

        def renewed(target_id: str, before: str) -> dict | None:
            v = api.ok("GET", f"/v1/targets/{target_id}")["verification"]
            return v if v["state"] == "verified" and v["expires_at"] > before else None

        v = wait_until(lambda: renewed(web["id"], first["expires_at"]), 15, "the http target to be renewed")
        assert v["method"] == "http" and v["error"] is None
        d = wait_until(lambda: renewed(named["id"], by_dns["expires_at"]), 15, "the dns target to be renewed")
        assert d["method"] == "dns"
        assert dns.queries.count((named["verification"]["dns_name"], "TXT")) >= 2   # verified, then renewed
        wait_until(lambda: sink.records(), 15, "a fire to be delivered while verified")

        sink.remove_challenge(web["verification"]["token"])         # the origin stops answering

        def failing() -> dict | None:
            v = api.ok("GET", f"/v1/targets/{web['id']}")["verification"]
            renewal_failed = (v["error"] or "").startswith("automatic re-verification")
            return v if v["state"] == "verified" and renewal_failed else None

        f = wait_until(failing, 15, "the renewal to fail while the target stays verified")
        assert "HTTP 404" in f["error"]
        def lapsed_view() -> dict | None:
            v = api.ok("GET", f"/v1/targets/{web['id']}")["verification"]
            return v if v["state"] == "lapsed" else None

        lapsed = wait_until(lapsed_view, 15, "the verification to lapse")
        assert lapsed["error"].startswith("the verification lapsed at ")
        actions = [(a["action"], a["actor"]) for a in api.ok("GET", "/v1/audit")["items"]]
        for act in ("target.verify", "target.reverify", "target.lapse"):
            assert (act, ACTOR) in actions, act

        def warned() -> list:
            items = api.ok("GET", f"/v1/triggers/{trig['id']}/fires?state=failed")["items"]
            return [i for i in items if i["warnings"]]

        [fire, *_] = wait_until(warned, 20, "a fire refused for the lapsed target, with a warning")
        assert fire["cause"].startswith("failed: not sent: target verification lapsed: ")
        assert fire["attempts"][-1]["http_status"] is None
        assert "ownership verification had lapsed" in fire["warnings"][0]
        one = api.ok("GET", f"/v1/fires/{fire['key']}")
        assert one["warnings"] == fire["warnings"]
        why = json.loads(cli("why", fire["key"], "--db", db, "--json").stdout)["story"]   # the fire's story
        texts = [line["text"] for line in why]
        assert any(t.startswith("warning: attempt 1 was not sent: the target's ownership verification had lapsed")
                   for t in texts), texts
        assert any("ownership verification lapsed (it was not renewed" in t for t in texts), texts
        assert all(r["fire_key"] != fire["key"] for r in sink.records())    # never sent
        assert expiring(svc.base, tenant_id) == 1.0                 # only the dns target counts now
    finally:
        svc.stop()
