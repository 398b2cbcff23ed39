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

import hmac
from collections.abc import Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fireledger.domain.model import Principal

from .problems import ProblemError
from .tenants import ALL_ROLES, TOKEN_PREFIX, create_tenant, hash_token, new_token, validate_tenant_name

#: Declares the bearer scheme in the OpenAPI document; the check itself is the middleware's.
bearer_scheme = HTTPBearer(auto_error=False, description="Bearer token from `fireledger tenant create`")


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


__all__ = [
    "ALL_ROLES",
    "TOKEN_PREFIX",
    "bearer_scheme",
    "check_role",
    "create_tenant",
    "current_principal",
    "hash_token",
    "new_token",
    "parse_bearer",
    "require",
    "unauthorized",
    "validate_tenant_name",
]
