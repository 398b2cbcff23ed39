"""The control plane's HTTP API (FastAPI), versioned under ``/v1``.

Errors are RFC 9457 ``application/problem+json`` everywhere — validation (with ``errors`` naming each
field as a dotted path such as ``schedule.cron``), malformed JSON, unknown routes, wrong methods,
auth, conflicts and unexpected failures (a generic 500: never a traceback, never request data).

Handlers are synchronous (FastAPI runs them in its threadpool; the store keeps a connection per
thread). Instants come from the injected :class:`~fireledger.clock.Clock`, never ``time.time()``.

Endpoints and the role each needs (see :mod:`fireledger.control.auth`):

====================================  ========  =================================================
``GET  /``                            —         303 to the web console (``/console/``)
``GET  /healthz``                     —         liveness
``POST /v1/targets``                  admin     register a target (secret shown once)
``GET  /v1/targets[/{id}]``           reader
``DELETE /v1/targets/{id}``           admin     409 while a live trigger uses it
``POST /v1/triggers``                 author    (+ policy to set policy fields)
``GET  /v1/triggers[/{id}]``          reader
``PATCH /v1/triggers/{id}``           author    (+ policy to change policy fields)
``DELETE /v1/triggers/{id}``          author
``POST /v1/triggers/{id}/pause``      author    audited ``trigger.pause`` (0180)
``POST /v1/triggers/{id}/resume``     author    audited ``trigger.resume``
``GET  /v1/triggers/{id}/preview``    reader
``GET  /v1/triggers/{id}/fires``      reader    fire history, oldest first
``GET  /v1/fires/{key}``              reader    one fire
``POST /v1/fires/{key}/redrive``      author    a dead letter's further attempt, same key (0148)
``GET  /v1/dead-letters``             reader    failed/unknown fires; ``POST …/redrive`` author
``POST /v1/targets/{id}/verify``      admin     ownership challenge (privileged)
``PATCH /v1/triggers/{id}/policy``    policy    policy fields only (the policy surface)
``POST /v1/triggers/dry-run``         author    create's checks + next N instants; stores nothing
``POST …/{id}/policy/dry-run``        reader    a policy change replayed on the last gap; stores nothing
``POST/GET /v1/principals[/{id}]``    admin     principals and tokens (token shown once)
``DELETE /v1/principals/{id}``        admin     revoke (409 for the last admin)
``GET  /v1/audit``                    admin     the tenant's audit rows
``POST /v1/triggers/{id}/backfill``   backfill  fires for a past window (dry run; audited)
``GET  /v1/reports/smearing``         reader    avoided-peak report of jitter smearing
``GET  /v1/schemas/triggers.json``    —         JSON Schema of an ``apply`` file (public; 0185)
====================================  ========  =================================================

A refusal for a missing role (403) is audited. Routes are tagged by surface (management, policy,
privileged, history) in ``/openapi.json``.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fireledger.clock import Clock
from fireledger.registry import RegistryError
from fireledger.settings import Settings
from fireledger.store import Store

from . import (
    audit,
    backfill,
    console,
    deadletters,
    declared,
    history,
    outcomes,
    policy,
    principals,
    queues,
    reports,
    targets,
    triggers,
)
from .auth import Forbidden, apply_surfaces, hash_token, parse_bearer, unauthorized
from .bodylimit import API_BODY_BYTES, BodyLimitMiddleware, is_signed_callback
from .context import ApiContext
from .denials import DenialLedger
from .dryrun import miss_threshold_us
from .dryrun import router as dryrun_router
from .problems import PROBLEM_JSON, ProblemError, from_registry, problem, validation_problem
from .schemas import Health
from .urls import private_targets_allowed_by_env

log = logging.getLogger("fireledger.control")

#: Largest request body accepted under ``/v1`` (enforced for every route by :mod:`.bodylimit`).
MAX_BODY_BYTES = API_BODY_BYTES


def create_app(store: Store, clock: Clock, *, on_definition_change: Callable[[], None] = lambda: None,
               allow_private_targets: bool | None = None, keys: Any = None,
               metrics_cache_s: float | None = None, settings: Settings | None = None) -> FastAPI:
    """Build the control API over ``store``, stamping instants from ``clock``.

    ``metrics_cache_s``: how long ``/metrics`` reuses the store's answers (default
    :data:`~fireledger.observe.metrics.STORE_METRICS_TTL_S`; 0 reads the store every scrape).

    ``on_definition_change`` is called after every committed trigger change (the embedded timing
    loop wakes at once). ``allow_private_targets`` defaults to ``FIRELEDGER_ALLOW_PRIVATE_TARGETS=1``.

    ``settings``: the process's settings (``fireledger serve``/``control`` pass the object they read
    at start-up); None reads each setting from the environment where it is used.
    """
    from fireledger import __version__

    if allow_private_targets is None:
        allow_private_targets = (settings.allow_private_targets if settings is not None
                                 else private_targets_allowed_by_env())
    app = FastAPI(
        title="fireledger",
        version=__version__,
        summary="Durable, multi-tenant scheduled triggers: never early; a committed, keyed fire record "
                "before any delivery.",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.fireledger = ApiContext(store, clock, on_definition_change, allow_private_targets, settings=settings)
    app.state.denials = DenialLedger(store, app.state.fireledger.now_us)   # bounded refusal audit (0091)
    _add_problem_handlers(app)
    _add_ops_routes(app, store, clock, keys, metrics_cache_s, settings)
    _include_area_routers(app, settings)
    console.mount(app, settings.public_url if settings is not None else None)
    apply_surfaces(app)  # OpenAPI tags: management, policy, privileged, history (auth.surface_of)
    app.add_middleware(GuardMiddleware, store=store)
    app.add_middleware(BodyLimitMiddleware)   # outermost: one streaming body cap for every route (413)
    return app


def _add_problem_handlers(app: FastAPI) -> None:
    """Every refusal leaves as problem+json: a project ``ProblemError`` as itself (a ``Forbidden``
    audited first: invariant 13), a definitions-service refusal as its problem (nothing was written),
    a request validation error naming the fields, and Starlette's 400/404/405 with a slug (405 with
    the ``Allow`` of every route at that path)."""

    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> Any:
        if isinstance(exc, Forbidden):
            await audit.record_denial(request, exc)  # a refused act is audited (invariant 13)
        return exc.response()

    @app.exception_handler(RegistryError)
    async def _refused(_request: Request, exc: RegistryError) -> Any:
        return from_registry(exc).response()   # the definitions service refused: nothing written

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> Any:
        return validation_problem(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Any:
        slug = {404: "not-found", 405: "method-not-allowed", 400: "bad-request"}.get(exc.status_code)
        detail = {404: "no such resource", 405: "method not allowed on this resource",
                  400: "the request body could not be parsed"}.get(exc.status_code, "request refused")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return problem(exc.status_code, detail, slug=slug, headers=headers)


def _add_ops_routes(app: FastAPI, store: Store, clock: Clock, keys: Any, metrics_cache_s: float | None,
                    settings: Settings | None) -> None:
    """The operations routes, outside /v1 and the schema except ``/healthz``: ``/healthz``,
    ``/metrics`` (the process's metrics plus the store's, cached ``metrics_cache_s``, and the smearing
    collector; the collector is ``app.state.store_metrics``) and ``/.well-known/jwks.json`` (404 when
    ``keys`` is None). Without ``settings`` a malformed FIRELEDGER_BACKFILL_MAX stops the build."""

    @app.get("/healthz", response_model=Health, tags=["ops"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    from fireledger.observe.metrics import STORE_METRICS_TTL_S, StoreCollector

    store_collector = StoreCollector(store, clock, ttl_s=STORE_METRICS_TTL_S if metrics_cache_s is None
                                     else metrics_cache_s)
    store_metrics = store_collector.registry()
    app.state.store_metrics = store_collector   # its cache's clock is stepped by tests
    from fireledger.backfill import max_fires_from_env
    from fireledger.observe.smearing import SmearingCollector

    store_metrics.register(SmearingCollector(store, clock))   # avoided peak of smearing (ADR-10)
    if settings is None:
        max_fires_from_env()   # a malformed FIRELEDGER_BACKFILL_MAX stops the start, named

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        """Prometheus text format; the due age is computed from the store at scrape time."""
        from fireledger.observe.metrics import METRICS

        return Response(METRICS.render(store_metrics), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/.well-known/jwks.json", include_in_schema=False)
    def jwks() -> Response:
        """Public keys that verify per-attempt dispatch tokens (rotation keeps old keys published)."""
        if keys is None:
            return problem(404, "this deployment does not mint dispatch tokens", slug="not-found")
        body = keys.ring().jwks(clock.now().earliest_us // 1_000_000)
        return JSONResponse(body, headers={"cache-control": "public, max-age=300"})


def _include_area_routers(app: FastAPI, settings: Settings | None) -> None:
    """The /v1 routes, one router per area, in matching order (the dry-run routes ahead of
    ``/v1/triggers/{trigger_id}``). Without ``settings`` a malformed FIRELEDGER_MISS_THRESHOLD_S
    stops the build."""
    app.include_router(targets.router)
    app.include_router(dryrun_router)   # POST /v1/triggers/dry-run (ahead of …/{trigger_id}), …/policy/dry-run
    app.include_router(triggers.router)
    app.include_router(triggers.fires_router)
    app.include_router(history.router)
    app.include_router(deadletters.router)   # GET /v1/dead-letters, POST …/redrive, /v1/fires/{key}/redrive
    app.include_router(policy.router)
    if settings is None:
        miss_threshold_us()   # a malformed FIRELEDGER_MISS_THRESHOLD_S stops the start, named
    app.include_router(principals.router)
    app.include_router(audit.router)
    app.include_router(outcomes.router)   # POST …/outcome authenticates by signature (see the guard)
    app.include_router(queues.router)
    app.include_router(backfill.router)
    app.include_router(reports.router)
    app.include_router(declared.router)   # GET /v1/schemas/triggers.json: public, for editors (0185)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route accepts at this path (Starlette reports only the first route's)."""
    allowed = []
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        probe = {**request.scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


class GuardMiddleware:
    """Outermost guard for the API (pure ASGI).

    * ``/v1/*``: authenticates the bearer token *before* routing (401 for anything unauthenticated,
      whatever the path) and requires JSON bodies (415). The body was already bounded by
      :class:`~fireledger.control.bodylimit.BodyLimitMiddleware` (413), which runs first.
    * Everywhere: an unexpected exception becomes a generic 500 problem. The log line carries the
      exception type and stack frames only — no message, no request data — so a payload can never
      reach the logs through an error.
    """

    def __init__(self, app: ASGIApp, store: Store) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            path: str = scope.get("path", "")
            signed = is_signed_callback(scope.get("method", ""), path)   # the target's signature
            public = scope.get("method") == "GET" and path == declared.TRIGGERS_SCHEMA_PATH   # a schema (0185)
            if (path == "/v1" or path.startswith("/v1/")) and not signed and not public:
                refusal, receive = await self._guard(scope, receive)
                if refusal is not None:
                    await refusal.response()(scope, receive, send_tracking)
                    return
            await self.app(scope, receive, send_tracking)
        except Exception as exc:
            frames = "".join(traceback.format_tb(exc.__traceback__))
            log.error("unhandled %s in %s %s\n%s", type(exc).__name__, scope.get("method"),
                      scope.get("path"), frames)
            if not started:
                resp = problem(500, "an internal error occurred; it has been logged", slug="internal")
                await resp(scope, receive, send)

    async def _guard(self, scope: Scope, receive: Receive) -> tuple[ProblemError | None, Receive]:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        token = parse_bearer(headers.get("authorization"))
        if token is None:
            return unauthorized(), receive
        principal = await anyio.to_thread.run_sync(self.store.trust.principal_by_token_hash, hash_token(token))
        if principal is None:
            await audit.record_invalid_token(scope)   # counted per process, bounded (decision 0091)
            return unauthorized("the bearer token is not valid"), receive
        scope.setdefault("state", {})["principal"] = principal

        # Read the body (already bounded by BodyLimitMiddleware), then replay it to the app.
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                chunks = []
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        data = b"".join(chunks)
        if data:
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if not (ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))):
                return ProblemError(415, "the request body must be JSON (Content-Type: application/json)",
                                    slug="unsupported-media-type"), receive
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        return None, replay


__all__ = ["MAX_BODY_BYTES", "PROBLEM_JSON", "GuardMiddleware", "create_app", "validation_problem"]
