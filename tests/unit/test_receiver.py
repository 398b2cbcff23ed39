"""fireledger.receiver: every check that must reject, deduplication, and a real HTTP round trip
with HttpSender (real crypto and sockets, no mocks)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fireledger.dispatch import signing
from fireledger.dispatch.credentials import KeyRing, authorization_header, body_sha256, mint
from fireledger.dispatch.http import HttpRequest, HttpSender
from fireledger.receiver import Deduper, Delivery, MemoryDeduper, Receiver, ReceiverError

T = TypeVar("T")
NOW = 1_900_000_000
SECRET = signing.new_secret()
ISSUER = "https://fireledger.test"
AUDIENCE = "https://hooks.tenant.test/fire"
FIRE_KEY = "tn_a.tr_b.20300101T090000Z.0"
PAYLOAD_MARK = "PAYLOAD-MUST-NOT-LEAK"
RING = KeyRing.generate()


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_body(fire_key: str = FIRE_KEY, attempt: int = 1, **over: Any) -> bytes:
    doc = {"fire_key": fire_key, "trigger_id": "tr_b", "scheduled_instant": "2030-01-01T09:00:00Z",
           "attempt": attempt, "lane": "on_time", "kind": "scheduled", "version": 1,
           "payload": {"secret_note": PAYLOAD_MARK}, **over}
    return json.dumps(doc, separators=(",", ":")).encode()


def make_token(body: bytes, *, ring: KeyRing = RING, **over: Any) -> str:
    args: dict[str, Any] = {"issuer": ISSUER, "audience": AUDIENCE, "subject": "tr_b", "fire_key": FIRE_KEY,
                            "attempt": 1, "body_sha256": body_sha256(body), "now_s": NOW, "expires_s": NOW + 30}
    args.update(over)
    return mint(ring, **args)


def make_request(body: bytes | None = None, *, token: str | None = None, fire_key: str = FIRE_KEY,
                 ts: int = NOW, secret: str = SECRET) -> tuple[dict[str, str], bytes]:
    body = make_body() if body is None else body
    token = make_token(body) if token is None else token
    headers = {"content-type": "application/json", "fireledger-fire-key": fire_key,
               **signing.build_headers(secret, f"{fire_key}.1", ts, body), **authorization_header(token)}
    return headers, body


def receiver(**kw: Any) -> Receiver:
    args: dict[str, Any] = {"audience": AUDIENCE, "issuer": ISSUER, "jwks": RING.jwks()}
    args.update(kw)
    return Receiver(SECRET, **args)


def rejected(headers: dict[str, str], body: bytes, *, now: float = NOW, rcv: Receiver | None = None) -> ReceiverError:
    rcv = rcv or receiver()
    with pytest.raises(ReceiverError) as info:
        rcv.verify(headers, body, now=now)
    err = info.value
    for text in (str(err), err.reason, repr(err)):
        assert SECRET not in text and PAYLOAD_MARK not in text and len(text) < 120
    return err


def forge(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    h = b64u(json.dumps(header).encode())
    c = b64u(json.dumps(claims).encode())
    return f"{h}.{c}.{b64u(signature)}"


def good_claims(body: bytes) -> dict[str, Any]:
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "tr_b", "iat": NOW, "nbf": NOW, "exp": NOW + 30,
            "jti": f"{FIRE_KEY}.1", "fireledger_body_sha256": body_sha256(body)}


# -- accepted --------------------------------------------------------------------------------------


def test_accepts_and_flags_the_second_delivery_as_duplicate() -> None:
    rcv = receiver()
    headers, body = make_request()
    first = rcv.verify(headers, body, now=NOW + 1)
    assert first == Delivery(fire_key=FIRE_KEY, trigger_id="tr_b",
                             scheduled_instant=datetime(2030, 1, 1, 9, tzinfo=UTC), attempt=1, lane="on_time",
                             kind="scheduled", payload={"secret_note": PAYLOAD_MARK}, duplicate=False)
    assert first.scheduled_instant.utcoffset() is not None
    with pytest.raises(FrozenInstanceError):
        first.duplicate = True  # type: ignore[misc]
    second = rcv.verify(headers, body, now=NOW + 2)
    assert second.duplicate is True and second.fire_key == FIRE_KEY
    # A retry of the same fire (new attempt, new signature and token) is the same fire: duplicate.
    body2 = make_body(attempt=2)
    h2, _ = make_request(body2, token=make_token(body2, attempt=2))
    assert rcv.verify(h2, body2, now=NOW + 3).duplicate is True


def test_header_names_are_case_insensitive() -> None:
    headers, body = make_request()
    upper = {k.upper(): v for k, v in headers.items()}
    assert receiver().verify(upper, body, now=NOW).fire_key == FIRE_KEY


def test_secret_rotation_accepts_either_secret() -> None:
    new_secret = signing.new_secret()
    rcv = Receiver([SECRET, new_secret], audience=AUDIENCE, issuer=ISSUER, jwks=RING.jwks())
    for secret in (SECRET, new_secret):
        headers, body = make_request(secret=secret)
        rcv.verify(headers, body, now=NOW)


def test_without_jwks_no_token_is_needed() -> None:
    headers, body = make_request()
    del headers["Authorization"]
    rcv = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER)
    assert rcv.verify(headers, body, now=NOW).duplicate is False


def test_es256_tokens_are_accepted_from_a_p256_jwks() -> None:
    key = generate_private_key(SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid="ec-1", alg="ES256", use="sig")
    headers, body = make_request()
    token = jwt.encode(good_claims(body), key, algorithm="ES256", headers={"kid": "ec-1"})
    headers.update(authorization_header(token))
    rcv = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks={"keys": [jwk]})
    assert rcv.verify(headers, body, now=NOW).fire_key == FIRE_KEY


def test_token_time_checks_use_a_leeway_of_at_most_5s() -> None:
    headers, body = make_request()
    rcv = receiver(dedupe=NoDedupe())
    rcv.verify(headers, body, now=NOW + 30 + 5)  # exp + leeway
    rcv.verify(headers, body, now=NOW - 5)  # nbf - leeway
    with pytest.raises(ValueError):
        receiver(leeway_s=6)


class NoDedupe:
    def seen(self, fire_key: str) -> bool:
        return False


# -- rejected: token -------------------------------------------------------------------------------


def test_rejects_wrong_audience() -> None:
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, audience="https://other.test/fire"))
    assert rejected(headers, body).reason == "token audience mismatch"


def test_rejects_wrong_issuer() -> None:
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, issuer="https://evil.test"))
    assert rejected(headers, body).reason == "token issuer mismatch"


def test_rejects_expired_token() -> None:
    headers, body = make_request()
    err = rejected(headers, body, now=NOW + 30 + 6)
    assert err.reason == "token expired" and err.status == 401


def test_rejects_not_yet_valid_token() -> None:
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, now_s=NOW + 60, expires_s=NOW + 90))
    assert rejected(headers, body).reason == "token not yet valid"


def test_rejects_alg_none() -> None:
    body = make_body()
    for header in ({"alg": "none"}, {"alg": "none", "typ": "JWT", "kid": RING.current.kid}, {"alg": "None"}):
        headers, _ = make_request(body, token=forge(header, good_claims(body)))
        assert rejected(headers, body).reason == "token algorithm not allowed"


def test_rejects_hs256_signed_with_the_public_key() -> None:
    body = make_body()
    pub = RING.current.private.public_key()
    for secret in (pub.public_bytes(Encoding.Raw, PublicFormat.Raw),
                   pub.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo),
                   RING.current.x.encode()):
        header = {"alg": "HS256", "typ": "JWT", "kid": RING.current.kid}
        unsigned = forge(header, good_claims(body)).rsplit(".", 1)[0]
        sig = hmac.new(secret, unsigned.encode(), hashlib.sha256).digest()
        headers, _ = make_request(body, token=f"{unsigned}.{b64u(sig)}")
        assert rejected(headers, body).reason == "token algorithm not allowed"


def test_rejects_eddsa_header_on_an_es256_key() -> None:
    key = generate_private_key(SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid=RING.current.kid)
    body = make_body()
    headers, _ = make_request(body)
    rcv = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks={"keys": [jwk]})
    assert rejected(headers, body, rcv=rcv).reason == "token algorithm does not match its key"


def test_rejects_unknown_kid() -> None:
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, ring=KeyRing.generate()))
    assert rejected(headers, body).reason == "unknown token key id"


def test_rejects_a_foreign_key_claiming_a_known_kid() -> None:
    body = make_body()
    other = KeyRing.generate()
    token = make_token(body, ring=other)
    head = b64u(json.dumps({"alg": "EdDSA", "typ": "JWT", "kid": RING.current.kid}).encode())
    _, claims, _ = token.split(".")
    sig = other.current.private.sign(f"{head}.{claims}".encode())
    headers, _ = make_request(body, token=f"{head}.{claims}.{b64u(sig)}")
    assert rejected(headers, body).reason == "token signature mismatch"


def test_rejects_tampered_claims() -> None:
    body = make_body()
    head, _, sig = make_token(body).split(".")
    claims = b64u(json.dumps({**good_claims(body), "exp": NOW + 10**6}).encode())
    headers, _ = make_request(body, token=f"{head}.{claims}.{sig}")
    assert rejected(headers, body).reason == "token signature mismatch"


@pytest.mark.parametrize("auth", [None, "", "Bearer", "Bearer ", "Basic abc", "bearer a.b", "Bearer x" * 2000])
def test_rejects_missing_or_malformed_bearer(auth: str | None) -> None:
    headers, body = make_request()
    if auth is None:
        del headers["Authorization"]
    else:
        headers["Authorization"] = auth
    assert rejected(headers, body).reason in {"missing bearer token", "malformed token", "token too large"}


def test_rejects_token_missing_the_body_hash_claim() -> None:
    key = RING.current.private
    body = make_body()
    claims = good_claims(body)
    del claims["fireledger_body_sha256"]
    unsigned = forge({"alg": "EdDSA", "typ": "JWT", "kid": RING.current.kid}, claims).rsplit(".", 1)[0]
    headers, _ = make_request(body, token=f"{unsigned}.{b64u(key.sign(unsigned.encode()))}")
    assert rejected(headers, body).reason == "token missing claim fireledger_body_sha256"


# -- rejected: swapped body ------------------------------------------------------------------------


def test_swapped_body_is_caught_by_the_webhook_signature_alone() -> None:
    headers, body = make_request()
    swapped = make_body(payload={"amount": 1_000_000})
    # Re-mint the token for the swapped body (as if the signing key leaked): the HMAC still fails.
    headers.update(authorization_header(make_token(swapped)))
    assert rejected(headers, swapped).reason == "signature mismatch"


def test_swapped_body_is_caught_by_the_token_body_hash_alone() -> None:
    headers, body = make_request()
    swapped = make_body(payload={"amount": 1_000_000})
    # Re-sign the webhook signature for the swapped body (as if the shared secret leaked): the
    # token's body hash still fails.
    headers.update(signing.build_headers(SECRET, f"{FIRE_KEY}.1", NOW, swapped))
    assert rejected(headers, swapped).reason == "body does not match token"


# -- rejected: fire key, attempt, trigger ---------------------------------------------------------


def test_rejects_fire_key_header_body_mismatch() -> None:
    other = "tn_a.tr_b.20300101T100000Z.0"
    body = make_body(fire_key=other)
    headers, _ = make_request(body, token=make_token(body))  # token and header name FIRE_KEY
    assert rejected(headers, body).reason == "fire key header does not match the body"


def test_rejects_fire_key_header_jti_mismatch() -> None:
    other = "tn_a.tr_b.20300101T100000Z.0"
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, fire_key=other))
    assert rejected(headers, body).reason == "token jti does not match the fire key"


def test_rejects_a_prefix_fire_key_in_jti() -> None:
    # jti "tn_a.tr_b.20300101T090000Z.0.1" must not match header "tn_a.tr_b.20300101T090000Z" + ...
    body = make_body(fire_key=FIRE_KEY[:-2])
    headers, _ = make_request(body, token=make_token(body), fire_key=FIRE_KEY[:-2])
    assert rejected(headers, body).reason == "token jti does not match the attempt"


def test_rejects_token_for_another_attempt() -> None:
    body = make_body(attempt=1)
    headers, _ = make_request(body, token=make_token(body, attempt=2))
    assert rejected(headers, body).reason == "token jti does not match the attempt"


def test_rejects_token_for_another_trigger() -> None:
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, subject="tr_other"))
    assert rejected(headers, body).reason == "token subject does not match the trigger"


def test_rejects_missing_fire_key_header() -> None:
    headers, body = make_request()
    del headers["fireledger-fire-key"]
    assert rejected(headers, body).reason == "missing header fireledger-fire-key"


# -- rejected: webhook signature -------------------------------------------------------------------


def test_rejects_stale_and_future_webhook_timestamps() -> None:
    body = make_body()
    token = make_token(body, now_s=NOW - 10_000, expires_s=NOW + 10_000)
    headers, _ = make_request(body, token=token)
    assert rejected(headers, body, now=NOW + 301).reason == "timestamp too old"
    assert rejected(headers, body, now=NOW - 301).reason == "timestamp too new"
    rcv = receiver(tolerance_s=60)
    assert rejected(headers, body, now=NOW + 61, rcv=rcv).reason == "timestamp too old"


def test_rejects_wrong_secret_and_missing_signature() -> None:
    headers, body = make_request(secret=signing.new_secret())
    assert rejected(headers, body).reason == "signature mismatch"
    del headers["webhook-signature"]
    assert rejected(headers, body).reason == "missing header webhook-signature"


def test_malformed_but_authentic_body_is_400() -> None:
    for body in (b"not json", b"[1]", make_body(attempt="1"), make_body(scheduled_instant="yesterday"),
                 make_body(scheduled_instant="2030-01-01T09:00:00")):
        headers, _ = make_request(body, token=make_token(body))
        err = rejected(headers, body)
        assert err.status == 400, err.reason


# -- dedupe ----------------------------------------------------------------------------------------


def test_rejected_deliveries_are_not_recorded() -> None:
    rcv = receiver()
    headers, body = make_request()
    rejected(headers, body, now=NOW + 36, rcv=rcv)  # expired: must not mark the fire key
    assert rcv.verify(headers, body, now=NOW).duplicate is False


def test_forget_lets_a_retry_through() -> None:
    rcv = receiver()
    headers, body = make_request()
    assert rcv.verify(headers, body, now=NOW).duplicate is False
    rcv.forget(FIRE_KEY)  # the work failed
    assert rcv.verify(headers, body, now=NOW).duplicate is False
    assert rcv.verify(headers, body, now=NOW).duplicate is True


def test_memory_deduper_is_a_bounded_lru() -> None:
    d = MemoryDeduper(max_keys=2)
    assert isinstance(d, Deduper)
    assert [d.seen("a"), d.seen("b"), d.seen("a")] == [False, False, True]
    assert d.seen("c") is False  # evicts b, the least recently seen
    assert len(d) == 2
    assert d.seen("a") is True and d.seen("b") is False
    with pytest.raises(ValueError):
        MemoryDeduper(max_keys=0)


def test_custom_deduper() -> None:
    class SetDeduper:
        def __init__(self) -> None:
            self.keys: set[str] = set()

        def seen(self, fire_key: str) -> bool:
            was = fire_key in self.keys
            self.keys.add(fire_key)
            return was

    store = SetDeduper()
    headers, body = make_request()
    assert receiver(dedupe=store).verify(headers, body, now=NOW).duplicate is False
    assert receiver(dedupe=store).verify(headers, body, now=NOW).duplicate is True  # shared across instances
    receiver(dedupe=store).forget(FIRE_KEY)  # no forget method: a no-op


# -- configuration and JWKS fetching ----------------------------------------------------------------


def test_configuration_errors_do_not_echo_secrets() -> None:
    with pytest.raises(ValueError) as info:
        Receiver("not-a-secret-XYZ", audience=AUDIENCE, issuer=ISSUER)
    assert "XYZ" not in str(info.value)
    with pytest.raises(ValueError):
        Receiver(SECRET, audience="", issuer=ISSUER)
    with pytest.raises(ValueError):  # no usable key: private members, wrong curve, no kid
        Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks={"keys": [
            RING.to_dict()["keys"][0], {"kty": "OKP", "crv": "X25519", "x": "AA", "kid": "k"},
            {k: v for k, v in RING.jwks()["keys"][0].items() if k != "kid"},
        ]})


def test_jwks_callable_is_cached_and_refetched_on_unknown_kid() -> None:
    ring = KeyRing.generate()
    calls: list[int] = []

    def fetch() -> dict:
        calls.append(1)
        return ring.jwks()

    rcv = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks=fetch, dedupe=NoDedupe(), jwks_refresh_min_s=0)
    body = make_body()
    headers, _ = make_request(body, token=make_token(body, ring=ring))
    for _ in range(3):
        rcv.verify(headers, body, now=NOW)
    assert len(calls) == 1
    ring.rotate(NOW)  # a new kid appears: one refetch picks it up, no restart
    headers, _ = make_request(body, token=make_token(body, ring=ring))
    rcv.verify(headers, body, now=NOW)
    assert len(calls) == 2
    # Random kids are refetched at most every jwks_refresh_min_s (here: never again soon).
    slow = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks=fetch, jwks_refresh_min_s=3600)
    slow.verify(headers, body, now=NOW)
    n = len(calls)
    for _ in range(3):
        h, _ = make_request(body, token=make_token(body, ring=KeyRing.generate()))
        rejected(h, body, rcv=slow)
    assert len(calls) == n


def test_jwks_unavailable_is_503_and_a_cached_set_survives_fetch_errors() -> None:
    def broken() -> dict:
        raise OSError("connection refused")

    headers, body = make_request()
    err = rejected(headers, body, rcv=Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks=broken))
    assert (err.reason, err.status) == ("JWKS unavailable", 503)

    state = {"up": True}

    def flaky() -> dict:
        if not state["up"]:
            raise OSError("down")
        return RING.jwks()

    rcv = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks=flaky, jwks_ttl_s=0, dedupe=NoDedupe())
    rcv.verify(headers, body, now=NOW)
    state["up"] = False
    rcv.verify(headers, body, now=NOW)  # stale but usable


# -- real HTTP round trip --------------------------------------------------------------------------


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        async with asyncio.timeout(30):
            return await coro

    return asyncio.run(main())


@asynccontextmanager
async def tenant_endpoint(rcv: Receiver) -> AsyncIterator[tuple[str, list[Delivery | str]]]:
    """A tenant's aiohttp endpoint using the Receiver: 200 (with duplicate flag) or the error."""
    log: list[Delivery | str] = []
    work_done: list[str] = []

    async def fire(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            d = rcv.verify(request.headers, body, now=NOW + 1)
        except ReceiverError as exc:
            log.append(exc.reason)
            return web.json_response({"error": exc.reason}, status=exc.status)
        log.append(d)
        if not d.duplicate:
            work_done.append(d.fire_key)
        return web.json_response({"ok": True, "duplicate": d.duplicate, "work_done": len(work_done)})

    app = web.Application()
    app.router.add_post("/fire", fire)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/fire", log
    finally:
        await runner.cleanup()


def test_http_round_trip_with_http_sender() -> None:
    ring = KeyRing.generate()

    async def scenario() -> None:
        rcv = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks=ring.jwks())
        async with tenant_endpoint(rcv) as (url, log), HttpSender() as sender:
            body = make_body()
            token = make_token(body, ring=ring)

            def req(body: bytes = body) -> HttpRequest:
                return HttpRequest(url=url, secret=SECRET, fire_key=FIRE_KEY, msg_id=f"{FIRE_KEY}.1", timestamp=NOW,
                                   body=body, timeout_s=10, extra_headers=authorization_header(token))

            # Accepted, then the same fire again: 200, flagged duplicate, work not redone.
            first = await sender.send(req())
            second = await sender.send(req())
            assert (first.outcome, first.http_status) == ("delivered", 200)
            assert (second.outcome, second.http_status) == ("delivered", 200)
            assert isinstance(log[0], Delivery) and log[0].duplicate is False
            assert log[0].payload == {"secret_note": PAYLOAD_MARK}
            assert isinstance(log[1], Delivery) and log[1].duplicate is True

            # Swapped body: the headers signed for the original body, another body on the wire.
            swapped = make_body(payload={"amount": 1_000_000})
            signed_headers = req().headers()
            async with aiohttp.ClientSession() as raw:
                async with raw.post(url, data=swapped, headers=signed_headers) as resp:
                    assert resp.status == 401
                    assert (await resp.json()) == {"error": "signature mismatch"}
                # Webhook signature redone for the swapped body (leaked secret): the token catches it.
                resigned = req(swapped).headers()
                async with raw.post(url, data=swapped, headers=resigned) as resp:
                    assert resp.status == 401
                    assert (await resp.json()) == {"error": "body does not match token"}
                # No bearer token at all.
                no_token = {k: v for k, v in signed_headers.items() if k != "Authorization"}
                async with raw.post(url, data=body, headers=no_token) as resp:
                    assert resp.status == 401
                    assert (await resp.json()) == {"error": "missing bearer token"}
            assert log[2:] == ["signature mismatch", "body does not match token", "missing bearer token"]

    run(scenario())
