"""Tenants and their tokens, without any web framework (the operator CLI imports this).

Tokens are random (``fl_`` + 32 random bytes, URL-safe) and stored only as their SHA-256 hex digest.
"""

from __future__ import annotations

import hashlib
import secrets

from fireledger.domain.keys import new_id
from fireledger.domain.model import Principal, Tenant
from fireledger.store import Store

ALL_ROLES: frozenset[str] = frozenset({"author", "policy", "backfill", "reader", "admin", "runner", "consumer"})
TOKEN_PREFIX = "fl_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def validate_tenant_name(name: str) -> str:
    """Raise ``ValueError`` with a one-line problem for a bad tenant name; return it stripped."""
    text = name.strip()
    if not text:
        raise ValueError("NAME: must not be empty")
    if len(text) > 200:
        raise ValueError("NAME: must be at most 200 characters")
    if any(not ch.isprintable() for ch in text):
        raise ValueError("NAME: must not contain control characters")
    return text


def create_tenant(store: Store, name: str, now_us: int,
                  roles: frozenset[str] = ALL_ROLES, actor: str = "operator") -> tuple[str, str]:
    """Create a tenant and its first principal, audited as done by ``actor``; return
    ``(tenant_id, token)``. The token is not stored (only its hash) and cannot be shown again.
    Raises ``ValueError`` for a bad name and the engine's integrity error for a duplicate name."""
    name = validate_tenant_name(name)
    tenant = Tenant(new_id("tn"), name, now_us)
    token = new_token()
    principal = Principal(new_id("pr"), tenant.id, "owner", roles, now_us)
    store.trust.create_tenant_audited(tenant, principal, hash_token(token), actor)
    return tenant.id, token
