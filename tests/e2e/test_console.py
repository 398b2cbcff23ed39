"""The web console, end to end in headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

The ledger is written by the real planes' code: a TimingLoop on a FakeClock (so an outage of two
hours takes no time) and a real Dispatcher delivering signed HTTP to a local sink. The console is
served by a real ``fireledger control`` process reading the same SQLite file. The browser signs in
with a token, opens the trigger, and sees a delivered fire, an expired one with its cause, and the
lateness chart; the screenshot is kept at ``artifacts/console.png`` (CI keeps ``artifacts/``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from apikit import SENTINEL
from apikit import Api as ApiHarness
from e2e import Service
from fireledger.clock import FakeClock
from fireledger.control.auth import create_tenant
from fireledger.dispatch.runner import Dispatcher
from fireledger.domain.keys import to_us
from fireledger.domain.model import Policies, Tenant
from fireledger.recurrence import parse_instant
from fireledger.store import Store
from fireledger.timing import TimingLoop
from sink import SinkServer
from storekit import add_target, add_trigger

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
S = 1_000_000
MINUTE = 60 * S


def deliver_all(store: Store, clock: FakeClock) -> int:
    """Dispatch what is due at the fake clock's reading with a real Dispatcher: one claim round and
    the recording of its results (no retry is due: the clock does not move). Returns the deliveries."""
    async def main() -> int:
        async with Dispatcher(store, clock, "dispatch-test") as d:
            await d.claim_once()
            await d.flush()
            return d.delivered

    return asyncio.run(main())


@pytest.fixture
def sink() -> Iterator[SinkServer]:
    s = SinkServer()
    s.start_in_thread()
    yield s
    s.stop()


@pytest.fixture
def ledger(tmp_path: Path, sink: SinkServer) -> dict[str, Any]:
    """A trigger every 5 minutes in Paris: one fire delivered on time, then a two-hour outage, so
    instants older than the 1 h horizon are expired, newer missed ones skipped, the current one fired."""
    db = f"sqlite:///{tmp_path}/console.db"
    store = Store.open(db)
    real_now = int(time.time()) * S
    start = real_now - 3 * 3600 * S - (real_now % (5 * MINUTE))
    clock = FakeClock(start)
    tenant_id, token = create_tenant(store, "console-acme", start)
    tenant = Tenant(tenant_id, "console-acme", start)
    target = add_target(store, tenant, url=f"{sink.base_url}/ok")
    sink.add_secret(target.secret)
    trig, _, first = add_trigger(store, tenant, target, {"cron": "*/5 * * * *", "zone": "Europe/Paris"},
                                 now_us=start, payload={"secret": SENTINEL}, policies=Policies())
    assert first is not None
    timing = TimingLoop(store, clock, "timing-test")
    clock.set(first + 300_000)                    # 0.3 s after the first instant
    assert len(timing.tick().inserted) == 1
    assert deliver_all(store, clock) == 1
    clock.set(first + 2 * 3600 * S + 5 * MINUTE + 2 * S)  # back after a two-hour outage
    res = timing.tick()
    states = sorted({f.state.value for f in res.inserted})
    assert states == ["expired", "pending", "skipped"], states
    assert deliver_all(store, clock) == 1        # the caught-up fire
    store.close()
    return {"db": db, "token": token, "trigger_id": trig.id, "trigger_name": trig.name}


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/console/")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.fill("#token", token)
    page.click("form.login button[type=submit]")
    expect(page.locator("h1")).to_contain_text("Tenant console-acme")


def test_console_signs_in_and_shows_delivered_expired_and_lateness(ledger: dict[str, Any], tmp_path: Path) -> None:
    svc = Service(ledger["db"], tmp_path, command="control").start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": 1360, "height": 1000})
                page = context.new_page()
                # A wrong token is refused with a message, and no cookie is set.
                page.goto(f"{svc.base}/console/login")
                page.fill("#token", "fl_not-a-real-token")
                page.click("form.login button[type=submit]")
                expect(page.locator("p.error")).to_be_visible()
                assert [c["name"] for c in context.cookies()] == ["fireledger_console_login"]   # CSRF nonce only

                sign_in(page, svc.base, ledger["token"])
                (cookie,) = context.cookies()   # the session id; the login nonce is gone
                assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
                assert cookie["value"] != ledger["token"] and ledger["token"] not in cookie["value"]
                expect(page.locator("#fires-24h")).to_contain_text("expired")

                page.click("nav >> text=Triggers")
                row = page.locator("#triggers tbody tr", has_text=ledger["trigger_name"])
                expect(row).to_contain_text("active")
                expect(row.locator(".dot")).not_to_have_count(0)
                row.locator("a").first.click()

                expect(page.locator("h1")).to_contain_text(ledger["trigger_name"])
                delivered = page.locator("#fires tr.fire-delivered")
                expect(delivered.first).to_be_visible()
                expired = page.locator("#fires tr.fire-expired").first
                expect(expired).to_contain_text("older than the catch-up horizon (1h)")
                expect(page.locator("#fires tr.fire-skipped").first).to_contain_text("fire-once-now")
                # Upcoming instants come from the timing loop's preview, with their Paris wall time.
                expect(page.locator("#upcoming tbody tr")).to_have_count(10)
                expect(page.locator("#upcoming")).to_contain_text("Europe/Paris")
                # The lateness chart is drawn: two dispatched fires, at least one visible bar.
                chart = page.locator("svg#lateness-chart")
                expect(chart).to_be_visible()
                heights = [float(h) for h in chart.locator("rect").evaluate_all("els => els.map(e => "
                                                                                "e.getAttribute('height'))")]
                assert sum(1 for h in heights if h > 0) >= 1, heights
                expect(page.locator("#lateness-summary")).to_contain_text("2 dispatched")
                assert chart.bounding_box()["height"] > 50

                (ROOT / "artifacts").mkdir(exist_ok=True)
                page.screenshot(path=str(ROOT / "artifacts" / "console.png"), full_page=True)

                # The story of the expired fire says why it never ran.
                expired.locator("a").first.click()
                expect(page.locator("#story")).to_contain_text("not dispatched: expired")
                expect(page.locator("#story")).to_contain_text("catch-up horizon")
                assert SENTINEL not in page.content()
                # Signing out clears the cookie; the pages ask for a token again.
                page.click("header form.logout button")
                expect(page).to_have_url(re.compile(r"/console/login$"))
                page.goto(f"{svc.base}/console/triggers")
                expect(page).to_have_url(re.compile(r"/console/login$"))
            finally:
                browser.close()
    finally:
        svc.stop()


# --- the same pages without a browser: headers, isolation, DST notes ------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiHarness]:
    a = ApiHarness(tmp_path)
    yield a
    a.close()


def login(api: ApiHarness, token: str) -> None:
    """Sign in as a browser does: the login page (its CSRF token and nonce cookie), then the form."""
    page = api.http.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert page.status_code == 200 and csrf, page.text[:500]
    r = api.http.post("/console/login", data={"csrf": csrf.group(1), "token": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/", r.text
    session = next(c for c in r.headers.get_list("set-cookie") if c.startswith("fireledger_console="))
    assert "HttpOnly" in session and "SameSite=strict" in session and token not in session


def test_console_pages_are_tenant_scoped_escaped_and_locked_down(api: ApiHarness) -> None:
    _, s = api.tenant("acme")
    t = s.trigger(s.target()["id"], {"cron": "30 2 * * *", "zone": "Europe/Paris"},
                  name="<script>alert(1)</script>")
    _, other = api.tenant("other")
    assert api.http.get("/console/triggers", follow_redirects=False).headers["location"] == "/console/login"
    login(api, other.token)
    r = api.http.get(f"/console/triggers/{t['id']}")
    assert r.status_code == 404 and "<script>" not in r.text
    login(api, s.token)
    r = api.http.get(f"/console/triggers/{t['id']}")
    assert r.status_code == 200
    assert "<script>alert(1)</script>" not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert "script-src" not in r.headers["content-security-policy"]
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.headers["cache-control"] == "no-store" and SENTINEL not in r.text
    # The fake clock stands on Friday 2026-03-27: Sunday's 02:30 does not exist in Paris.
    assert "DST gap" in r.text
    gap_row = re.search(r"<tr><td>(2026-03-29T[^<]+)</td><td>([^<]+)</td><td>DST gap", r.text)
    assert gap_row and gap_row.group(1) == "2026-03-29T01:00:00Z", r.text[:4000]
    assert to_us(parse_instant(gap_row.group(1))) > api.clock.now().latest_us
