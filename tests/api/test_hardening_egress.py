"""Hardening (issue 13, finding 13) — the class: *no spelling of an address gets past the egress guard,
and a target is reached over TLS unless the operator allows private targets*.

Every IPv6 form that embeds an IPv4 address (mapped, IPv4-compatible, SIIT-translated, 6to4, Teredo,
NAT64 and local-use NAT64) is judged by the address it embeds; site-local is refused. Each row of the
table is checked three ways: the policy's reason, the dispatch sender (a real ``HttpSender``: refused
before any connection, ``failed``, nothing sent) and the control API (``POST /v1/targets`` → 422
naming ``url``). The https rule is checked at definition (API), at the challenge and at dispatch.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from apikit import Api, assert_problem
from fireledger.dispatch.http import HttpRequest, HttpSender
from fireledger.security.egress import EgressPolicy

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
METADATA = "cloud metadata"
LOOPBACK = "loopback"
PRIVATE = "private address"
LINK_LOCAL = "link-local"

#: (address, refused even where private targets are allowed, words the reason must contain)
TABLE = [
    # NAT64, well-known and local-use prefixes (RFC 6052 / RFC 8215), to metadata and to loopback.
    ("64:ff9b::a9fe:a9fe", True, ["embeds 169.254.169.254", METADATA]),
    ("64:ff9b::7f00:1", False, ["embeds 127.0.0.1", LOOPBACK]),
    ("64:ff9b:1::a9fe:a9fe", True, ["embeds 169.254.169.254", METADATA]),           # /96 inside the /48
    ("64:ff9b:1:a9fe:a9:fe00::", True, ["embeds 169.254.169.254", METADATA]),       # /48 position (u octet)
    ("64:ff9b:1:0:a9:fea9:fe00:0", True, ["embeds 169.254.169.254", METADATA]),       # /64 position
    ("64:ff9b:1::a00:1", False, ["embeds 10.0.0.1", PRIVATE]),
    # IPv4-compatible (::/96, deprecated) and SIIT IPv4-translated (::ffff:0:0:0/96).
    ("::a9fe:a9fe", True, ["embeds 169.254.169.254", METADATA]),
    ("::127.0.0.1", False, ["embeds 127.0.0.1", LOOPBACK]),
    ("::ffff:0:a9fe:a9fe", True, ["embeds 169.254.169.254", METADATA]),
    ("::ffff:0:a00:5", False, ["embeds 10.0.0.5", PRIVATE]),
    # IPv4-mapped, 6to4 and Teredo (server and client).
    ("::ffff:169.254.169.254", True, ["embeds 169.254.169.254", METADATA]),
    ("2002:a9fe:a9fe::1", True, ["embeds 169.254.169.254", METADATA]),
    ("2002:7f00:1::1", False, ["embeds 127.0.0.1", LOOPBACK]),
    ("2001:0:a9fe:a9fe::1", True, ["embeds 169.254.169.254", METADATA]),            # Teredo server
    ("2001:0:808:808:0:0:5601:5656", False, ["embeds 169.254.169.169", LINK_LOCAL]),  # Teredo client (obfuscated)
    # Site-local (deprecated), plain forms.
    ("fec0::1", True, ["site-local"]),
    ("feff:ffff::1", True, ["site-local"]),
    ("169.254.169.254", True, [METADATA]),
    ("fe80::1", False, [LINK_LOCAL]),
    ("fd00::1", False, [PRIVATE]),
    ("::", True, ["unspecified"]),
]


@pytest.mark.parametrize(("address", "always", "words"), TABLE, ids=[row[0] for row in TABLE])
def test_each_address_is_refused_for_its_reason(address: str, always: bool, words: list[str]):
    strict = EgressPolicy(allow_private=False).refusal(address)
    assert strict is not None, f"{address} passed the guard"
    for w in words:
        assert w in strict, (address, strict)
    lenient = EgressPolicy(allow_private=True).refusal(address)
    if always:
        assert lenient is not None and "always refused" in lenient and all(w in lenient for w in words), lenient
    else:
        assert lenient is None, (address, lenient)


def test_global_addresses_and_their_nat64_spellings_still_pass():
    for address in ("93.184.215.14", "2606:4700:4700::1111", "64:ff9b::5db8:d70e"):
        assert EgressPolicy(allow_private=False).refusal(address) is None, address


def _request(url: str) -> HttpRequest:
    return HttpRequest(url=url, secret=SECRET, fire_key="tn_a.tr_b.20260101T000000Z.0", msg_id="m1",
                       timestamp=int(time.time()), body=b"{}", timeout_s=3)


@pytest.mark.parametrize(("address", "always", "words"), TABLE, ids=[row[0] for row in TABLE])
def test_the_sender_refuses_each_address_before_connecting(address, always, words, monkeypatch):
    host = f"[{address}]" if ":" in address else address
    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "1" if always else "0")

    async def go():
        async with HttpSender() as sender:
            return await sender.send(_request(f"https://{host}/hook"))

    res = asyncio.run(go())
    assert res.outcome == "failed" and not res.sent, res
    assert "egress refused" in res.error and all(w in res.error for w in words), res.error


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Api]:
    a = Api(tmp_path)
    yield a
    a.close()


@pytest.mark.parametrize(("address", "always", "words"), TABLE, ids=[row[0] for row in TABLE])
def test_the_api_refuses_each_address_as_a_target(shared: Api, address, always, words):
    host = f"[{address}]" if ":" in address else address
    _, s = shared.tenant("acme")
    body = assert_problem(s.post("/v1/targets", json={"kind": "http", "url": f"https://{host}/hook"}), 422, "url")
    assert all(w in body["errors"][0]["problem"] for w in words), body


def test_https_is_required_unless_private_targets_are_allowed(tmp_path: Path):
    (tmp_path / "a").mkdir()
    strict = Api(tmp_path / "a")
    try:
        _, s = strict.tenant("acme")
        before = strict.snapshot()
        body = assert_problem(s.post("/v1/targets", json={"kind": "http", "url": "http://hooks.example.com/x"}),
                              422, "url")
        assert "https" in body["errors"][0]["problem"] and "FIRELEDGER_ALLOW_PRIVATE_TARGETS" in body["detail"] + \
            body["errors"][0]["problem"]
        assert strict.snapshot() == before
        assert s.post("/v1/targets", json={"kind": "http", "url": "https://hooks.example.com/x"}).status_code == 201
    finally:
        strict.close()
    (tmp_path / "b").mkdir()
    lenient = Api(tmp_path / "b", allow_private_targets=True)
    try:
        _, s = lenient.tenant("acme")
        assert s.post("/v1/targets", json={"kind": "http", "url": "http://hooks.example.com/x"}).status_code == 201
    finally:
        lenient.close()


class _Answers(aiohttp.abc.AbstractResolver):
    """A global address for a made-up name (this machine has no network): the guard's rule is tested."""

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list:
        return [{"hostname": host, "host": "93.184.215.14", "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


def test_plain_http_is_refused_at_dispatch_and_at_the_challenge(monkeypatch):
    """A plain-http target that exists from before (or was defined while private targets were
    allowed) is not called once they are not, nor is its challenge fetched."""
    from fireledger.security.targets import fetch_challenge

    monkeypatch.setenv("FIRELEDGER_ALLOW_PRIVATE_TARGETS", "0")

    async def go():
        async with HttpSender(resolver=_Answers()) as sender:
            return await sender.send(_request("http://plain.test/hook"))

    res = asyncio.run(go())
    assert res.outcome == "failed" and not res.sent and "plain http is refused" in res.error, res
    cause = asyncio.run(fetch_challenge("http://plain.test/hook", "tok", EgressPolicy(allow_private=False),
                                        expected="tok.x", resolver=_Answers()))
    assert cause is not None and "plain http is refused" in cause
