"""Does the client agree with a server's ``/openapi.json``? (decision 0187)

:func:`disagreements` compares :class:`~.ops.Operations` with an OpenAPI document and returns one
line per disagreement (empty: they agree):

* a ``/v1`` operation of the document with no client operation — the line names the method, path and
  operationId and gives the line to add to ``Operations``;
* a client operation the document does not have (a removed or renamed route);
* the query or path parameters of an operation differ;
* the request or response model's fields differ from the document's: names, required-ness, types
  (``string``, ``integer``, ``a|null``, ``array<…>``, a referenced model by name).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from .ops import Op, operations

_REF = "#/components/schemas/"
_METHODS = ("get", "post", "put", "patch", "delete")


def _name(ref: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    for suffix in ("-Input", "-Output"):
        name = name.removesuffix(suffix)
    return name


def shape(node: Any, defs: dict[str, Any]) -> str:
    """A field's type as a short string (refs by model name; ``anyOf`` members sorted)."""
    if not isinstance(node, dict):
        return "any"
    if "$ref" in node:
        return "ref:" + _name(node["$ref"])
    for key in ("anyOf", "oneOf"):
        if key in node and "properties" not in node:
            return "|".join(sorted({shape(n, defs) for n in node[key]}))
    if "allOf" in node and len(node["allOf"]) == 1:
        return shape(node["allOf"][0], defs)
    kind = node.get("type")
    if isinstance(kind, list):
        return "|".join(sorted(kind))
    if kind == "array":
        return f"array<{shape(node.get('items'), defs)}>"
    if kind is None:
        return "object" if "properties" in node else "any"
    return str(kind)


def _resolve(node: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """The object schema behind ``node``: ``$ref`` followed; an optional body (``anyOf`` of one
    schema and ``null``) is that one schema."""
    while isinstance(node, dict):
        if "$ref" in node:
            node = defs.get(_name(node["$ref"]), {})
            continue
        members = [m for m in node.get("anyOf", ()) if m.get("type") != "null"]
        if "anyOf" in node and len(members) == 1:
            node = members[0]
            continue
        break
    return node if isinstance(node, dict) else {}


def fields(node: Any, defs: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    """``{field: (required, type)}`` of an object schema (after following a ``$ref``)."""
    obj = _resolve(node, defs)
    required = set(obj.get("required", ()))
    return {k: (k in required, shape(v, defs)) for k, v in (obj.get("properties") or {}).items()}


def _model_doc(model: Any, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = TypeAdapter(model).json_schema(mode=mode, ref_template=_REF + "{model}")  # type: ignore[arg-type]
    return doc, {_name(k): v for k, v in (doc.get("$defs") or {}).items()}


def model_fields(model: Any, mode: str) -> dict[str, tuple[bool, str]]:
    """:func:`fields` of a client model, from its own JSON Schema (``mode`` validation or serialization)."""
    doc, defs = _model_doc(model, mode)
    return fields(doc, defs)


def _model_diff(what: str, model: Any, mode: str, node: Any, defs: dict[str, Any]) -> list[str]:
    """The model's fields against ``node``'s, then each model it refers to against the schema's
    component of the same name."""
    doc, ours = _model_doc(model, mode)
    out = _diff(what, fields(doc, ours), fields(node, defs))
    for name in sorted(ours.keys() & defs.keys()):
        out += _diff(f"{what} {name}", fields(ours[name], ours), fields(defs[name], defs))
    return out


def _diff(what: str, ours: dict[str, tuple[bool, str]], theirs: dict[str, tuple[bool, str]]) -> list[str]:
    out = []
    for f in sorted(theirs.keys() - ours.keys()):
        out.append(f"{what}: field {f!r} is in the schema, not in the client's model")
    for f in sorted(ours.keys() - theirs.keys()):
        out.append(f"{what}: field {f!r} is in the client's model, not in the schema")
    for f in sorted(ours.keys() & theirs.keys()):
        if ours[f] != theirs[f]:
            (r1, t1), (r2, t2) = ours[f], theirs[f]
            out.append(f"{what}: field {f!r} is {'required' if r1 else 'optional'} {t1} in the client, "
                       f"{'required' if r2 else 'optional'} {t2} in the schema")
    return out


def _suggest(method: str, path: str, op: dict[str, Any]) -> str:
    base = str(op.get("operationId") or "operation").split("_v1_")[0]
    ok: dict[str, Any] = next((v for k, v in sorted(op.get("responses", {}).items()) if k.startswith("2")), {})
    resp = (ok.get("content") or {}).get("application/json", {}).get("schema", {})
    returns = _name(resp["$ref"]) if "$ref" in resp else ("JsonObject" if resp else "None")
    req = ((op.get("requestBody") or {}).get("content") or {}).get("application/json", {}).get("schema", {})
    body = f", body={_name(req['$ref'])}" if "$ref" in req else ""
    query = tuple(p["name"] for p in op.get("parameters", []) if p.get("in") == "query")
    q = f", query={query!r}" if query else ""
    ret = "type(None)" if returns == "None" else returns
    return f'{base} = Op[{returns}]("{method.upper()}", "{path}", {ret}{body}{q})'


def _compare(name: str, client: Op[Any], op: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    where = f"{client.method} {client.path} ({name})"
    out = []
    params = op.get("parameters", [])
    query = sorted(p["name"] for p in params if p.get("in") == "query")
    if sorted(client.query) != query:
        out.append(f"{where}: query parameters {sorted(client.query)} in the client, {query} in the schema")
    path_params = sorted(p["name"] for p in params if p.get("in") == "path")
    if sorted(client.path_params) != path_params:
        out.append(f"{where}: path parameters {sorted(client.path_params)} in the client, {path_params} in the schema")
    req = ((op.get("requestBody") or {}).get("content") or {}).get("application/json", {}).get("schema")
    if (req is None) != (client.body is None):
        out.append(f"{where}: request body {'absent' if client.body is None else 'declared'} in the client, "
                   f"{'absent' if req is None else 'declared'} in the schema")
    elif req is not None:
        out += _model_diff(f"{where} request", client.body, "validation", req, defs)
    ok = {k: v for k, v in op.get("responses", {}).items() if k.startswith("2")}
    resp = next(((v.get("content") or {}).get("application/json", {}).get("schema") for v in ok.values()), None)
    if (resp is None) != (client.returns is type(None)):
        out.append(f"{where}: response body {'absent' if client.returns is type(None) else 'declared'} in the "
                   f"client, {'absent' if resp is None else 'declared'} in the schema")
    elif resp is not None:
        out += _model_diff(f"{where} response", client.returns, "serialization", resp, defs)
    return out


def disagreements(openapi: dict[str, Any], prefix: str = "/v1") -> list[str]:
    """Every way the client's operations and ``openapi``'s operations under ``prefix`` disagree."""
    defs = {_name(k): v for k, v in (openapi.get("components", {}).get("schemas") or {}).items()}
    ours = {(op.method, op.path): (name, op) for name, op in operations().items()}
    theirs = {(m.upper(), p): o for p, ops in openapi.get("paths", {}).items() if p.startswith(prefix)
              for m, o in ops.items() if m in _METHODS}
    out = []
    missing = sorted(theirs.keys() - ours.keys())
    for method, path in missing:
        op = theirs[(method, path)]
        out.append(f"missing: {method} {path} (operationId {op.get('operationId')}): add to "
                   f"fireledger.client.ops.Operations: {_suggest(method, path, op)}")
    for method, path in sorted(ours.keys() - theirs.keys()):
        out.append(f"stale: {method} {path} ({ours[(method, path)][0]}) is not in the schema")
    for key in sorted(ours.keys() & theirs.keys()):
        name, client = ours[key]
        out += _compare(name, client, theirs[key], defs)
    return out


__all__ = ["disagreements", "fields", "model_fields", "shape"]
