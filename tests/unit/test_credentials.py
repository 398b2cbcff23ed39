"""Per-attempt JWTs: key ring (thumbprint kids, file format, rotation, pruning) and mint (real crypto)."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.bindings import crypto_sign

from fireledger.dispatch import signing
from fireledger.dispatch.credentials import (
    JWKS_PATH,
    KeyRing,
    KeyRingFile,
    SigningKey,
    authorization_header,
    body_sha256,
    mint,
)
from fireledger.receiver import Receiver, ReceiverError

NOW = 1_900_000_000
SECRET = signing.new_secret()
ISSUER = "https://fireledger.test"
AUDIENCE = "https://hooks.tenant.test/fire"
FIRE_KEY = "tn_a.tr_b.20300101T090000Z.0"


def b64u_json(part: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def body_for(attempt: int = 1) -> bytes:
    return json.dumps({
        "fire_key": FIRE_KEY, "trigger_id": "tr_b", "scheduled_instant": "2030-01-01T09:00:00Z",
        "attempt": attempt, "lane": "on_time", "kind": "scheduled", "version": 1, "payload": {"n": 1},
    }, separators=(",", ":")).encode()


def token_for(ring: KeyRing, body: bytes, *, attempt: int = 1, now_s: int = NOW, expires_s: int = NOW + 30) -> str:
    return mint(ring, issuer=ISSUER, audience=AUDIENCE, subject="tr_b", fire_key=FIRE_KEY, attempt=attempt,
                body_sha256=body_sha256(body), now_s=now_s, expires_s=expires_s)


def request_for(ring: KeyRing, *, attempt: int = 1, now_s: int = NOW) -> tuple[dict[str, str], bytes]:
    body = body_for(attempt)
    headers = {"fireledger-fire-key": FIRE_KEY,
               **signing.build_headers(SECRET, f"{FIRE_KEY}.{attempt}", now_s, body),
               **authorization_header(token_for(ring, body, attempt=attempt, now_s=now_s, expires_s=now_s + 30))}
    return headers, body


# -- mint ------------------------------------------------------------------------------------------


def test_mint_header_and_claims_verify_with_pyjwt() -> None:
    ring = KeyRing.generate()
    body = body_for()
    token = token_for(ring, body)
    head, claims_part, _ = token.split(".")
    assert b64u_json(head) == {"alg": "EdDSA", "typ": "JWT", "kid": ring.current.kid}
    assert b64u_json(claims_part) == {
        "iss": ISSUER, "aud": AUDIENCE, "sub": "tr_b", "iat": NOW, "nbf": NOW, "exp": NOW + 30,
        "jti": f"{FIRE_KEY}.1", "fireledger_body_sha256": body_sha256(body),
    }
    key = jwt.PyJWK(ring.jwks()["keys"][0])
    claims = jwt.decode(token, key=key, algorithms=["EdDSA"], audience=AUDIENCE, issuer=ISSUER,
                        options={"verify_exp": False, "verify_nbf": False, "verify_iat": False})
    assert claims["fireledger_body_sha256"] == body_sha256(body)


def test_mint_reads_no_clock_and_is_deterministic() -> None:
    ring = KeyRing.generate()
    body = body_for()
    # Ed25519 is deterministic and mint takes its times as arguments: same inputs, same token,
    # even for times far from the wall clock.
    assert token_for(ring, body, now_s=5, expires_s=6) == token_for(ring, body, now_s=5, expires_s=6)
    assert token_for(ring, body, attempt=2) != token_for(ring, body, attempt=1)


def test_mint_signature_is_the_rfc8037_one_and_cryptographys() -> None:
    # The token is signed through libsodium (decision 0254). Ed25519 is deterministic, so the
    # signature must be byte for byte the one cryptography's key makes; RFC 8037 appendix A.4 pins
    # it for one key and one signing input, independently of both libraries.
    d = base64.urlsafe_b64decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=")
    rfc = SigningKey.from_private(Ed25519PrivateKey.from_private_bytes(d), "current", None)
    rfc.header_b64 = b"eyJhbGciOiJFZERTQSJ9"   # {"alg":"EdDSA"}, the RFC's protected header
    ring = KeyRing([rfc])
    claims = body_for()
    token = token_for(ring, claims)
    signing_input, signature = token.rsplit(".", 1)
    assert base64.urlsafe_b64decode(signature + "==") == rfc.private.sign(signing_input.encode())
    # A.4's payload is "Example of Ed25519 signing"; its signature, from the RFC:
    a4 = crypto_sign(b"eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc", rfc.sodium_sk)[:64]
    assert base64.urlsafe_b64encode(a4).rstrip(b"=").decode() == (
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg")
    for _ in range(20):   # and for fresh keys, on the real signing input of a token
        ring = KeyRing.generate()
        token = token_for(ring, claims)
        signing_input, signature = token.rsplit(".", 1)
        assert base64.urlsafe_b64decode(signature + "==") == ring.current.private.sign(signing_input.encode())
        ring.current.private.public_key().verify(base64.urlsafe_b64decode(signature + "=="),
                                                 signing_input.encode())


@pytest.mark.parametrize(
    "kw",
    [
        {"issuer": ""},
        {"audience": ""},
        {"subject": ""},
        {"fire_key": ""},
        {"attempt": -1},
        {"attempt": True},
        {"body_sha256": "ABC"},
        {"body_sha256": "F" * 64},
        {"now_s": NOW, "expires_s": NOW},
        {"now_s": -1},
        {"expires_s": 1.5},
    ],
)
def test_mint_rejects_bad_arguments(kw: dict) -> None:
    args = {"issuer": ISSUER, "audience": AUDIENCE, "subject": "tr_b", "fire_key": FIRE_KEY, "attempt": 1,
            "body_sha256": body_sha256(b"{}"), "now_s": NOW, "expires_s": NOW + 30, **kw}
    with pytest.raises(ValueError):
        mint(KeyRing.generate(), **args)


# -- keys ------------------------------------------------------------------------------------------


def test_kid_is_the_rfc7638_thumbprint_rfc8037_vector() -> None:
    # RFC 8037 appendix A.1 (key) and A.3 (its JWK thumbprint).
    d = base64.urlsafe_b64decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=")
    key = SigningKey.from_private(Ed25519PrivateKey.from_private_bytes(d), "current", None)
    assert key.x == "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert key.kid == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_jwks_is_public_only() -> None:
    ring = KeyRing.generate()
    doc = ring.jwks()
    assert doc == {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": ring.current.x, "kid": ring.current.kid,
                             "alg": "EdDSA", "use": "sig"}]}
    d = ring.to_dict()["keys"][0]["d"]
    assert all("d" not in k for k in doc["keys"]) and d not in json.dumps(doc)
    assert JWKS_PATH == "/.well-known/jwks.json"
    assert d not in repr(ring.current) and d not in repr(ring)


def test_save_is_0600_and_load_round_trips(tmp_path: Path) -> None:
    ring = KeyRing.generate(now_s=NOW)
    ring.stage(NOW)
    ring.rotate(NOW + 10, overlap_s=100)
    path = tmp_path / "keys.json"
    ring.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert all("d" in k for k in doc["keys"])  # the file holds private keys
    loaded = KeyRing.load(path)
    assert [(k.kid, k.state, k.retired_s, k.publish_until_s) for k in loaded.keys] == [
        (k.kid, k.state, k.retired_s, k.publish_until_s) for k in ring.keys
    ]
    assert loaded.current.kid == ring.current.kid
    body = body_for()
    assert token_for(loaded, body) == token_for(ring, body)  # same private key
    assert not [p for p in tmp_path.iterdir() if p.name != "keys.json"]  # no temp file left


def test_load_or_create_creates_once(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    first = KeyRing.load_or_create(path, now_s=NOW)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    second = KeyRing.load_or_create(path, now_s=NOW + 1)
    assert second.current.kid == first.current.kid
    assert second.current.created_s == NOW


def test_load_rejects_bad_files_without_echoing_keys(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    good = ring.to_dict()
    d = good["keys"][0]["d"]
    cases = {
        "not json": "{",
        "format": json.dumps({**good, "format": "other"}),
        "kid": json.dumps({"format": good["format"], "keys": [{**good["keys"][0], "kid": "abc"}]}),
        "x": json.dumps({"format": good["format"],
                         "keys": [{**good["keys"][0], "x": KeyRing.generate().current.x}]}),
        "two current": json.dumps({"format": good["format"],
                                   "keys": good["keys"] + KeyRing.generate().to_dict()["keys"]}),
        "no current": json.dumps({"format": good["format"],
                                  "keys": [{**good["keys"][0], "fireledger_state": "next"}]}),
        "short d": json.dumps({"format": good["format"], "keys": [{**good["keys"][0], "d": "AAAA"}]}),
        "rsa": json.dumps({"format": good["format"], "keys": [{"kty": "RSA", "d": d}]}),
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        with pytest.raises(ValueError) as info:
            KeyRing.load(path)
        assert d not in str(info.value), name


# -- rotation --------------------------------------------------------------------------------------


def test_rotation_old_tokens_verify_until_pruned() -> None:
    ring = KeyRing.generate(now_s=NOW)
    old_kid = ring.current.kid
    published = {"now": NOW}
    receiver = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER,
                        jwks=lambda: ring.jwks(published["now"]), jwks_refresh_min_s=0, jwks_ttl_s=0)

    old_headers, old_body = request_for(ring, attempt=1)
    assert receiver.verify(old_headers, old_body, now=NOW).attempt == 1

    new_kid = ring.rotate(NOW + 10, overlap_s=3600)
    assert new_kid == ring.current.kid != old_kid
    assert {k["kid"] for k in ring.jwks()["keys"]} == {old_kid, new_kid}
    # The new key signs from now on ...
    new_headers, new_body = request_for(ring, attempt=2, now_s=NOW + 10)
    assert b64u_json(new_headers["Authorization"].split()[1].split(".")[0])["kid"] == new_kid
    assert receiver.verify(new_headers, new_body, now=NOW + 10).attempt == 2
    # ... and a token minted by the old key before rotation still verifies while it is published.
    receiver.forget(FIRE_KEY)
    assert receiver.verify(old_headers, old_body, now=NOW + 12).duplicate is False

    assert ring.prune(NOW + 10 + 3599) == []
    assert ring.prune(NOW + 10 + 3600) == [old_kid]
    assert [k["kid"] for k in ring.jwks()["keys"]] == [new_kid]
    receiver.forget(FIRE_KEY)
    with pytest.raises(ReceiverError) as info:
        receiver.verify(old_headers, old_body, now=NOW + 12)
    assert info.value.reason == "unknown token key id"


def test_jwks_hides_retired_keys_past_their_window_even_before_prune() -> None:
    ring = KeyRing.generate()
    old = ring.current.kid
    ring.rotate(NOW, overlap_s=60)
    assert old in {k["kid"] for k in ring.jwks(NOW + 59)["keys"]}
    assert old not in {k["kid"] for k in ring.jwks(NOW + 60)["keys"]}
    assert old in {k["kid"] for k in ring.jwks()["keys"]}  # not pruned yet


def test_stage_publishes_before_signing_then_rotate_promotes_it() -> None:
    ring = KeyRing.generate()
    first = ring.current.kid
    staged = ring.stage()
    assert ring.stage() == staged  # idempotent
    assert {k["kid"] for k in ring.jwks()["keys"]} == {first, staged}
    body = body_for()
    assert b64u_json(token_for(ring, body).split(".")[0])["kid"] == first  # staged key does not sign
    # A receiver that cached the JWKS while the key was staged verifies tokens after rotation.
    receiver = Receiver(SECRET, audience=AUDIENCE, issuer=ISSUER, jwks=ring.jwks())
    assert ring.rotate(NOW) == staged
    headers, body = request_for(ring)
    assert receiver.verify(headers, body, now=NOW).fire_key == FIRE_KEY


def test_rotate_rejects_bad_times() -> None:
    ring = KeyRing.generate()
    with pytest.raises(ValueError):
        ring.rotate(-1)
    with pytest.raises(ValueError):
        ring.rotate(NOW, overlap_s=-5)


def test_keyringfile_shares_rotation_between_processes(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    dispatcher = KeyRingFile(path, now_s=NOW)  # creates the file
    control = KeyRingFile(path)  # another process on the same host
    assert control.ring().current.kid == dispatcher.ring().current.kid
    old = dispatcher.ring().current.kid
    staged = control.stage(NOW)
    assert staged in {k["kid"] for k in dispatcher.ring().jwks()["keys"]}  # reloaded on change
    new = control.rotate(NOW + 5, overlap_s=100)
    assert new == staged
    assert dispatcher.ring().current.kid == new  # the minting side picks the rotation up
    assert {k["kid"] for k in dispatcher.ring().jwks(NOW + 50)["keys"]} == {old, new}
    assert dispatcher.prune(NOW + 105) == [old]
    assert [k["kid"] for k in control.ring().jwks()["keys"]] == [new]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_keyringfile_max_age_skips_the_stat_only_within_that_age(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    dispatcher = KeyRingFile(path, now_s=NOW)
    control = KeyRingFile(path)
    old = dispatcher.ring(max_age_s=1e9).current.kid    # first call looks at the file
    new = control.rotate(NOW + 5, overlap_s=100)
    assert new != old
    assert dispatcher.ring(max_age_s=1e9).current.kid == old   # within the age: no stat, old ring
    assert dispatcher.ring().current.kid == new                # no age: the change is seen at once
