"""The trust boundary's records and the audit chain's pure functions: an audit row to append with
a change (:class:`AuditNote`), a stored row (:class:`AuditEntry`), a target's verification state
(:class:`TargetTrust`), and the chain's canonical form and links (:func:`canonical`,
:func:`chain_hash`, :func:`chain_mac`). No I/O: the store's trust area writes and reads the rows,
``fireledger.security.auditlog`` verifies the chain."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from .model import TargetKind, VerificationState

GENESIS_HASH = "0" * 64


#: The purpose label of the audit chain's key (:func:`fireledger.security.derived.derived_key`).
AUDIT_KEY_LABEL = "audit-chain"


#: The action of the keyed row that seals the unkeyed rows written before migration 0011.
SEAL_ACTION = "audit.seal"


@dataclass(frozen=True, slots=True)
class AuditNote:
    """An audit row to append inside the transaction of the change it records (the registry's acts:
    :meth:`SqlRegistry.create_trigger`, ``amend_trigger``, ``insert_fires``). ``prior``/``new`` are plain
    JSON values (canonicalised when appended); never payloads, secrets or tokens."""

    tenant_id: str | None
    actor: str
    action: str
    at_us: int
    prior: Any = None
    new: Any = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row. ``prior``/``new`` are canonical JSON text (or None)."""

    seq: int
    tenant_id: str | None
    actor: str
    action: str
    at_us: int
    prior: str | None
    new: str | None
    prev_hash: str
    hash: str

    def as_json(self) -> dict[str, Any]:
        """The export form (one JSON line per row): prior/new parsed back into values."""
        return {"seq": self.seq, "tenant_id": self.tenant_id, "actor": self.actor, "action": self.action,
                "at_us": self.at_us, "prior": _loads(self.prior), "new": _loads(self.new),
                "prev_hash": self.prev_hash, "hash": self.hash}


@dataclass(frozen=True, slots=True)
class TargetTrust:
    """A target's ownership-verification state (``expires_us`` None: never lapses). ``addresses``:
    for a plain-http target with a host name, the addresses that answered its challenge (the only
    ones an attempt may connect to; decision 0089), space-separated; None otherwise."""

    id: str
    tenant_id: str
    kind: TargetKind
    url: str | None
    state: VerificationState
    token: str
    verified_us: int | None
    expires_us: int | None
    error: str | None
    deleted_us: int | None
    addresses: str | None = None
    #: How the verification was proved: ``http`` (the challenge path) or ``dns`` (the TXT record);
    #: None when never proved.
    method: str | None = None

    @property
    def pinned(self) -> frozenset[str] | None:
        """:attr:`addresses` as a set (None when none are recorded)."""
        return None if self.addresses is None else frozenset(self.addresses.split())


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def canonical(value: Any) -> str | None:
    """Canonical JSON text of an audit value (sorted keys, no spaces); None stays None."""
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _material(seq: int, tenant_id: str | None, actor: str, action: str, at_us: int, prior: str | None,
              new: str | None, prev_hash: str) -> bytes:
    return json.dumps([seq, tenant_id, actor, action, at_us, prior, new, prev_hash],
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def chain_hash(seq: int, tenant_id: str | None, actor: str, action: str, at_us: int, prior: str | None,
               new: str | None, prev_hash: str) -> str:
    """The *unkeyed* hash of rows written before migration 0011 (SHA-256 over the canonical JSON of
    a row's content and ``prev_hash``). Anyone can compute it: verification accepts it only for the
    rows that the keyed seal row covers."""
    return hashlib.sha256(_material(seq, tenant_id, actor, action, at_us, prior, new, prev_hash)).hexdigest()


def chain_mac(key: bytes, seq: int, tenant_id: str | None, actor: str, action: str, at_us: int,
              prior: str | None, new: str | None, prev_hash: str) -> str:
    """The keyed link a row carries since migration 0011: HMAC-SHA256 under the audit key over the
    same canonical JSON as :func:`chain_hash` (64 hex digits, so the row shape is unchanged)."""
    if len(key) < 32:
        raise ValueError("key: the audit key must be at least 32 bytes")
    return hmac.new(key, _material(seq, tenant_id, actor, action, at_us, prior, new, prev_hash),
                    hashlib.sha256).hexdigest()


#: The stored form of a sealed target signing secret starts with this (``fireledger.security.envelope``).
SECRET_PREFIX = "flsec1."


def is_sealed_secret(stored: str) -> bool:
    """Whether a stored target secret is in the sealed form (``flsec1.<base64url>``)."""
    return isinstance(stored, str) and stored.startswith(SECRET_PREFIX)


__all__ = [
    "AUDIT_KEY_LABEL",
    "GENESIS_HASH",
    "SEAL_ACTION",
    "SECRET_PREFIX",
    "AuditEntry",
    "AuditNote",
    "TargetTrust",
    "canonical",
    "chain_hash",
    "chain_mac",
    "is_sealed_secret",
]
