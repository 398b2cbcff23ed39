"""The web console: server-rendered HTML (Jinja2, autoescaped), no build step, no JavaScript.

Pages (all under ``/console``, all read only, all scoped to the signed-in tenant):

* ``/console/login`` — sign in with a token (the one ``fireledger tenant create`` prints). The token
  is kept in a cookie that is ``HttpOnly`` (no script can read it), ``SameSite=Strict`` (no other
  site can make the browser send it: no CSRF) and ``Path=/console``; ``Secure`` when served over
  HTTPS. ``POST /console/logout`` clears it. The token must carry the ``reader`` role.
* ``/console/`` — the tenant overview: triggers by state, fires of the last 24 h by state, the oldest
  fire still waiting, and triggers that need attention.
* ``/console/triggers`` — every trigger with its state, next instants and recent health.
* ``/console/triggers/{id}`` — one trigger: upcoming instants with DST notes (the timing loop's own
  preview code), a lateness chart (inline SVG) over a chosen window, fire history with causes.
* ``/console/fires/{key}`` — the story of one fire (the same text as ``fireledger why``).

Every response carries a strict Content-Security-Policy (no script at all, styles from
``/console/static/console.css`` only), ``no-store`` caching and ``frame-ancestors 'none'``.
Payloads are never read, let alone shown (DESIGN.md invariant 14).
"""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from fireledger.definitions import recurrence_of
from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import Fire, Principal, Trigger
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

COOKIE = "fireledger_console"
COOKIE_MAX_AGE_S = 8 * 3600
PREFIX = "/console"
HISTORY_PAGE = 50
HEALTH_N = 10
WINDOWS: dict[str, int] = {"1h": 3600 * 1_000_000, "24h": DAY_US, "7d": 7 * DAY_US, "30d": 30 * DAY_US}
STATES = ("pending", "dispatching", "held", "delivered", "failed", "unknown", "expired", "skipped")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

_env = Environment(loader=PackageLoader("fireledger.control.console", "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True),
                   undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


class _SignIn(Exception):
    """Raised by a page when there is no valid session: answered with a redirect to the login."""


def _ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.fireledger
    return ctx


def _render(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    html = _env.get_template(name).render(prefix=PREFIX, **values)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _principal(request: Request) -> Principal:
    token = request.cookies.get(COOKIE)
    if not token or len(token) > 512:
        raise _SignIn()
    principal = _ctx(request).store.principal_by_token_hash(hash_token(token))
    if principal is None or "reader" not in principal.roles:
        raise _SignIn()
    return principal


def _when(us: int | None) -> str:
    return "—" if us is None else format_instant(from_us(us))


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


def _upcoming(ctx: ApiContext, trigger: Trigger, count: int) -> list[dict[str, str]]:
    """The next instants after now by the timing loop's own code, each with its wall time and DST note."""
    if trigger.state.value != "active":
        return []
    v = ctx.store.get_version(trigger.id, trigger.current_version)
    if v is None:
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
    return RedirectResponse(f"{PREFIX}/", status_code=303, headers=SECURITY_HEADERS)


@router.get("/login")
def login_page(request: Request, error: str | None = None) -> Response:
    message = {"token": "That token is not valid, or it cannot read history.",
               "form": "Paste a token to sign in."}.get(error or "", "")
    return _render("login.html", message=message, signed_in=False)


@router.post("/login")
async def login(request: Request) -> Response:
    body = await request.body()
    if len(body) > 4096:
        return RedirectResponse(f"{PREFIX}/login?error=form", status_code=303, headers=SECURITY_HEADERS)
    token = (parse_qs(body.decode("latin-1")).get("token") or [""])[0].strip()
    if not token or len(token) > 512:
        return RedirectResponse(f"{PREFIX}/login?error=form", status_code=303, headers=SECURITY_HEADERS)
    store = _ctx(request).store
    principal = await anyio.to_thread.run_sync(store.principal_by_token_hash, hash_token(token))
    if principal is None or "reader" not in principal.roles:
        return RedirectResponse(f"{PREFIX}/login?error=token", status_code=303, headers=SECURITY_HEADERS)
    resp = RedirectResponse(f"{PREFIX}/", status_code=303, headers=SECURITY_HEADERS)
    resp.set_cookie(COOKIE, token, max_age=COOKIE_MAX_AGE_S, path=PREFIX, httponly=True, samesite="strict",
                    secure=request.url.scheme == "https")
    return resp


@router.post("/logout")
def logout(request: Request) -> Response:
    resp = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=SECURITY_HEADERS)
    resp.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict",
                       secure=request.url.scheme == "https")
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
    tenant = ctx.store.get_tenant(principal.tenant_id)
    triggers = ctx.store.ops_triggers(principal.tenant_id, limit=1000)
    by_state: dict[str, int] = {}
    for t in triggers:
        by_state[t.state.value] = by_state.get(t.state.value, 0) + 1
    counts = ctx.store.state_counts(principal.tenant_id, now - DAY_US, now + 1)
    waiting = ctx.store.history_fires(principal.tenant_id, to_us=now + 1, states=["pending"], limit=1)
    oldest = None
    if waiting:
        f = waiting[0]
        oldest = {"key": fire_key(f), "scheduled": _when(f.scheduled_us),
                  "age": _secs((now - f.scheduled_us) / 1e6)}
    attention = []
    for t in triggers[:200]:
        recent = ctx.store.recent_states(principal.tenant_id, t.id, HEALTH_N, before_us=now + 1)
        bad = [s for s in recent if s in ("failed", "unknown", "expired")]
        if bad:
            attention.append({"id": t.id, "name": t.name, "bad": len(bad), "of": len(recent),
                              "states": ", ".join(sorted(set(bad)))})
    return _render("overview.html", signed_in=True, tenant=tenant.name if tenant else principal.tenant_id,
                   triggers_total=len(triggers), by_state=sorted(by_state.items()),
                   counts=[(s, counts.get(s, 0)) for s in STATES], total_24h=sum(counts.values()),
                   oldest=oldest, attention=attention, now=_when(now))


@router.get("/triggers")
def trigger_list(request: Request) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    now = ctx.now_us()
    rows = []
    for t in ctx.store.ops_triggers(principal.tenant_id, limit=500):
        v = ctx.store.get_version(t.id, t.current_version)
        recent = ctx.store.recent_states(principal.tenant_id, t.id, HEALTH_N, before_us=now + 1)
        delivered = sum(1 for s in recent if s == "delivered")
        rows.append({"id": t.id, "name": t.name, "state": t.state.value,
                     "schedule": _schedule_text(v.schedule) if v else "?",
                     "next": [u["instant"] for u in _upcoming(ctx, t, 3)],
                     "health": list(reversed(recent)), "health_text": f"{delivered}/{len(recent)} delivered"})
    return _render("triggers.html", signed_in=True, rows=rows)


def _window(request: Request, now: int) -> tuple[str, int, int]:
    name = request.query_params.get("window", "24h")
    if name not in WINDOWS:
        name = "24h"
    return name, now - WINDOWS[name], now + 1


@router.get("/triggers/{trigger_id}")
def trigger_page(request: Request, trigger_id: str) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    t = ctx.store.get_trigger(principal.tenant_id, trigger_id)
    if t is None:
        return _render("error.html", 404, signed_in=True, message="No such trigger.")
    v = ctx.store.get_version(t.id, t.current_version)
    now = ctx.now_us()
    window, lo, hi = _window(request, now)
    summary = lateness_summary(ctx.store.lateness_us(principal.tenant_id, t.id, lo, hi, cap=200_000))
    states_in_window = ctx.store.state_counts(principal.tenant_id, lo, hi, trigger_id=t.id)
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
    fires = ctx.store.history_fires(principal.tenant_id, trigger_id=t.id, states=[state] if state else None,
                                    after=after, limit=HISTORY_PAGE + 1, descending=True)
    older = None
    if len(fires) > HISTORY_PAGE:
        fires = fires[:HISTORY_PAGE]
        older = "?" + urlencode({k: v for k, v in (("window", window), ("state", state),
                                                   ("before", fire_key(fires[-1]))) if v})
    lateness = {k: _secs(summary[k]) for k in ("p50_s", "p90_s", "p99_s", "max_s")}
    return _render("trigger.html", signed_in=True, t=t, v=v, schedule=_schedule_text(v.schedule) if v else "?",
                   upcoming=_upcoming(ctx, t, 10), window=window, windows=list(WINDOWS),
                   count=summary["count"], lateness=lateness, chart=_chart(summary),
                   states_in_window=sorted(states_in_window.items()), fires=[_fire_row(f) for f in fires],
                   state=state or "", states=STATES, older=older, policies=policy_fields(v.policies) if v else None)


@router.get("/fires/{key}")
def fire_page(request: Request, key: str) -> Response:
    principal = _principal(request)
    ctx = _ctx(request)
    try:
        fk = FireKey.parse(key)
    except ValueError:
        fk = None
    fire = ctx.store.get_fire(fk) if fk is not None and fk.tenant_id == principal.tenant_id else None
    if fire is None:
        return _render("error.html", 404, signed_in=True, message="No such fire.")
    t = ctx.store.get_trigger(principal.tenant_id, fire.trigger_id)
    v = ctx.store.get_version(fire.trigger_id, fire.version)
    story = fire_story(fire, t, v, now_us=ctx.now_us())
    return _render("fire.html", signed_in=True, key=key, f=_fire_row(fire), story=story,
                   trigger_id=fire.trigger_id, trigger_name=t.name if t else fire.trigger_id)


def mount(app: FastAPI) -> None:
    """Add the console to ``app`` (its pages answer a redirect to the login without a session)."""

    @app.exception_handler(_SignIn)
    async def _to_login(_request: Request, _exc: _SignIn) -> Response:
        resp = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=SECURITY_HEADERS)
        return resp

    app.include_router(router)


__all__ = ["COOKIE", "PREFIX", "mount", "router"]
