"""Make ``/openapi.json`` say what the API really answers (checked by schemathesis in ``make test``).

* Every error response (status ≥ 400) is documented as ``application/problem+json`` with the
  ``Problem`` schema — FastAPI's default ``HTTPValidationError`` shape is never sent.
* The answers every ``/v1`` operation can give are documented on each: 401 (the guard
  authenticates before routing), 403 where a role is required, 422 where there are parameters or a
  body, 400/413/415 where there is a body (malformed JSON, over 1 MiB, not JSON), 404 where the path
  or a parameter names an object, and 500 (a generic problem, never a traceback).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

PROBLEM = "application/problem+json"
_REF = {"$ref": "#/components/schemas/Problem"}
_PROBLEM_SCHEMAS = {
    "ProblemField": {"title": "ProblemField", "type": "object", "required": ["field", "problem"],
                     "properties": {"field": {"type": "string", "title": "Field"},
                                    "problem": {"type": "string", "title": "Problem"}}},
    "Problem": {"title": "Problem", "type": "object", "required": ["type", "title", "status", "detail"],
                "description": "RFC 9457 problem details (``application/problem+json``).",
                "properties": {
                    "type": {"type": "string", "title": "Type"},
                    "title": {"type": "string", "title": "Title"},
                    "status": {"type": "integer", "title": "Status"},
                    "detail": {"type": "string", "title": "Detail"},
                    "errors": {"anyOf": [{"type": "array", "items": {"$ref": "#/components/schemas/ProblemField"}},
                                         {"type": "null"}], "title": "Errors"}}},
}


def _problem_response(code: int) -> dict[str, Any]:
    return {"description": HTTPStatus(code).phrase, "content": {PROBLEM: {"schema": dict(_REF)}}}


def refine(doc: dict[str, Any], needs_role: set[tuple[str, str]]) -> dict[str, Any]:
    """Rewrite ``doc`` in place (idempotent) and return it. ``needs_role`` holds the
    ``(path, method)`` pairs whose route requires a role."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _PROBLEM_SCHEMAS.items():
        schemas.setdefault(name, schema)
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            if not isinstance(op, dict) or method not in ("get", "post", "put", "patch", "delete"):
                continue
            responses: dict[str, Any] = op.setdefault("responses", {})
            wanted: set[int] = {500}
            if path.startswith("/v1"):
                wanted.add(401)
                if (path, method) in needs_role:
                    wanted.add(403)
                if op.get("parameters") or "requestBody" in op:
                    wanted.add(422)
                if "requestBody" in op:
                    wanted |= {400, 413, 415}
                names = {str(p.get("name", "")) for p in op.get("parameters", []) if isinstance(p, dict)}
                if "{" in path or any(n == "key" or n.endswith("_id") for n in names):
                    wanted.add(404)   # the path or a parameter names an object that may not exist
            for status in wanted:
                responses.setdefault(str(status), _problem_response(status))
            for code, resp in responses.items():
                if code.isdigit() and int(code) >= 400:
                    resp["content"] = {PROBLEM: {"schema": dict(_REF)}}
                    resp.setdefault("description", HTTPStatus(int(code)).phrase)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc


__all__ = ["PROBLEM", "refine"]
