"""Acting from the console (issue 17 item 5, decisions 0181–0183): pause, resume, run now, backfill
with a dry-run preview, and redrive — each a form behind the role the API's route requires.

Pages (under ``/console``, signed in):

* ``GET  /triggers/{id}/act/{pause|resume|run|backfill}`` — the confirmation page: what the act
  will do, and a form whose button confirms it. A GET changes nothing.
* ``POST /triggers/{id}/act/{name}`` — acts once the form says ``confirm=yes``. A backfill's form
  first posts ``step=preview``: the API's own dry run (nothing stored), shown with its counts and
  instants, and a second form that confirms exactly that window.
* ``GET|POST /fires/{key}/redrive`` — the same for one dead letter.

Every act **is the API's**: the console calls the route function of the matching ``/v1`` operation
(:func:`fireledger.control.triggers.pause_trigger`, :func:`~fireledger.control.deadletters.redrive_fire`,
…) with the signed-in principal, so the checks, the store transaction and its audit row are exactly
those of the API act (decision 0181; ``trigger.pause``/``trigger.resume`` rows from decision 0180).

**Permission** (decision 0182): the console runs the role check the API route itself declares — the
``require(...)`` dependency found on that route of this app — so a change of a route's roles (a
``runner`` grant for run now, say) carries over without touching the console. A button is shown
only when that check passes; a POST runs it again, and a refusal is a 403 page audited like the
API's (:func:`fireledger.control.audit.record_denial`). A route without a role check is never
offered (fail closed).

**CSRF** (decision 0183): a synchronizer token bound to the console session (the sign-out form's,
:func:`~fireledger.control.console.csrf_token` of the session id, compared in constant time), and
``Sec-Fetch-Site`` must not name another site. Checked before anything else: a missing or forged
token answers 403 and changes nothing. Without a session a POST is sent to the sign-in page.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import ValidationError

from fireledger.domain.keys import FireKey
from fireledger.domain.model import Principal
from fireledger.errors import FireledgerError
from fireledger.registry import RegistryError

from .. import backfill as backfill_api
from .. import deadletters, triggers
from ..audit import record_denial
from ..auth import Forbidden
from ..problems import ProblemError, from_registry
from .session import (
    PREFIX,
    SECURITY_HEADERS,
    _cross_site,
    _ctx,
    _principal,
    _render,
    _session_id,
    _when,
    csrf_token,
    same_token,
)


@dataclass(frozen=True)
class Act:
    """One console act: the ``/v1`` operation it is (method POST), and the words the console uses."""

    name: str
    api_path: str
    label: str
    question: str
    done: str


ACTS: dict[str, Act] = {a.name: a for a in (
    Act("pause", "/v1/triggers/{trigger_id}/pause", "Pause",
        "Pause this trigger? It keeps its definition but decides no instant until it is resumed; the "
        "instants that fall while it is paused are decided at resume by its missed-fire policy.",
        "Paused: the timing plane decides no instant of this trigger until it is resumed."),
    Act("resume", "/v1/triggers/{trigger_id}/resume", "Resume",
        "Resume this trigger? The instants that fell while it was paused are decided like after an "
        "outage: older than the catch-up horizon expired, within it by the missed-fire policy.",
        "Resumed: the timing plane decides this trigger's instants again."),
    Act("run", "/v1/triggers/{trigger_id}/run", "Run now",
        "Run this trigger now? One manual fire is committed at once under its own key and dispatched "
        "to the trigger's target; the scheduled instants are not affected.",
        "Run now: one manual fire committed; it is dispatched at once."),
    Act("backfill", "/v1/triggers/{trigger_id}/backfill", "Backfill…",
        "Backfill a past window? One backfill fire is committed per instant of the schedule in "
        "[from, to) that has none yet. Preview first: the dry run stores nothing.",
        "Backfilled: the fires of the window were committed in the backfill lane."),
    Act("redrive", "/v1/fires/{key}/redrive", "Redrive",
        "Redrive this dead letter? One further attempt is made under the SAME key (never a new fire); "
        "its earlier attempts stay in its history.",
        "Redriven: the fire is pending again under its own key."),
)}
TRIGGER_ACTS = ("pause", "resume", "run", "backfill")
#: The acts offered per trigger state (the API refuses the others with 409 anyway).
_BY_STATE = {"active": ("pause", "run", "backfill"), "paused": ("resume",)}
_DEAD = ("failed", "unknown")

router = APIRouter(prefix=PREFIX, include_in_schema=False)


# --- permission: the API route's own role check ------------------------------------------------


def _role_checks(dependant: Any) -> list[Callable[..., Any]]:
    found: list[Callable[..., Any]] = []
    for dep in getattr(dependant, "dependencies", ()):
        if hasattr(dep.call, "fireledger_roles"):
            found.append(dep.call)
        found += _role_checks(dep)
    return found


def _checks_of(app: FastAPI, act: Act) -> list[Callable[..., Any]]:
    """The role-check dependencies the app's ``POST {act.api_path}`` route declares (cached)."""
    cache: dict[str, list[Callable[..., Any]]] | None = getattr(app.state, "console_act_checks", None)
    if cache is None:
        cache = app.state.console_act_checks = {}
    if act.name not in cache:
        cache[act.name] = next((_role_checks(rc.original_route.dependant) for rc in iter_route_contexts(app.routes)
                                if isinstance(rc.original_route, APIRoute) and rc.path == act.api_path
                                and "POST" in (rc.methods or ())), [])
    return cache[act.name]


def check(app: FastAPI, act: Act, principal: Principal) -> None:
    """Run the API route's role check for ``principal``: raises :class:`Forbidden` exactly when the
    API would refuse this principal the act (a route that declares no role check: refused). The
    check sees a request without query parameters, so only the roles decide."""
    checks = _checks_of(app, act)
    if not checks:
        raise Forbidden(f"(the API route {act.api_path} declares no role check)")
    blank = Request({"type": "http", "method": "POST", "path": act.api_path, "query_string": b"", "headers": [],
                     "app": app})
    for call in checks:
        params = inspect.signature(call).parameters
        call(**{k: v for k, v in (("request", blank), ("principal", principal)) if k in params})


def offered(request: Request, principal: Principal, *, trigger_state: str | None = None,
            fire_state: str | None = None) -> list[Act]:
    """The acts to show as buttons: those the state allows and the API would let ``principal`` do."""
    names = _BY_STATE.get(trigger_state or "", ()) if trigger_state is not None else (
        ("redrive",) if fire_state in _DEAD else ())
    out = []
    for name in names:
        try:
            check(request.app, ACTS[name], principal)
        except Forbidden:
            continue
        out.append(ACTS[name])
    return out


def done_message(name: str | None) -> str:
    """The banner after a successful act (``?done=<act>`` on the page the act redirects to)."""
    act = ACTS.get(name or "")
    return act.done if act is not None else ""


# --- the request's checks: session, CSRF, role ---------------------------------------------------


class _Refused(FireledgerError):
    """An answer to send instead of acting (nothing was changed)."""

    def __init__(self, response: Response) -> None:
        super().__init__("refused")
        self.response = response


async def _form(request: Request) -> dict[str, str]:
    try:
        fields = parse_qs((await request.body()).decode("latin-1"), max_num_fields=12)
    except ValueError:
        return {}
    return {k: v[0] for k, v in fields.items() if v}


def _forbidden(request: Request, message: str) -> Response:
    return _render("error.html", 403, signed_in=True, message=message, csrf=str(
        getattr(request.state, "console_csrf", "")))


async def _authorised(request: Request, act: Act) -> tuple[Principal, dict[str, str]]:
    """The signed-in principal and the POSTed form, after the CSRF check and then the API's role
    check (a refusal audited). Raises :class:`_Refused` (nothing changed) otherwise."""
    principal = await anyio.to_thread.run_sync(_principal, request)   # no session: to the sign-in page
    session_id = _session_id(request) or ""
    form = await _form(request)
    if _cross_site(request) or not same_token(form.get("csrf", ""), csrf_token("session", session_id)):
        raise _Refused(_forbidden(request, "That request did not come from this console (its form token is "
                                           "missing or wrong); nothing changed."))
    try:
        check(request.app, act, principal)
    except Forbidden as exc:
        request.state.principal = principal   # whom the refusal's audit row names
        await record_denial(request, exc)
        raise _Refused(_forbidden(request, f"You may not {act.label.rstrip('…').lower()}: {exc.detail}. "
                                           "Nothing changed.")) from None
    return principal, form


def _problem_page(request: Request, exc: ProblemError | RegistryError) -> Response:
    """The API's refusal (its status and words), as a console page; nothing was written."""
    p = from_registry(exc) if isinstance(exc, RegistryError) else exc
    detail = p.detail + "".join(f" · {field}: {what}" for field, what in (p.errors or [])[1:])
    return _render("error.html", p.status, signed_in=True, message=f"Not done: {detail}",
                   csrf=str(getattr(request.state, "console_csrf", "")))


async def _run_api(request: Request, fn: Callable[..., Any], *args: Any,
                   page: Callable[[ProblemError], Response] | None = None) -> Any:
    """Call an API route function in a worker thread; its refusals become :class:`_Refused` pages
    (a :class:`Forbidden` audited, as the API's handler does; others by ``page`` when given)."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except Forbidden as exc:
        await record_denial(request, exc)
        raise _Refused(_problem_page(request, exc)) from None
    except (ProblemError, RegistryError) as exc:
        problem = from_registry(exc) if isinstance(exc, RegistryError) else exc
        raise _Refused(page(problem) if page is not None else _problem_page(request, problem)) from None


def _see_other(url: str) -> Response:
    return RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)


# --- trigger acts --------------------------------------------------------------------------------


def _trigger_or_none(request: Request, principal: Principal, trigger_id: str) -> Any:
    t = _ctx(request).store.registry.get_trigger(principal.tenant_id, trigger_id)
    return None if t is None or t.state.value == "deleted" else t


def _confirm_page(request: Request, act: Act, principal: Principal, subject: dict[str, Any],
                  status: int = 200, **extra: Any) -> Response:
    return _render("act.html", status, signed_in=True, act=act, subject=subject,
                   csrf=csrf_token("session", _session_id(request) or ""), **extra)


def _backfill_defaults(request: Request) -> dict[str, Any]:
    """The form's starting window: the last hour before now."""
    now = _ctx(request).now_us()
    return {"from": _when(now - 3600 * 1_000_000), "to": _when(now), "skip_delivered": False}


@router.get("/triggers/{trigger_id}/act/{name}")
def confirm_trigger_act(request: Request, trigger_id: str, name: str) -> Response:
    """The confirmation page of a trigger act (changes nothing); 403 when the API would refuse it."""
    principal = _principal(request)
    act = ACTS.get(name)
    t = _trigger_or_none(request, principal, trigger_id)
    if act is None or name not in TRIGGER_ACTS or t is None:
        return _render("error.html", 404, signed_in=True, message="No such trigger or act.",
                       csrf=csrf_token("session", _session_id(request) or ""))
    try:
        check(request.app, act, principal)
    except Forbidden as exc:
        return _forbidden(request, f"You may not {act.label.rstrip('…').lower()}: {exc.detail}.")
    subject = {"kind": "trigger", "id": t.id, "name": t.name, "state": t.state.value}
    return _confirm_page(request, act, principal, subject, window=_backfill_defaults(request), preview=None)


@router.post("/triggers/{trigger_id}/act/{name}")
async def trigger_act(request: Request, trigger_id: str, name: str) -> Response:
    """Act once confirmed (CSRF, then the API's role check, then ``confirm=yes``); then back to the
    trigger's page (a run: to the new fire's page) with a banner."""
    act = ACTS.get(name)
    if act is None or name not in TRIGGER_ACTS:
        return _render("error.html", 404, signed_in=False, message="No such act.")
    try:
        principal, form = await _authorised(request, act)
        t = await anyio.to_thread.run_sync(_trigger_or_none, request, principal, trigger_id)
        if t is None:
            return _render("error.html", 404, signed_in=True, message="No such trigger.",
                           csrf=csrf_token("session", _session_id(request) or ""))
        subject = {"kind": "trigger", "id": t.id, "name": t.name, "state": t.state.value}
        if name == "backfill":
            return await _backfill(request, act, principal, subject, form)
        if form.get("confirm") != "yes":
            return _confirm_page(request, act, principal, subject, window=_backfill_defaults(request), preview=None)
        ctx = _ctx(request)
        fn = {"pause": triggers.pause_trigger, "resume": triggers.resume_trigger, "run": triggers.run_trigger}[name]
        out = await _run_api(request, fn, trigger_id, principal, ctx)
    except _Refused as refused:
        return refused.response
    if name == "run":
        return _see_other(f"{PREFIX}/fires/{out['key']}?done=run")
    return _see_other(f"{PREFIX}/triggers/{trigger_id}?done={name}")


async def _backfill(request: Request, act: Act, principal: Principal, subject: dict[str, Any],
                    form: dict[str, str]) -> Response:
    """``step=preview``: the API's dry run of the window, shown with a form confirming exactly it;
    ``step=confirm`` with ``confirm=yes``: the backfill itself. Bad input: the form again, named."""
    window = {"from": form.get("from", "").strip(), "to": form.get("to", "").strip(),
              "skip_delivered": form.get("skip_delivered") == "yes"}
    confirmed = form.get("step") == "confirm" and form.get("confirm") == "yes"
    try:
        body = backfill_api.BackfillRequest.model_validate(
            {"from": window["from"], "to": window["to"], "dry_run": not confirmed,
             "skip_delivered": window["skip_delivered"]})
    except ValidationError as exc:
        errors = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return _confirm_page(request, act, principal, subject, 422, window=window, preview=None, errors=errors)

    def refused(p: ProblemError) -> Response:   # the API's words, with the form to correct the window
        errors = [f"{field}: {what}" for field, what in p.errors or []] or [p.detail]
        return _confirm_page(request, act, principal, subject, p.status, window=window, preview=None, errors=errors)

    out = await _run_api(request, backfill_api.backfill_trigger, subject["id"], body, Response(), principal,
                         _ctx(request), page=refused)
    if confirmed:
        return _see_other(f"{PREFIX}/triggers/{subject['id']}?done=backfill")
    return _confirm_page(request, act, principal, subject, window=window, preview=out)


# --- redrive -------------------------------------------------------------------------------------


def _dead_letter(request: Request, principal: Principal, key: str) -> dict[str, Any] | None:
    try:
        fk = FireKey.parse(key)
    except ValueError:
        return None
    ctx = _ctx(request)
    fire = ctx.store.history.get_fire(fk) if fk.tenant_id == principal.tenant_id else None
    if fire is None:
        return None
    t = ctx.store.registry.get_trigger(principal.tenant_id, fire.trigger_id)
    return {"kind": "fire", "id": key, "name": t.name if t else fire.trigger_id, "trigger_id": fire.trigger_id,
            "state": fire.state.value, "cause": fire.cause or "", "scheduled": _when(fire.scheduled_us),
            "attempts": fire.attempts}


@router.get("/fires/{key}/redrive")
def confirm_redrive(request: Request, key: str) -> Response:
    """The confirmation page of a redrive (changes nothing)."""
    principal = _principal(request)
    act = ACTS["redrive"]
    subject = _dead_letter(request, principal, key)
    if subject is None:
        return _render("error.html", 404, signed_in=True, message="No such fire.",
                       csrf=csrf_token("session", _session_id(request) or ""))
    try:
        check(request.app, act, principal)
    except Forbidden as exc:
        return _forbidden(request, f"You may not redrive: {exc.detail}.")
    return _confirm_page(request, act, principal, subject, window=None, preview=None)


@router.post("/fires/{key}/redrive")
async def redrive(request: Request, key: str) -> Response:
    """Redrive once confirmed (CSRF, the API's role check, ``confirm=yes``): the API's redrive."""
    act = ACTS["redrive"]
    try:
        principal, form = await _authorised(request, act)
        subject = await anyio.to_thread.run_sync(_dead_letter, request, principal, key)
        if subject is None:
            return _render("error.html", 404, signed_in=True, message="No such fire.",
                           csrf=csrf_token("session", _session_id(request) or ""))
        if form.get("confirm") != "yes":
            return _confirm_page(request, act, principal, subject, window=None, preview=None)
        await _run_api(request, deadletters.redrive_fire, key, principal, _ctx(request))
    except _Refused as refused:
        return refused.response
    return _see_other(f"{PREFIX}/fires/{key}?done=redrive")


__all__ = ["ACTS", "Act", "check", "done_message", "offered", "router"]
