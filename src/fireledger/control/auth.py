"""Authentication (bearer tokens) and authorisation (roles) for the control plane.

Tokens are random (``fl_`` + 32 random bytes, URL-safe) and stored only as their SHA-256 hex digest.
Authentication happens in :class:`fireledger.control.app.GuardMiddleware` before routing, so an
unauthenticated client learns nothing (not even which routes exist or whether its JSON parses);
each endpoint then checks a role with ``Depends(require("author"))``.

Roles (DESIGN.md invariant 13, separate grants):

* ``reader``   — read triggers, targets, previews and fire history;
* ``author``   — create, amend, pause, resume and delete triggers;
* ``policy``   — set post-outage / overlap policy fields (``missed_fire_policy``,
  ``catchup_horizon``, ``overlap_policy``, ``outcome_window``) on create or amend;
* ``backfill`` — (reserved) request backfills and manual runs;
* ``admin``    — create and delete targets.

For now the token minted by ``fireledger tenant create`` carries every role.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fireledger.domain.keys import new_id
from fireledger.domain.model import Principal, Tenant
from fireledger.store import SqlStore

from .problems import ProblemError

ALL_ROLES: frozenset[str] = frozenset({"author", "policy", "backfill", "reader", "admin"})
TOKEN_PREFIX = "fl_"

#: Declares the bearer scheme in the OpenAPI document; the check itself is the middleware's.
bearer_scheme = HTTPBearer(auto_error=False, description="Bearer token from `fireledger tenant create`")


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if not hmac.compare_digest(scheme.lower().encode(), b"bearer") or not token or " " in token:
        return None
    if len(token) > 512:
        return None
    return token


def unauthorized(detail: str = "a valid bearer token is required") -> ProblemError:
    return ProblemError(401, detail, slug="unauthorized", title="Unauthorized",
                        headers={"WWW-Authenticate": 'Bearer realm="fireledger"'})


def current_principal(
    request: Request,
    _creds: HTTPAuthorizationCredentials | None = Depends(bearer_scheme),
) -> Principal:
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        raise unauthorized()
    return principal


def require(*roles: str) -> Callable[..., Principal]:
    """A dependency returning the principal when it holds every role in ``roles`` (else 403)."""
    unknown = set(roles) - ALL_ROLES
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")

    def dependency(principal: Principal = Depends(current_principal)) -> Principal:
        missing = [r for r in roles if r not in principal.roles]
        if missing:
            raise ProblemError(403, f"this token lacks the role {missing[0]!r}", slug="forbidden",
                               title="Forbidden")
        return principal

    dependency.__name__ = f"require_{'_'.join(roles)}"
    return dependency


def check_role(principal: Principal, role: str) -> None:
    if role not in principal.roles:
        raise ProblemError(403, f"this token lacks the role {role!r}", slug="forbidden", title="Forbidden")


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


def create_tenant(store: SqlStore, name: str, now_us: int,
                  roles: frozenset[str] = ALL_ROLES) -> tuple[str, str]:
    """Create a tenant and its first principal; return ``(tenant_id, token)``. The token is not
    stored (only its hash) and cannot be shown again. Raises ``ValueError`` for a bad name and the
    engine's integrity error for a duplicate name."""
    name = validate_tenant_name(name)
    tenant = Tenant(new_id("tn"), name, now_us)
    token = new_token()
    principal = Principal(new_id("pr"), tenant.id, "owner", roles, now_us)
    store.create_tenant_with_principal(tenant, principal, hash_token(token))
    return tenant.id, token
