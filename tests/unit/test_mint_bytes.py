"""The per-attempt token's claims are written out by hand (decision 0207): the bytes are exactly
``json.dumps`` of the claims dict with ``separators=(",", ":")`` and ``ensure_ascii=True`` (what
``mint`` sent before), whatever the strings hold, and the token still verifies with PyJWT."""

from __future__ import annotations

import base64
import json

import jwt
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.dispatch.credentials import BODY_SHA256_CLAIM, KeyRing, mint

RING = KeyRing.generate()
NOW = 1_780_000_000
SHA = "ab" * 32
TEXT = st.text(min_size=1, max_size=40)   # quotes, backslashes, controls, non-ASCII, astral characters


def _claims_segment(token: str) -> bytes:
    seg = token.split(".")[1]
    return base64.urlsafe_b64decode(seg + "=" * (-len(seg) % 4))


@settings(max_examples=200)
@given(issuer=TEXT, audience=TEXT, subject=TEXT, fire_key=TEXT, attempt=st.integers(0, 10**9),
       life=st.integers(1, 10**6))
def test_the_claims_are_the_bytes_json_dumps_writes(issuer: str, audience: str, subject: str, fire_key: str,
                                                    attempt: int, life: int) -> None:
    token = mint(RING, issuer=issuer, audience=audience, subject=subject, fire_key=fire_key, attempt=attempt,
                 body_sha256=SHA, now_s=NOW, expires_s=NOW + life)
    expected = json.dumps({"iss": issuer, "aud": audience, "sub": subject, "iat": NOW, "nbf": NOW,
                           "exp": NOW + life, "jti": f"{fire_key}.{attempt}", BODY_SHA256_CLAIM: SHA},
                          separators=(",", ":"), ensure_ascii=True).encode("ascii")
    assert _claims_segment(token) == expected


def test_a_token_with_awkward_strings_verifies_with_pyjwt() -> None:
    aud = 'https://example.test/h?q="é"\\\U0001F600'
    token = mint(RING, issuer="http://fl\u2028", audience=aud, subject="trg\x01", fire_key="k", attempt=3,
                 body_sha256=SHA, now_s=NOW, expires_s=NOW + 30)
    pem = RING.current.private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    claims = jwt.decode(token, pem, algorithms=["EdDSA"], audience=aud, issuer="http://fl\u2028",
                        options={"verify_exp": False, "verify_nbf": False, "verify_iat": False})
    assert claims["sub"] == "trg\x01" and claims["jti"] == "k.3" and claims[BODY_SHA256_CLAIM] == SHA
