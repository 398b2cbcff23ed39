"""The web console: server-rendered HTML (Jinja2, autoescaped), no build step, no JavaScript.

Pages (all under ``/console``, all scoped to the signed-in tenant; the act forms — pause, resume,
run now, backfill, redrive — are :mod:`.actions`'s, each behind the API route's own role check):

* ``/console/login`` — sign in with a token (the one ``fireledger tenant create`` prints; it must
  carry the ``reader`` role). The token is checked once and never kept: the console opens a
  server-side session (:mod:`fireledger.store.console`, decision 0084) and the cookie holds only
  its random id — ``HttpOnly``, ``SameSite=Strict``, ``Path=/console``, 8 h, ``Secure`` when the
  console is public over HTTPS (:func:`cookie_secure`). Revoking the principal, deleting the tenant
  or ``POST /console/logout`` ends the session in every control process.
* ``/console/`` — the tenant overview: triggers by state, fires of the last 24 h by state, the oldest
  fire still waiting, and triggers that need attention.
* ``/console/triggers`` — every trigger with its state, next instants and recent health.
* ``/console/triggers/{id}`` — one trigger: upcoming instants with DST notes (the timing loop's own
  preview code), a lateness chart (inline SVG) over a chosen window, fire history with causes.
* ``/console/fires/{key}`` — the story of one fire (the same text as ``fireledger why``).

CSRF (decision 0084): every POST form carries a ``csrf`` field. The sign-in form's is bound to a
pre-session nonce in its own cookie (``Path=/console/login``, a double submit whose field is a hash
of the nonce); the sign-out form's is bound to the session. A POST whose token does not match, or
whose ``Sec-Fetch-Site`` says another site sent it, changes nothing. Each page costs a fixed number
of store queries whatever the number of triggers.

Every response carries a strict Content-Security-Policy (no script at all, styles from
``/console/static/console.css`` only), ``no-store`` caching and ``frame-ancestors 'none'``.
Payloads are never read, let alone shown (DESIGN.md invariant 14). Request bodies are capped by
:mod:`fireledger.control.bodylimit` (4 KiB under ``/console``) before these routes run.
"""

from __future__ import annotations

import secrets
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from fireledger.definitions import recurrence_of
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import Fire, Principal, Trigger, TriggerVersion
from fireledger.recurrence import RecurrenceError, format_instant, load_zone, preview

from ..auth import hash_token
from ..context import ApiContext
from ..history import (
    DAY_US,
    explain_cause,
    fire_key,
    fire_story,
    lateness_summary,
)
from ..views import policy_fields
from .badges import target_badge
from .session import (
    COOKIE,
    PREFIX,
    SECURITY_HEADERS,
    _cookie_value,
    _cross_site,
    _csrf,
    _ctx,
    _principal,
    _render,
    _session_id,
    _SignIn,
    _when,
    csrf_token,
    same_token,
    session_hash,
)

COOKIE_MAX_AGE_S = 8 * 3600
#: The sign-in form's pre-session nonce (double-submit CSRF), sent back to ``/console/login`` only.
LOGIN_COOKIE = "fireledger_console_login"
LOGIN_COOKIE_MAX_AGE_S = 3600
PUBLIC_URL_ENV = "FIRELEDGER_PUBLIC_URL"
HISTORY_PAGE = 50
HEALTH_N = 10
#: Triggers on the list page, and triggers the overview checks for attention (bounded pages).
LIST_TRIGGERS = 500
ATTENTION_TRIGGERS = 200
WINDOWS: dict[str, int] = {"1h": 3600 * 1_000_000, "24h": DAY_US, "7d": 7 * DAY_US, "30d": 30 * DAY_US}
STATES = ("pending", "dispatching", "held", "delivered", "failed", "unknown", "expired", "skipped")

def public_url_from_env(env: dict[str, str] | None = None) -> str | None:
    """``FIRELEDGER_PUBLIC_URL`` (the console's address as browsers see it), checked: ``http`` or
    ``https`` with a host. Raises ``ValueError`` naming the variable; unset or empty is ``None``."""
    from fireledger.settings import parse_public_url, process_env

    return parse_public_url(process_env() if env is None else env)


def cookie_secure(request: Request) -> bool:
    """Whether console cookies carry ``Secure``: by ``FIRELEDGER_PUBLIC_URL``'s scheme when it is
    set; otherwise by the scheme of the request as the server saw it (``https`` only when TLS ends
    at this server, or at a proxy listed in ``FIRELEDGER_TRUSTED_PROXIES`` that says so)."""
    public: str | None = getattr(request.app.state, "console_public_url", None)
    if public is not None:
        return public.startswith("https:")
    return request.url.scheme == "https"


def _form(body: bytes) -> dict[str, str]:
    fields = parse_qs(body.decode("latin-1"), max_num_fields=8)
    return {k: v[0] for k, v in fields.items() if v}


def _secs(v: float | None) -> str:
    if v is None:
        return "—"
    if abs(v) < 1:
        return f"{v * 1000:.0f} ms"
    if abs(v) < 600:
        return f"{v:.2f} s"
    return f"{v / 60:.1f} min"


def _schedule_text(schedule: dict[str, Any]) -> str:
    zone = schedule.get("zone", "UTC")
    if "cron" in schedule:
        return f"cron {schedule['cron']} ({zone})"
    if "every" in schedule:
        return f"every {schedule['every']}"
    if "at" in schedule:
        return f"once at {schedule['at']}"
    return "?"


_DST_NOTES = {
    "gap": "DST gap: this wall time does not exist; fires at the instant the clock jumps",
    "fold": "DST fold: this wall time occurs twice; fires on the first occurrence only",
}


def _upcoming(ctx: ApiContext, trigger: Trigger, v: TriggerVersion | None, count: int) -> list[dict[str, str]]:
    """The next instants after now by the timing loop's own code, each with its wall time and DST
    note (``v``: the trigger's current version, already read; nothing is read here)."""
    if trigger.state.value != "active" or v is None:
        return []
    try:
        rec = recurrence_of(v)
        occurrences = preview(rec, from_us(ctx.now_us()), count)
        zone = load_zone(rec.zone_name)
    except RecurrenceError:
        return []
    out = []
    for occ in occurrences:
        wall = occ.wall if occ.wall is not None else occ.instant.astimezone(zone)
        out.append({"instant": format_instant(occ.instant),
                    "local": f"{wall.replace(tzinfo=None).isoformat(sep=' ')} {rec.zone_name}",
                    "note": _DST_NOTES.get(occ.note or "", "")})
    return out


def _fire_row(f: Fire) -> dict[str, Any]:
    last = f.attempt_list[-1] if f.attempt_list else None
    lateness = None if f.dispatched_us is None else (f.dispatched_us - f.scheduled_us) / 1e6
    return {
        "key": fire_key(f), "scheduled": _when(f.scheduled_us), "state": f.state, "cause": f.cause or "",
        "why": explain_cause(f.cause) or "", "lateness": _secs(lateness), "decided": _when(f.decided_us),
        "decided_by": f.decided_by, "lane": f.lane, "kind": f.kind, "version": f.version,
        "eps": "" if f.eps_us is None else f"ε {f.eps_us / 1000:.1f} ms ({f.eps_source or '?'})",
        "attempts": len(f.attempt_list),
        "last": "" if last is None else (f"{last.result or 'running'}"
                                         + (f" (HTTP {last.http_status})" if last.http_status else "")),
    }


def _short(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{seconds / 60:g}m"


def _bound(le: float | None, previous: float | None) -> str:
    """A bucket's axis label: its upper bound (``>5m`` for the last, open bucket)."""
    return _short(float(le)) if le is not None else f">{_short(float(previous or 0))}"


def _chart(summary: dict[str, Any], width: int = 640, height: int = 180) -> dict[str, Any]:
    """Geometry of the lateness histogram (numbers only; the template draws the SVG)."""
    buckets = summary["histogram"]
    top = max((b["count"] for b in buckets), default=0) or 1
    pad_l, pad_b, pad_t = 8, 34, 16
    bw = (width - 2 * pad_l) / len(buckets)
    bars = []
    for i, b in enumerate(buckets):
        h = (height - pad_b - pad_t) * b["count"] / top
        bars.append({"x": round(pad_l + i * bw + 2, 1), "y": round(height - pad_b - h, 1),
                     "w": round(bw - 4, 1), "h": round(h, 1), "count": b["count"],
                     "label": _bound(b["le"], buckets[i - 1]["le"] if i else None),
                     "lx": round(pad_l + i * bw + bw / 2, 1)})
    return {"width": width, "height": height, "bars": bars, "base": height - pad_b, "label_y": height - pad_b + 14,
            "count_y_offset": 4}


router = APIRouter(prefix=PREFIX, include_in_schema=False)


@router.get("")
def root() -> Response:
    """``/console`` and, mounted at ``/`` by :func:`mount`, the service's front door: the console."""
    return RedirectResponse(f"{PREFIX}/", status_code=303, headers=SECURITY_HEADERS)


@router.get("/login")
def login_page(request: Request, error: str | None = None) -> Response:
    message = {"token": "That token is not valid, or it cannot read history.",
               "form": "Paste a token to sign in.",
               "expired": "The sign-in form expired; please try again."}.get(error or "", "")
    nonce = _cookie_value(request, LOGIN_COOKIE) or secrets.token_urlsafe(32)
    resp = _render("login.html", message=message, signed_in=False, csrf=csrf_token("login", nonce))
    resp.set_cookie(LOGIN_COOKIE, nonce, max_age=LOGIN_COOKIE_MAX_AGE_S, path=f"{PREFIX}/login", httponly=True,
                    samesite="strict", secure=cookie_secure(request))
    return resp


def _to_login(error: str) -> Response:
    return RedirectResponse(f"{PREFIX}/login?error={error}", status_code=303, headers=SECURITY_HEADERS)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the token once, open a session, set its cookie; the token itself is not kept."""
    form = _form(await request.body())   # at most 4 KiB (bodylimit)
    nonce = _cookie_value(request, LOGIN_COOKIE)
    sent = form.get("csrf", "")
    if _cross_site(request) or nonce is None or not same_token(sent, csrf_token("login", nonce)):
        return _to_login("expired")
    token = form.get("token", "").strip()
    if not token or len(token) > 512:
        return _to_login("form")
    ctx = _ctx(request)
    principal = await anyio.to_thread.run_sync(ctx.store.trust.principal_by_token_hash, hash_token(token))
    if principal is None or "reader" not in principal.roles:
        return _to_login("token")
    session_id = secrets.token_urlsafe(32)
    now = ctx.now_us()
    await anyio.to_thread.run_sync(ctx.store.trust.create_console_session, session_hash(session_id), principal, now,
                                   now + COOKIE_MAX_AGE_S * 1_000_000)
    old = _session_id(request)
    if old is not None:   # signing in again replaces the session this browser had
        await anyio.to_thread.run_sync(ctx.store.trust.end_console_session, session_hash(old))
    secure = cookie_secure(request)
    resp = RedirectResponse(f"{PREFIX}/", status_code=303, headers=SECURITY_HEADERS)
    resp.set_cookie(COOKIE, session_id, max_age=COOKIE_MAX_AGE_S, path=PREFIX, httponly=True, samesite="strict",
                    secure=secure)
    resp.delete_cookie(LOGIN_COOKIE, path=f"{PREFIX}/login", httponly=True, samesite="strict", secure=secure)
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session (its row is deleted: the cookie is worthless everywhere) and clear the cookie.
    A request without the session's CSRF token changes nothing (403)."""
    session_id = _session_id(request)
    if session_id is not None:
        form = _form(await request.body())
        if _cross_site(request) or not same_token(form.get("csrf", ""), csrf_token("session", session_id)):
            return _render("error.html", 403, signed_in=False,
                           message="That sign-out request did not come from this console; nothing changed.")
        await anyio.to_thread.run_sync(_ctx(request).store.trust.end_console_session, session_hash(session_id))
    resp = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=SECURITY_HEADERS)
    resp.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=cookie_secure(request))
    return resp


@router.get("/static/console.css")
def stylesheet() -> Response:
    css = resources.files("fireledger.control.console").joinpath("static", "console.css").read_text("utf-8")
    return Response(css, media_type="text/css", headers={**SECURITY_HEADERS, "Cache-Control": "max-age=300"})


@router.get("/")
def overview(request: Request) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    now = ctx.now_us()
    tenant = ctx.store.registry.get_tenant(principal.tenant_id)
    triggers = ctx.store.history.ops_triggers(principal.tenant_id, limit=1000)
    by_state: dict[str, int] = {}
    for t in triggers:
        by_state[t.state.value] = by_state.get(t.state.value, 0) + 1
    counts = ctx.store.history.state_counts(principal.tenant_id, now - DAY_US, now + 1)
    waiting = ctx.store.history.history_fires(principal.tenant_id, to_us=now + 1, states=["pending"], limit=1)
    oldest = None
    if waiting:
        f = waiting[0]
        oldest = {"key": fire_key(f), "scheduled": _when(f.scheduled_us),
                  "age": _secs((now - f.scheduled_us) / 1e6)}
    attention = []
    recent_of = ctx.store.history.console_recent_states(principal.tenant_id, ATTENTION_TRIGGERS, HEALTH_N, now + 1)
    for t in triggers[:ATTENTION_TRIGGERS]:
        recent = recent_of.get(t.id, [])
        bad = [s for s in recent if s in ("failed", "unknown", "expired")]
        if bad:
            attention.append({"id": t.id, "name": t.name, "bad": len(bad), "of": len(recent),
                              "states": ", ".join(sorted(set(bad)))})
    return _render("overview.html", signed_in=True, tenant=tenant.name if tenant else principal.tenant_id,
                   triggers_total=len(triggers), by_state=sorted(by_state.items()),
                   counts=[(s, counts.get(s, 0)) for s in STATES], total_24h=sum(counts.values()),
                   oldest=oldest, attention=attention, now=_when(now), csrf=_csrf(request))


@router.get("/triggers")
def trigger_list(request: Request) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    now = ctx.now_us()
    rows = []
    recent_of = ctx.store.history.console_recent_states(principal.tenant_id, LIST_TRIGGERS, HEALTH_N, now + 1)
    for t, v in ctx.store.history.console_triggers(principal.tenant_id, LIST_TRIGGERS):
        recent = recent_of.get(t.id, [])
        delivered = sum(1 for s in recent if s == "delivered")
        rows.append({"id": t.id, "name": t.name, "state": t.state.value,
                     "schedule": _schedule_text(v.schedule) if v else "?",
                     "next": [u["instant"] for u in _upcoming(ctx, t, v, 3)],
                     "health": list(reversed(recent)), "health_text": f"{delivered}/{len(recent)} delivered"})
    return _render("triggers.html", signed_in=True, rows=rows, csrf=_csrf(request))


def _window(request: Request, now: int) -> tuple[str, int, int]:
    name = request.query_params.get("window", "24h")
    if name not in WINDOWS:
        name = "24h"
    return name, now - WINDOWS[name], now + 1


@router.get("/triggers/{trigger_id}")
def trigger_page(request: Request, trigger_id: str) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    t = ctx.store.registry.get_trigger(principal.tenant_id, trigger_id)
    if t is None:
        return _render("error.html", 404, signed_in=True, message="No such trigger.", csrf=_csrf(request))
    v = ctx.store.registry.get_version(t.id, t.current_version)
    now = ctx.now_us()
    window, lo, hi = _window(request, now)
    summary = lateness_summary(ctx.store.history.lateness_us(principal.tenant_id, t.id, lo, hi, cap=200_000))
    states_in_window = ctx.store.history.state_counts(principal.tenant_id, lo, hi, trigger_id=t.id)
    # History: newest first, optional state filter, keyset paging by the last row shown.
    state = request.query_params.get("state") or None
    if state not in STATES:
        state = None
    before = request.query_params.get("before")
    after: tuple[int, int] | None = None
    if before:
        try:
            key = FireKey.parse(before)
            after = (key.scheduled_us, key.seq)
        except ValueError:
            after = None
    fires = ctx.store.history.history_fires(principal.tenant_id, trigger_id=t.id, states=[state] if state else None,
                                    after=after, limit=HISTORY_PAGE + 1, descending=True)
    older = None
    if len(fires) > HISTORY_PAGE:
        fires = fires[:HISTORY_PAGE]
        older = "?" + urlencode({k: v for k, v in (("window", window), ("state", state),
                                                   ("before", fire_key(fires[-1]))) if v})
    lateness = {k: _secs(summary[k]) for k in ("p50_s", "p90_s", "p99_s", "max_s")}
    return _render("trigger.html", signed_in=True, t=t, v=v, schedule=_schedule_text(v.schedule) if v else "?",
                   upcoming=_upcoming(ctx, t, v, 10), window=window, windows=list(WINDOWS),
                   count=summary["count"], lateness=lateness, chart=_chart(summary),
                   states_in_window=sorted(states_in_window.items()), fires=[_fire_row(f) for f in fires],
                   state=state or "", states=STATES, older=older, policies=policy_fields(v.policies) if v else None,
                   badge=target_badge(ctx, v.target_id, now) if v else None, csrf=_csrf(request),
                   **_acts(request, principal, trigger_state=t.state.value))


@router.get("/fires/{key}")
def fire_page(request: Request, key: str) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    try:
        fk = FireKey.parse(key)
    except ValueError:
        fk = None
    fire = ctx.store.history.get_fire(fk) if fk is not None and fk.tenant_id == principal.tenant_id else None
    if fire is None:
        return _render("error.html", 404, signed_in=True, message="No such fire.", csrf=_csrf(request))
    t = ctx.store.registry.get_trigger(principal.tenant_id, fire.trigger_id)
    v = ctx.store.registry.get_version(fire.trigger_id, fire.version)
    story = fire_story(fire, t, v, now_us=ctx.now_us())
    return _render("fire.html", signed_in=True, key=key, f=_fire_row(fire), story=story,
                   trigger_id=fire.trigger_id, trigger_name=t.name if t else fire.trigger_id, csrf=_csrf(request),
                   **_acts(request, principal, fire_state=fire.state.value))


def _acts(request: Request, principal: Principal, **state: str) -> dict[str, Any]:
    """The page's action buttons (:func:`.actions.offered`) and the banner of an act just done."""
    from .actions import done_message, offered

    return {"acts": offered(request, principal, **state), "done": done_message(request.query_params.get("done"))}


def mount(app: FastAPI, public_url: str | None = None) -> None:
    """Add the console to ``app`` (its pages answer a redirect to the login without a session).
    ``public_url`` defaults to ``FIRELEDGER_PUBLIC_URL`` (a malformed value raises ``ValueError``)."""
    app.state.console_public_url = public_url if public_url is not None else public_url_from_env()

    @app.exception_handler(_SignIn)
    async def _to_login(_request: Request, _exc: _SignIn) -> Response:
        resp = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=SECURITY_HEADERS)
        return resp

    from .actions import router as actions_router

    app.add_api_route("/", root, methods=["GET"], include_in_schema=False)   # a newcomer finds the console
    app.include_router(router)
    app.include_router(actions_router)   # the act forms (issue 17 item 5)


__all__ = ["COOKIE", "LOGIN_COOKIE", "PREFIX", "PUBLIC_URL_ENV", "cookie_secure", "csrf_token", "mount",
           "public_url_from_env", "router", "session_hash"]
