"""Standard Webhooks v1 signatures (https://www.standardwebhooks.com/).

Every HTTP dispatch is signed with the target's secret; outcome callbacks are verified with the
same scheme. All functions here are pure: they read no clock and no randomness except
:func:`new_secret`.

Wire format
-----------
* Secret: ``whsec_<base64 of the key bytes>``; :func:`new_secret` makes 32 random key bytes.
  The HMAC key is the base64-decoded part after ``whsec_``.
* Signed content: ``f"{msg_id}.{timestamp}.".encode() + body`` (the body is the exact bytes sent).
* ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of the signed content>``. A receiver accepts a
  space-separated list of such entries (key rotation); entries of other versions are ignored.
* ``webhook-timestamp``: integer seconds since the Unix epoch, in decimal.
* ``webhook-id``: the message id (here: one per attempt).

Secrets never appear in exception messages or reprs produced by this module.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import secrets as _secrets
from collections.abc import Iterable, Mapping

from fireledger.errors import FireledgerError

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "HEADER_ID",
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "SECRET_PREFIX",
    "SignatureError",
    "build_headers",
    "new_secret",
    "secret_key",
    "sign",
    "verify",
]

SECRET_PREFIX = "whsec_"
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
DEFAULT_TOLERANCE_S = 300
_VERSION = "v1"
_MAX_SIGNATURE_ENTRIES = 32


class SignatureError(FireledgerError):
    """A message failed verification; ``reason`` is a short, secret-free explanation."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def new_secret(nbytes: int = 32) -> str:
    """Return a fresh secret ``whsec_<base64 of nbytes random bytes>`` (default 32 bytes)."""
    if nbytes < 16:
        raise ValueError("nbytes must be at least 16")
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(nbytes)).decode("ascii")


#: Keys of secrets decoded before (every attempt signs with its target's secret): decision 0234.
_KEYS: dict[str, bytes] = {}
_KEYS_MAX = 4096


def secret_key(secret: str) -> bytes:
    """Return the HMAC key of ``secret`` (the base64-decoded part after ``whsec_``).

    Raises ``ValueError`` (without echoing the secret) when the secret is not of that form or the
    key is empty. A valid secret's key is remembered (at most :data:`_KEYS_MAX`, then forgotten
    all at once), so checking and signing an attempt decode it once per process.
    """
    if type(secret) is str:
        hit = _KEYS.get(secret)
        if hit is not None:
            return hit
    key = _decode_secret(secret)
    if len(_KEYS) >= _KEYS_MAX:
        _KEYS.clear()
    _KEYS[secret] = key
    return key


def _decode_secret(secret: str) -> bytes:
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("secret must be a string starting with 'whsec_'")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("secret is not valid base64 after 'whsec_'") from None
    if not key:
        raise ValueError("secret key is empty")
    return key


#: A character a message id must not contain: whitespace (ASCII) or a control character.
_MSG_ID_BAD = re.compile(r"[\x00-\x20\x7f]")


def _check_msg_id(msg_id: str) -> None:
    """One regex scan in C (a Python loop over the characters was most of building an attempt's headers)."""
    if not isinstance(msg_id, str) or not msg_id:
        raise ValueError("msg_id must be a non-empty string")
    if _MSG_ID_BAD.search(msg_id) is not None:
        raise ValueError("msg_id must not contain whitespace or control characters")


def _check_timestamp(timestamp: int) -> None:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError("timestamp must be a non-negative int (seconds since the epoch)")


def _signature_bytes(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    signed = f"{msg_id}.{timestamp}.".encode() + bytes(body)
    return base64.b64encode(hmac.digest(key, signed, "sha256"))   # one-shot HMAC in C: the same bytes


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Return the ``webhook-signature`` value ``v1,<base64 HMAC-SHA256>`` for this message.

    ``body`` must be the exact bytes that are sent. Raises ``ValueError`` for a malformed secret,
    an empty/whitespace-bearing ``msg_id`` or a negative/non-int ``timestamp``.
    """
    _check_msg_id(msg_id)
    _check_timestamp(timestamp)
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError("body must be bytes")
    return f"{_VERSION}," + _signature_bytes(secret_key(secret), msg_id, timestamp, bytes(body)).decode("ascii")


def build_headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Return the three Standard Webhooks headers (lower-case names) for this message."""
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_SIGNATURE: sign(secret, msg_id, timestamp, body),
    }


def verify(
    secret: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> None:
    """Verify a Standard Webhooks v1 message; return ``None`` or raise :class:`SignatureError`.

    * ``secret``: one secret, or several (any may match, for rotation). Malformed secrets raise
      ``ValueError`` (a configuration error, not a bad message).
    * ``headers``: looked up case-insensitively; ``webhook-id``, ``webhook-timestamp`` and
      ``webhook-signature`` are required.
    * ``now``: the verifier's current time in epoch seconds (injected, never read here). The
      timestamp must lie within ``tolerance_s`` of ``now`` in both directions (replay window).
    * The signature header may carry several space-separated entries; any ``v1,`` entry that
      matches any secret is accepted. Comparison is constant-time per entry.
    """
    secret_list = [secret] if isinstance(secret, str) else list(secret)
    if not secret_list:
        raise ValueError("at least one secret is required")
    keys = [secret_key(s) for s in secret_list]

    lower: dict[str, str] = {}
    for name, value in headers.items():
        lower.setdefault(name.lower(), value)
    for name in (HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE):
        if not lower.get(name):
            raise SignatureError(f"missing header {name}")
    msg_id = lower[HEADER_ID]
    ts_text = lower[HEADER_TIMESTAMP].strip()
    if not (ts_text.isascii() and ts_text.isdigit()) or len(ts_text) > 15:
        raise SignatureError("invalid webhook-timestamp")
    timestamp = int(ts_text)
    if now - timestamp > tolerance_s:
        raise SignatureError("timestamp too old")
    if timestamp - now > tolerance_s:
        raise SignatureError("timestamp too new")

    provided: list[bytes] = []
    for entry in lower[HEADER_SIGNATURE].split(" ")[:_MAX_SIGNATURE_ENTRIES]:
        version, sep, value = entry.partition(",")
        if sep and version == _VERSION and value:
            provided.append(value.encode("utf-8", "surrogateescape"))
    if not provided:
        raise SignatureError("no v1 signature")

    try:
        expected = [_signature_bytes(k, msg_id, timestamp, bytes(body)) for k in keys]
    except UnicodeEncodeError:
        raise SignatureError("invalid webhook-id") from None
    matched = False
    for want in expected:
        for got in provided:
            # Evaluate every pair so the time taken does not depend on which entry matched.
            matched |= hmac.compare_digest(want, got)
    if not matched:
        raise SignatureError("signature mismatch")
