"""Standard Webhooks v1 signing: known answer, tampering, replay window, rotation."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fireledger.dispatch.signing import (
    SignatureError,
    build_headers,
    new_secret,
    secret_key,
    sign,
    verify,
)

# The example from the Standard Webhooks specification.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def spec_headers() -> dict[str, str]:
    return {"webhook-id": SPEC_ID, "webhook-timestamp": str(SPEC_TS), "webhook-signature": SPEC_SIG}


def test_known_answer_from_the_spec() -> None:
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_TS, SPEC_BODY) == SPEC_SIG
    assert build_headers(SPEC_SECRET, SPEC_ID, SPEC_TS, SPEC_BODY) == spec_headers()
    verify(SPEC_SECRET, spec_headers(), SPEC_BODY, now=SPEC_TS)


def test_header_names_are_case_insensitive() -> None:
    headers = {k.upper(): v for k, v in spec_headers().items()}
    verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TS)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("body", b'{"test": 2432232315}'),
        ("body", SPEC_BODY + b" "),
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJeK"),
        ("webhook-timestamp", str(SPEC_TS + 1)),
    ],
)
def test_tampering_is_rejected(field: str, value: object) -> None:
    headers = spec_headers()
    body = SPEC_BODY
    if field == "body":
        assert isinstance(value, bytes)
        body = value
    else:
        assert isinstance(value, str)
        headers[field] = value
    with pytest.raises(SignatureError) as info:
        verify(SPEC_SECRET, headers, body, now=SPEC_TS)
    assert info.value.reason == "signature mismatch"


def test_wrong_secret_is_rejected() -> None:
    with pytest.raises(SignatureError, match="signature mismatch"):
        verify(new_secret(), spec_headers(), SPEC_BODY, now=SPEC_TS)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_missing_header_is_rejected(missing: str) -> None:
    headers = spec_headers()
    del headers[missing]
    with pytest.raises(SignatureError, match=f"missing header {missing}"):
        verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TS)


@pytest.mark.parametrize(
    ("now", "ok"),
    [
        (SPEC_TS, True),
        (SPEC_TS + 300, True),
        (SPEC_TS - 300, True),
        (SPEC_TS + 301, False),  # stale: replayed too late
        (SPEC_TS - 301, False),  # from the future
        (SPEC_TS + 300.5, False),
    ],
)
def test_replay_window_both_directions(now: float, ok: bool) -> None:
    if ok:
        verify(SPEC_SECRET, spec_headers(), SPEC_BODY, now=now)
    else:
        with pytest.raises(SignatureError, match=r"timestamp too (old|new)"):
            verify(SPEC_SECRET, spec_headers(), SPEC_BODY, now=now)


def test_custom_tolerance() -> None:
    verify(SPEC_SECRET, spec_headers(), SPEC_BODY, now=SPEC_TS + 10, tolerance_s=10)
    with pytest.raises(SignatureError, match="too old"):
        verify(SPEC_SECRET, spec_headers(), SPEC_BODY, now=SPEC_TS + 11, tolerance_s=10)


@pytest.mark.parametrize("ts", ["", "abc", "-5", "1614265330.0", "１６１４２６５３３０", "9" * 30])
def test_malformed_timestamp_is_rejected(ts: str) -> None:
    headers = spec_headers()
    headers["webhook-timestamp"] = ts
    with pytest.raises(SignatureError):
        verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TS)


def test_several_signatures_any_may_match() -> None:
    other = sign(new_secret(), SPEC_ID, SPEC_TS, SPEC_BODY)
    for sig in (f"{other} {SPEC_SIG}", f"{SPEC_SIG} {other}", f"v2,abc {SPEC_SIG}"):
        headers = spec_headers()
        headers["webhook-signature"] = sig
        verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TS)
    headers = spec_headers()
    headers["webhook-signature"] = f"{other} v1,AAAA"
    with pytest.raises(SignatureError, match="signature mismatch"):
        verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TS)


def test_only_v1_entries_count() -> None:
    headers = spec_headers()
    headers["webhook-signature"] = SPEC_SIG.replace("v1,", "v1a,")
    with pytest.raises(SignatureError, match="no v1 signature"):
        verify(SPEC_SECRET, headers, SPEC_BODY, now=SPEC_TS)


def test_several_secrets_for_rotation() -> None:
    verify([new_secret(), SPEC_SECRET], spec_headers(), SPEC_BODY, now=SPEC_TS)
    with pytest.raises(SignatureError):
        verify([new_secret(), new_secret()], spec_headers(), SPEC_BODY, now=SPEC_TS)


def test_new_secret_format() -> None:
    s = new_secret()
    assert s.startswith("whsec_")
    assert len(base64.b64decode(s[len("whsec_") :], validate=True)) == 32
    assert secret_key(s) == base64.b64decode(s[6:])
    assert new_secret() != s


@pytest.mark.parametrize("bad", ["", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_!!!notbase64"])
def test_malformed_secret_is_a_value_error_without_echo(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        sign(bad, SPEC_ID, SPEC_TS, SPEC_BODY)
    if bad:
        assert bad not in str(info.value)


@pytest.mark.parametrize("msg_id", ["", "a b", "a\nb"])
def test_bad_msg_id_refused_when_signing(msg_id: str) -> None:
    with pytest.raises(ValueError):
        sign(SPEC_SECRET, msg_id, SPEC_TS, SPEC_BODY)


@given(
    body=st.binary(max_size=256),
    msg_id=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40),
    ts=st.integers(min_value=0, max_value=2**40),
    flip=st.integers(min_value=0, max_value=10_000),
)
def test_roundtrip_and_any_body_bit_flip_is_detected(body: bytes, msg_id: str, ts: int, flip: int) -> None:
    headers = build_headers(SPEC_SECRET, msg_id, ts, body)
    verify(SPEC_SECRET, headers, body, now=ts)
    if body:
        i = flip % (len(body) * 8)
        tampered = bytearray(body)
        tampered[i // 8] ^= 1 << (i % 8)
        with pytest.raises(SignatureError):
            verify(SPEC_SECRET, headers, bytes(tampered), now=ts)
