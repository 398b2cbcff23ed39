"""RFC 9457 problem details: the one shape every API error takes.

A problem carries ``type``, ``title``, ``status`` and ``detail``; validation problems add
``errors: [{"field": "schedule.cron", "problem": "…"}]``. Nothing user-supplied is echoed back
except field *names*: a problem never contains a payload, a token or a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

from fireledger.errors import FireledgerError
from fireledger.registry.errors import Conflict, Invalid, LimitReached, NotFound, RegistryError

PROBLEM_JSON = "application/problem+json"
_TYPE_BASE = "urn:fireledger:problem:"


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_JSON


def problem_type(slug: str) -> str:
    return _TYPE_BASE + slug


def problem(status: int, detail: str, *, slug: str | None = None, title: str | None = None,
            errors: Iterable[tuple[str, str]] | None = None,
            headers: Mapping[str, str] | None = None) -> ProblemResponse:
    """Build an ``application/problem+json`` response."""
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    body: dict[str, Any] = {
        "type": problem_type(slug) if slug else "about:blank",
        "title": title or phrase,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = [{"field": f, "problem": p} for f, p in errors]
    return ProblemResponse(body, status_code=status, headers=dict(headers) if headers else None)


class ProblemError(FireledgerError):
    """Raised by handlers to answer with a problem; turned into a response by the app."""

    def __init__(self, status: int, detail: str, *, slug: str | None = None, title: str | None = None,
                 errors: list[tuple[str, str]] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug
        self.title = title
        self.errors = errors
        self.headers = headers

    def response(self) -> ProblemResponse:
        return problem(self.status, self.detail, slug=self.slug, title=self.title, errors=self.errors,
                       headers=self.headers)


def invalid(errors: list[tuple[str, str]], status: int = 422) -> ProblemError:
    """A validation problem naming each bad field (the detail repeats the first)."""
    field, what = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ProblemError(status, f"{field}: {what}{more}", slug="invalid-request",
                        title="Invalid request", errors=errors)


def not_found(what: str) -> ProblemError:
    return ProblemError(404, f"no such {what}", slug="not-found")


def conflict(detail: str) -> ProblemError:
    return ProblemError(409, detail, slug="conflict")


# --- request validation (pydantic) errors → one 422 problem naming each field -------------------

_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in _LOCATIONS:
        kind = str(parts.pop(0))
        if not parts:
            return kind
    return ".".join(str(p) for p in parts) or "body"


def _problem_text(err: dict[str, Any]) -> str:
    """A problem sentence for one pydantic error — from its type and context, never its input."""
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind == "missing":
        return "is required"
    if kind in ("string_type", "string_unicode"):
        return "must be a string"
    if kind in ("dict_type", "model_attributes_type", "model_type"):
        return "must be a JSON object"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer"
    if kind == "string_pattern_mismatch":
        from .formats import PATTERN_PROBLEMS

        return PATTERN_PROBLEMS.get(str(ctx.get("pattern", "")), "is not in the form the schema gives")
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', 'the documented values')}"
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": "≥", "greater_than": ">", "less_than_equal": "≤", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "")
        return f"must be {op} {bound}"
    msg = str(err.get("msg", "is invalid"))
    return msg[:1].lower() + msg[1:]


def validation_problem(errors: Any) -> ProblemError:
    """One problem for pydantic ``errors``: 400 for a body that is not JSON, else 422 naming each field
    (field names and problem sentences only; never the input)."""
    items: list[tuple[str, str]] = []
    for err in errors:
        if err.get("type") == "json_invalid":
            where = err.get("loc", ("body", 0))
            pos = where[1] if len(where) > 1 else 0
            return invalid([("body", f"is not valid JSON ({(err.get('ctx') or {}).get('error', 'syntax')} "
                                     f"at character {pos})")], status=400)
        items.append((_field(err.get("loc", ())), _problem_text(err)))
    if not items:
        items.append(("body", "is invalid"))
    return invalid(items)
def from_registry(exc: RegistryError) -> ProblemError:
    """The problem answering a refusal of the definitions service (:mod:`fireledger.registry`):
    ``Invalid`` 422 naming each field, ``NotFound`` 404, ``LimitReached`` 409 ``limit-reached``,
    ``Conflict`` 409 — the same problems the handlers raised before the service existed."""
    if isinstance(exc, Invalid):
        return invalid(exc.errors)
    if isinstance(exc, NotFound):
        return not_found(exc.what)
    if isinstance(exc, LimitReached):
        return ProblemError(409, exc.detail, slug="limit-reached")
    if isinstance(exc, Conflict):
        return conflict(exc.detail)
    return ProblemError(500, "the request could not be completed", slug="internal")
