"""Authentication (bearer tokens) and authorisation (roles) for the control plane.

Tokens are random (``fl_`` + 32 random bytes, URL-safe) and stored only as their SHA-256 hex digest.
Authentication happens in :class:`fireledger.control.app.GuardMiddleware` before routing, so an
unauthenticated client learns nothing (not even which routes exist or whether its JSON parses);
each endpoint then checks a role with ``Depends(require("author"))``.

Roles (DESIGN.md invariant 13, separate grants; seed ADR-15):

* ``reader``   — read triggers, targets, previews and fire history;
* ``author``   — create, amend, pause, resume and delete triggers, redrive dead letters;
* ``runner``   — run a trigger now (a manual fire, audited; decision 0175: not an author's act);
* ``policy``   — set post-outage / overlap policy fields (``missed_fire_policy``,
  ``catchup_horizon``, ``overlap_policy``, ``outcome_window``) on create or amend, or through
  ``PATCH /v1/triggers/{id}/policy``; change the tenant's dispatch quota (``PATCH /v1/tenant/quota``);
* ``consumer`` — pull and ack the tenant's queues, nothing else (``admin`` may too);
* ``backfill`` — request backfills (fires for a declared past window, bounded per operation);
* ``admin``    — the tenant's principals and tokens, its targets and their verification, its audit.

The token minted by ``fireledger tenant create`` carries every role; admins mint narrower ones
(``POST /v1/principals``). A refusal for a missing role is a :class:`Forbidden` (403): the app
records it in the audit (actor, request, missing role) before answering.

The API surface shows the split (:func:`apply_surfaces` tags every route): **management**
(definitions and targets), **policy**, **privileged** (principals, audit, backfill)
and **history** (fires).
"""

from __future__ import annotations

import hmac
import typing
from collections.abc import Callable
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fireledger.domain.model import Principal

from .problems import ProblemError, invalid
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


class Forbidden(ProblemError):
    """403 for a missing role; ``context`` (e.g. the policy fields asked for) goes to the audit."""

    def __init__(self, role: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(403, f"this token lacks the role {role!r}", slug="forbidden", title="Forbidden")
        self.role = role
        self.context = dict(context or {})


def require(*roles: str) -> Callable[..., Principal]:
    """A dependency returning the principal when it holds every role in ``roles`` (else
    :class:`Forbidden`, audited)."""
    unknown = set(roles) - ALL_ROLES
    if unknown:
        raise ValueError(f"unknown roles {sorted(unknown)}")

    def dependency(request: Request, principal: Principal = Depends(current_principal)) -> Principal:
        missing = [r for r in roles if r not in principal.roles]
        if missing:
            raise Forbidden(missing[0])
        check_query(request)
        return principal

    dependency.__name__ = f"require_{'_'.join(roles)}"
    dependency.fireledger_roles = frozenset(roles)  # type: ignore[attr-defined]
    return dependency


def require_any(*roles: str) -> Callable[..., Principal]:
    """A dependency returning the principal when it holds at least one of ``roles`` (else
    :class:`Forbidden` naming the first, the narrowest grant that would do; audited). Marked with
    ``fireledger_any_roles`` so the role matrix and the surfaces can tell it from :func:`require`."""
    unknown = set(roles) - ALL_ROLES
    if unknown or not roles:
        raise ValueError(f"unknown roles {sorted(unknown)}")

    def dependency(request: Request, principal: Principal = Depends(current_principal)) -> Principal:
        if not principal.roles & set(roles):
            raise Forbidden(roles[0])
        check_query(request)
        return principal

    dependency.__name__ = f"require_any_{'_'.join(roles)}"
    dependency.fireledger_roles = frozenset(roles)  # type: ignore[attr-defined]
    dependency.fireledger_any_roles = True  # type: ignore[attr-defined]
    return dependency


_QUERY_NAMES: dict[int, tuple[frozenset[str], frozenset[str]]] = {}


def _query_params(dependant: Any) -> list[Any]:
    out = list(getattr(dependant, "query_params", ()))
    for dep in getattr(dependant, "dependencies", ()):
        out += _query_params(dep)
    return out


def _is_sequence(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (list, set, tuple, frozenset):
        return True
    return any(_is_sequence(a) for a in typing.get_args(annotation)) if origin is not None else False


def check_query(request: Request) -> None:
    """Refuse (422, naming each) query parameters the route does not declare, and a single-valued
    parameter given more than once — bad input is refused, not silently ignored (DESIGN.md §5)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    names = _QUERY_NAMES.get(id(route))
    if names is None:
        params = _query_params(dependant)
        names = _QUERY_NAMES[id(route)] = (
            frozenset(p.alias for p in params),
            frozenset(p.alias for p in params if _is_sequence(getattr(p.field_info, "annotation", None))))
    known, repeatable = names
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, _ in request.query_params.multi_items():
        field = key if key and len(key) <= 60 and key.isprintable() else "query"
        if key not in known:
            problem = (field, "is not a parameter of this operation")
        elif key in seen and key not in repeatable:
            problem = (field, "is given more than once")
        else:
            seen.add(key)
            continue
        if problem not in problems:
            problems.append(problem)
    if problems:
        raise invalid(problems)


def check_role(principal: Principal, role: str, **context: Any) -> None:
    """Raise :class:`Forbidden` (audited with ``context``) unless the principal holds ``role``."""
    if role not in principal.roles:
        raise Forbidden(role, context)


#: The four API surfaces (OpenAPI tags), in the order the documentation lists them.
SURFACES: dict[str, str] = {
    "management": "Definitions: triggers (role author), running one now (role runner), reading triggers, "
                  "targets and the tenant's quota (role reader), pulling and acking queues (role consumer).",
    "policy": "Post-outage and overlap policy of a trigger, and the tenant's dispatch quota (role policy).",
    "privileged": "Acts that grant or multiply work: principals and tokens, the audit, targets and their "
                  "ownership verification (role admin); backfill (role backfill).",
    "history": "Fire history: what was decided and delivered, with causes (role reader).",
}


def _route_roles(dependant: Any) -> set[str]:
    found: set[str] = set()
    for dep in getattr(dependant, "dependencies", ()):
        found |= set(getattr(dep.call, "fireledger_roles", ()))
        found |= _route_roles(dep)
    return found


def surface_of(path: str, roles: set[str], tags: Any = ()) -> str:
    """The surface of a route from the roles it requires (and, for readers, its path or its
    router's own ``history`` tag)."""
    if "consumer" in roles:
        return "management"   # a queue's pull and ack: consumer (or admin), decision 0176
    if roles & {"admin", "backfill"}:
        return "privileged"
    if "policy" in roles:
        return "policy"
    if "/fires" in path or "/lateness" in path or path.startswith("/v1/history") or "history" in list(tags):
        return "history"
    return "management"


def apply_surfaces(app: Any) -> None:
    """Tag every ``/v1`` operation of ``app``'s OpenAPI document with its surface (from the roles its
    route requires) and describe the four surfaces; routes added later are tagged too. Also documents
    every error answer as ``application/problem+json`` (:mod:`.openapi_doc`)."""
    from fastapi.routing import APIRoute, iter_route_contexts

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        from .openapi_doc import refine

        doc: dict[str, Any] = generate()
        surfaces: dict[tuple[str, str], str] = {}
        needs_role: set[tuple[str, str]] = set()
        for rc in iter_route_contexts(app.routes):
            route = rc.original_route
            if isinstance(route, APIRoute) and rc.path and rc.path.startswith("/v1"):
                roles = _route_roles(route.dependant)
                for method in rc.methods or ():
                    surfaces[(rc.path, method.lower())] = surface_of(rc.path, roles, route.tags)
                    if roles:
                        needs_role.add((rc.path, method.lower()))
        refine(doc, needs_role)   # errors as application/problem+json, every answer documented
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                if (path, method) in surfaces and isinstance(op, dict):
                    op["tags"] = [surfaces[(path, method)]]
        extra = [t for t in doc.get("tags", []) if t.get("name") not in SURFACES]
        doc["tags"] = [{"name": k, "description": v} for k, v in SURFACES.items()] + extra
        return doc

    app.openapi = openapi


__all__ = [
    "ALL_ROLES",
    "SURFACES",
    "TOKEN_PREFIX",
    "Forbidden",
    "apply_surfaces",
    "bearer_scheme",
    "check_role",
    "create_tenant",
    "current_principal",
    "hash_token",
    "new_token",
    "parse_bearer",
    "require",
    "require_any",
    "surface_of",
    "unauthorized",
    "validate_tenant_name",
]
