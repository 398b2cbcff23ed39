"""One typed operation of the ``/v1`` API, and the table of them all (:class:`Operations`).

An :class:`Op` is declared once, as a class attribute of :class:`Operations`, with the operation's
method, path template, response model and (if any) request model and query parameters::

    list_triggers = Op[TriggerPage]("GET", "/v1/triggers", TriggerPage, query=("limit", "cursor"))

Read through a :class:`~fireledger.client.Client` it is a method returning the parsed response;
through an :class:`~fireledger.client.AsyncClient` a coroutine function. Adding a route to the
client is one such line; ``tests/api/test_client_schema.py`` fails, naming the operation, when a
``/v1`` route of ``/openapi.json`` has no line here or a line disagrees with the schema (method,
path, query parameters, request and response fields).

Calling convention of every operation: path parameters positionally in template order (or by name),
the request body as ``body=`` (a request model instance — serialised with only the fields set — or
a plain mapping, sent as is) or as exact JSON bytes ``content=`` (what a signature covers), query
parameters by keyword (``from_`` for ``from``; a list is sent comma-separated; ``None`` is left
out), and extra request headers as ``headers=``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar, overload

from pydantic import BaseModel, TypeAdapter

from fireledger.control.audit import AuditPage
from fireledger.control.backfill import BackfillRequest, BackfillView
from fireledger.control.deadletters import BulkRedrive, BulkRedriveResult, DeadLetterPage
from fireledger.control.declared import TRIGGERS_SCHEMA_PATH
from fireledger.control.dryrun import DryRunCreate, PolicyDryRun
from fireledger.control.history import HistoryFire, HistoryPage, Lateness
from fireledger.control.outcomes import OutcomeReport, OutcomeView
from fireledger.control.policy import PolicyPatch
from fireledger.control.principals import PrincipalCreate, PrincipalCreated, PrincipalPage, PrincipalView
from fireledger.control.queues import AckRequest, AckView, PullRequest, PullView, QueueView
from fireledger.control.reports import SmearingView
from fireledger.control.schemas import Preview, TargetCreate, TriggerCreate, TriggerPage, TriggerPatch, TriggerView
from fireledger.control.targets import TargetCreatedOut, TargetOut, TargetPageOut, VerifyRequest

R = TypeVar("R")
_PARAM = re.compile(r"{([a-z_]+)}")
_PAGE = ("limit", "cursor")
_WINDOW = ("from", "to")
JsonObject = dict[str, Any]


class Blocking:
    """Marks a client whose operations return their result (:class:`~fireledger.client.Client`)."""


class Awaiting:
    """Marks a client whose operations are coroutine functions (:class:`~fireledger.client.AsyncClient`)."""


class Op(Generic[R]):
    """One operation: ``method`` and ``path`` (a template such as ``/v1/triggers/{trigger_id}``)
    exactly as in ``/openapi.json``; ``returns`` the response model (``type(None)`` for 204);
    ``body`` the request model (None: no body); ``query`` the query parameters' names as the schema
    spells them."""

    def __init__(self, method: str, path: str, returns: Any, *, body: type[BaseModel] | None = None,
                 query: tuple[str, ...] = ()) -> None:
        self.method = method
        self.path = path
        self.returns = returns
        self.body = body
        self.query = query
        self.path_params = tuple(_PARAM.findall(path))
        self.name = ""
        self._adapter: TypeAdapter[Any] | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Op[R]: ...
    @overload
    def __get__(self, obj: Blocking, owner: type) -> Callable[..., R]: ...
    @overload
    def __get__(self, obj: Awaiting, owner: type) -> Callable[..., Awaitable[R]]: ...

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        return Bound(self, obj)

    def __repr__(self) -> str:
        return f"<Op {self.name}: {self.method} {self.path}>"

    def request(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The URL path and httpx request arguments of a call (``TypeError`` for a wrong call)."""
        params = dict(zip(self.path_params, args, strict=False))
        if len(args) > len(self.path_params):
            raise TypeError(f"{self.name}() takes {len(self.path_params)} positional argument(s) "
                            f"{self.path_params}, got {len(args)}")
        for p in self.path_params[len(args):]:
            if p not in kwargs:
                raise TypeError(f"{self.name}() is missing the path parameter {p!r}")
            params[p] = kwargs.pop(p)
        headers = kwargs.pop("headers", None)
        body = kwargs.pop("body", None)
        content = kwargs.pop("content", None)
        if (body is not None or content is not None) and self.body is None:
            raise TypeError(f"{self.name}() takes no body")
        if body is not None and content is not None:
            raise TypeError(f"{self.name}() takes body= or content=, not both")
        query: dict[str, str] = {}
        for key, value in kwargs.items():
            name = key[:-1] if key.endswith("_") else key
            if name not in self.query:
                raise TypeError(f"{self.name}() got an unexpected keyword argument {key!r} "
                                f"(query parameters: {', '.join(self.query) or 'none'})")
            if value is not None:
                query[name] = _query_text(value)
        path = self.path.format(**{k: _segment(v) for k, v in params.items()})
        out: dict[str, Any] = {"params": query}
        if headers:
            out["headers"] = dict(headers)
        if content is not None:   # exact bytes (a signed outcome callback: the signature covers them)
            out["content"] = bytes(content)
            out["headers"] = {"content-type": "application/json", **out.get("headers", {})}
        if body is not None:
            out["json"] = (body.model_dump(mode="json", by_alias=True, exclude_unset=True)
                           if isinstance(body, BaseModel) else dict(body))
        return path, out

    def parse(self, status: int, data: Any) -> R:
        """The response body ``data`` as the declared model (``None`` for 204)."""
        if self.returns is type(None) or status == 204:
            return None  # type: ignore[return-value]
        if self._adapter is None:
            self._adapter = TypeAdapter(self.returns)
        result: R = self._adapter.validate_python(data)
        return result


class Bound:
    """An operation read through a client: calling it sends the request (sync or async, as the
    client is). ``op`` and ``client`` are kept for :meth:`Client.items`."""

    def __init__(self, op: Op[Any], client: Any) -> None:
        self.op = op
        self.client = client

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.client.call(self.op, *args, **kwargs)


def _segment(value: Any) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


def _query_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in value)
    return str(value)


class Operations:
    """Every ``/v1`` operation, one line each (the coverage test compares this table with
    ``/openapi.json``). Names are the server's handler names."""

    # targets
    create_target = Op[TargetCreatedOut]("POST", "/v1/targets", TargetCreatedOut, body=TargetCreate)
    list_targets = Op[TargetPageOut]("GET", "/v1/targets", TargetPageOut, query=_PAGE)
    get_target = Op[TargetOut]("GET", "/v1/targets/{target_id}", TargetOut)
    delete_target = Op[None]("DELETE", "/v1/targets/{target_id}", type(None))
    verify_target = Op[TargetOut]("POST", "/v1/targets/{target_id}/verify", TargetOut, body=VerifyRequest)
    # triggers
    dry_run_create = Op[DryRunCreate]("POST", "/v1/triggers/dry-run", DryRunCreate, body=TriggerCreate,
                                      query=("count",))
    dry_run_policy = Op[PolicyDryRun]("POST", "/v1/triggers/{trigger_id}/policy/dry-run", PolicyDryRun,
                                      body=PolicyPatch)
    create_trigger = Op[TriggerView]("POST", "/v1/triggers", TriggerView, body=TriggerCreate)
    list_triggers = Op[TriggerPage]("GET", "/v1/triggers", TriggerPage, query=_PAGE)
    get_trigger = Op[TriggerView]("GET", "/v1/triggers/{trigger_id}", TriggerView)
    amend_trigger = Op[TriggerView]("PATCH", "/v1/triggers/{trigger_id}", TriggerView, body=TriggerPatch)
    delete_trigger = Op[None]("DELETE", "/v1/triggers/{trigger_id}", type(None))
    pause_trigger = Op[TriggerView]("POST", "/v1/triggers/{trigger_id}/pause", TriggerView)
    resume_trigger = Op[TriggerView]("POST", "/v1/triggers/{trigger_id}/resume", TriggerView)
    run_trigger = Op[JsonObject]("POST", "/v1/triggers/{trigger_id}/run", JsonObject)
    preview_trigger = Op[Preview]("GET", "/v1/triggers/{trigger_id}/preview", Preview, query=("count",))
    set_policy = Op[TriggerView]("PATCH", "/v1/triggers/{trigger_id}/policy", TriggerView, body=PolicyPatch)
    backfill_trigger = Op[BackfillView]("POST", "/v1/triggers/{trigger_id}/backfill", BackfillView,
                                        body=BackfillRequest)
    # history
    list_fires = Op[HistoryPage]("GET", "/v1/triggers/{trigger_id}/fires", HistoryPage,
                                 query=(*_PAGE, *_WINDOW, "state", "order"))
    tenant_fires = Op[HistoryPage]("GET", "/v1/fires", HistoryPage,
                                   query=("trigger_id", *_WINDOW, "state", "order", *_PAGE))
    get_fire = Op[HistoryFire]("GET", "/v1/fires/{key}", HistoryFire)
    lateness = Op[Lateness]("GET", "/v1/triggers/{trigger_id}/lateness", Lateness, query=_WINDOW)
    report_outcome = Op[OutcomeView]("POST", "/v1/fires/{key}/outcome", OutcomeView, body=OutcomeReport)
    get_outcome = Op[OutcomeView]("GET", "/v1/fires/{key}/outcome", OutcomeView)
    smearing = Op[SmearingView]("GET", "/v1/reports/smearing", SmearingView, query=_WINDOW)
    # dead letters
    list_dead_letters = Op[DeadLetterPage]("GET", "/v1/dead-letters", DeadLetterPage,
                                           query=("trigger_id", *_WINDOW, "cause", *_PAGE))
    redrive_fire = Op[HistoryFire]("POST", "/v1/fires/{key}/redrive", HistoryFire)
    redrive_many = Op[BulkRedriveResult]("POST", "/v1/dead-letters/redrive", BulkRedriveResult, body=BulkRedrive)
    # principals and audit
    create_principal = Op[PrincipalCreated]("POST", "/v1/principals", PrincipalCreated, body=PrincipalCreate)
    list_principals = Op[PrincipalPage]("GET", "/v1/principals", PrincipalPage, query=_PAGE)
    get_principal = Op[PrincipalView]("GET", "/v1/principals/{principal_id}", PrincipalView)
    revoke_principal = Op[None]("DELETE", "/v1/principals/{principal_id}", type(None))
    list_audit = Op[AuditPage]("GET", "/v1/audit", AuditPage, query=_PAGE)
    # queues
    queue_stats = Op[QueueView]("GET", "/v1/queues/{target_id}", QueueView)
    pull = Op[PullView]("POST", "/v1/queues/{target_id}/pull", PullView, body=PullRequest)
    ack = Op[AckView]("POST", "/v1/queues/{target_id}/ack", AckView, body=AckRequest)
    # schemas
    triggers_schema = Op[JsonObject]("GET", TRIGGERS_SCHEMA_PATH, JsonObject)


def operations() -> dict[str, Op[Any]]:
    """Every operation of :class:`Operations` by attribute name."""
    return {name: op for name, op in vars(Operations).items() if isinstance(op, Op)}


def page_items(page: Any) -> tuple[list[Any], str | None]:
    """The ``items`` and ``next`` cursor of a page response (a model or a mapping)."""
    if isinstance(page, Mapping):
        return list(page.get("items") or []), page.get("next")
    return list(page.items), page.next


__all__ = ["Awaiting", "Blocking", "Bound", "JsonObject", "Op", "Operations", "operations", "page_items"]
