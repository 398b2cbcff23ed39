"""A trigger's payload digest: lets a client tell whether a payload it holds is the stored one, while
the API never returns the payload (invariant 14; decision 0186).

``digest = "hmac-sha256:" + hex(HMAC(K, tenant_id || 0x00 || canonical JSON))`` where ``K`` is the
deployment's purpose key ``derived_key(store, "payload-digest")`` (:mod:`.derived`; the database does
not hold it) and the canonical JSON sorts keys and drops insignificant whitespace, so two payloads
equal as JSON values have one digest whatever their key order.

Contract:

* A stored payload and a candidate payload (``POST /v1/triggers/dry-run``, role ``author``) equal as
  JSON values have the same digest, in every process of a deployment; different payloads differ.
* Without the key a digest cannot be computed, so a reader cannot confirm a guessed payload offline;
  computing a candidate's digest needs the ``author`` role, which may overwrite the payload anyway.
* A payload that cannot be opened (the tenant's key destroyed, a tampered blob) has no digest (None).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

PAYLOAD_DIGEST_LABEL = "payload-digest"
PREFIX = "hmac-sha256:"


def canonical(plaintext: bytes) -> bytes:
    """``plaintext`` (a JSON document) re-encoded with sorted keys and no whitespace."""
    value = json.loads(plaintext.decode("utf-8"))
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def payload_digest(store: Any, tenant_id: str, plaintext: bytes) -> str:
    """The digest of an encoded payload of ``tenant_id`` (see the module's contract)."""
    from .derived import derived_key

    key = derived_key(store, PAYLOAD_DIGEST_LABEL)
    mac = hmac.new(key, tenant_id.encode("utf-8") + b"\x00" + canonical(plaintext), hashlib.sha256)
    return PREFIX + mac.hexdigest()


def stored_payload_digest(store: Any, tenant_id: str, trigger_id: str, version: int, sealed: bytes) -> str | None:
    """The digest of a trigger version's stored (sealed) payload; None when it cannot be opened."""
    from .envelope import PayloadUnreadable, cipher_for

    try:
        plain = cipher_for(store).open(tenant_id, trigger_id, version, sealed)
    except (PayloadUnreadable, ValueError):
        return None
    return payload_digest(store, tenant_id, plain)


__all__ = ["PAYLOAD_DIGEST_LABEL", "canonical", "payload_digest", "stored_payload_digest"]
