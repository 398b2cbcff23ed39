"""The DNS TXT ownership method against a REAL local DNS server (tests/dnsserver.py, UDP on
127.0.0.1; no mock): the record at ``_fireledger-verification.<host>`` must be the keyed response;
a wrong value, a missing name, a name without TXT and a silent server each give a one-line cause
that never carries a record's text; only https targets on port 443 with a host name qualify
(decision 0173). Also the verification settings (decisions 0170-0171)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from dnsserver import DnsServer
from fireledger.security.dnsverify import dns_method_problem, dns_name, prove_by_dns
from fireledger.settings import SettingError, Settings
from fireledger.verifysettings import VerificationSettings, parse_nameservers

URL = "https://svc.example.test/hook"
NAME = "_fireledger-verification.svc.example.test"
RESPONSE = "tok123.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"


@pytest.fixture
def server() -> Iterator[DnsServer]:
    s = DnsServer()
    s.start()
    yield s
    s.stop()


def prove(server: DnsServer, url: str = URL, expected: str = RESPONSE, timeout_s: float = 3.0) -> str | None:
    return asyncio.run(prove_by_dns(url, expected, [("127.0.0.1", server.port)], timeout_s=timeout_s))


def test_the_record_name_is_under_the_host() -> None:
    assert dns_name(URL) == NAME
    assert dns_name("https://API.Example.test.:443/x?y") == "_fireledger-verification.api.example.test"


def test_the_published_response_proves_ownership(server: DnsServer) -> None:
    server.set_txt(NAME, "v=spf1 -all", RESPONSE)      # other TXT records beside it do not matter
    assert prove(server) is None
    assert server.queries == [(NAME, "TXT")]


def test_a_wrong_record_is_refused_without_echoing_it(server: DnsServer) -> None:
    server.set_txt(NAME, "tok123")                     # the token alone is not the response
    cause = prove(server)
    assert cause is not None and "is the verification response" in cause and NAME in cause
    assert "tok123" not in cause


@pytest.mark.parametrize(("records", "words"), [(None, "does not exist"), ((), "has no TXT record")])
def test_a_missing_name_or_record_says_which(server: DnsServer, records: tuple[str, ...] | None, words: str) -> None:
    if records is not None:
        server.set_txt(NAME, *records)
    cause = prove(server)
    assert cause is not None and words in cause and NAME in cause


def test_a_server_that_does_not_answer_times_out() -> None:
    silent = DnsServer(silent=True)
    silent.start()
    try:
        cause = prove(silent, timeout_s=0.6)
    finally:
        silent.stop()
    assert cause == f"{NAME} could not be resolved within 0.6s"
    assert silent.queries                               # it was asked


@pytest.mark.parametrize(("url", "words"), [
    ("http://svc.example.test/hook", "plain-http"),
    ("https://svc.example.test:8443/hook", "default port"),
    ("https://192.0.2.7/hook", "host name"),
    ("https://[2001:db8::1]/hook", "host name"),
])
def test_only_https_names_on_the_default_port_qualify(server: DnsServer, url: str, words: str) -> None:
    server.set_txt(dns_name(url), RESPONSE)
    cause = prove(server, url)
    assert cause is not None and words in cause and cause == dns_method_problem(url)
    assert server.queries == []                         # refused before any lookup


def test_the_settings_defaults_and_values() -> None:
    vs = Settings.from_env({}).verification
    assert vs == VerificationSettings() and (vs.validity_s, vs.reverify_window_s) == (30 * 86_400, 7 * 86_400)
    assert vs.retry_s == 6 * 3600 and vs.pass_every_s == 60 and vs.nameservers == ()
    short = Settings.from_env({"FIRELEDGER_VERIFICATION_VALIDITY_S": "8",
                               "FIRELEDGER_DNS_NAMESERVER": "127.0.0.1:5353, [::1]:53,10.0.0.2"}).verification
    assert (short.validity_s, short.reverify_window_s) == (8, 4)     # the window defaults to half a short validity
    assert short.nameservers == (("127.0.0.1", 5353), ("::1", 53), ("10.0.0.2", 53))


@pytest.mark.parametrize(("env", "name"), [
    ({"FIRELEDGER_VERIFICATION_VALIDITY_S": "1"}, "FIRELEDGER_VERIFICATION_VALIDITY_S"),
    ({"FIRELEDGER_VERIFICATION_VALIDITY_S": "month"}, "FIRELEDGER_VERIFICATION_VALIDITY_S"),
    ({"FIRELEDGER_REVERIFY_WINDOW_S": "0"}, "FIRELEDGER_REVERIFY_WINDOW_S"),
    ({"FIRELEDGER_VERIFICATION_VALIDITY_S": "60", "FIRELEDGER_REVERIFY_WINDOW_S": "60"},
     "FIRELEDGER_REVERIFY_WINDOW_S"),
    ({"FIRELEDGER_DNS_NAMESERVER": "dns.example:53"}, "FIRELEDGER_DNS_NAMESERVER"),
    ({"FIRELEDGER_DNS_NAMESERVER": "127.0.0.1:0"}, "FIRELEDGER_DNS_NAMESERVER"),
])
def test_bad_settings_are_named(env: dict[str, str], name: str) -> None:
    with pytest.raises(SettingError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(name + ":")


def test_nameservers_parse() -> None:
    assert parse_nameservers("") == ()
    assert parse_nameservers("[2001:db8::53]") == (("2001:db8::53", 53),)
