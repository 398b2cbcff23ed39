"""The console's sessions, CSRF tokens and page rendering, shared by its pages (the package) and
its act forms (:mod:`.actions`); the contracts are the package's (decision 0084)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from fireledger.domain.keys import from_us
from fireledger.domain.model import Principal
from fireledger.errors import FireledgerError
from fireledger.recurrence import format_instant

from ..context import ApiContext

COOKIE = "fireledger_console"
PREFIX = "/console"
#: ``Sec-Fetch-Site`` values a console POST may carry (absent: a client that does not send it).
_SAME_SITE = frozenset({"same-origin", "none"})
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


class _SignIn(FireledgerError):
    """Raised by a page when there is no valid session: answered with a redirect to the login."""


def _ctx(request: Request) -> ApiContext:
    ctx: ApiContext = request.app.state.fireledger
    return ctx


def _render(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    values.setdefault("csrf", "")
    html = _env.get_template(name).render(prefix=PREFIX, **values)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def _digest(purpose: str, secret: str) -> str:
    """A one-way, purpose-separated digest of a secret (session id or login nonce), base64url."""
    raw = hashlib.sha256(f"fireledger/console-{purpose}/v1\x00{secret}".encode()).digest()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def session_hash(session_id: str) -> str:
    """What the store keeps of a session id (a database reader cannot sign in with it)."""
    return _digest("session", session_id)


def csrf_token(purpose: str, secret: str) -> str:
    """The CSRF token of a form: ``purpose`` ``login`` (bound to the login nonce) or ``session``
    (bound to the session id). Distinct from :func:`session_hash`, so the stored hash is no token."""
    return _digest(f"csrf-{purpose}", secret)


def same_token(sent: str, expected: str) -> bool:
    """Constant-time comparison of a form's CSRF token with the expected one. Compares bytes: a sent
    value with non-ASCII characters is simply unequal (``hmac.compare_digest`` on such a ``str``
    raises, which answered 500)."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected.encode("utf-8"))


def _cookie_value(request: Request, name: str) -> str | None:
    value = request.cookies.get(name)
    if not value or len(value) > 128:
        return None
    return value


def _session_id(request: Request) -> str | None:
    return _cookie_value(request, COOKIE)


def _principal(request: Request) -> Principal:
    session_id = _session_id(request)
    if session_id is None:
        raise _SignIn()
    ctx = _ctx(request)
    principal = ctx.store.trust.console_session(session_hash(session_id), ctx.now_us())
    if principal is None or "reader" not in principal.roles:
        raise _SignIn()
    request.state.console_csrf = csrf_token("session", session_id)
    return principal


def _csrf(request: Request) -> str:
    """The signed-in page's sign-out token (set by :func:`_principal`)."""
    return str(getattr(request.state, "console_csrf", ""))



def _cross_site(request: Request) -> bool:
    """A browser says another site (or a sibling subdomain) sent this request."""
    site = request.headers.get("sec-fetch-site")
    return site is not None and site.lower() not in _SAME_SITE



def _when(us: int | None) -> str:
    return "—" if us is None else format_instant(from_us(us))
