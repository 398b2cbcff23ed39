"""Acting from the console in headless Chromium (issue 17 item 5), on real processes: a
``fireledger control`` process serving the console and a ``fireledger timing`` process deciding two
triggers every second, both on one SQLite file.

* A reader signs in and sees no action button (and is refused the act's form and, audited, its POST).
* An author pauses one trigger through the confirmation step: from the pause's commit (the instant of
  its ``trigger.pause`` audit row) the timing plane decides nothing more for it within a second, while
  it keeps deciding the other trigger (polled with a deadline, no fixed sleep).
* A POST with a forged or a missing CSRF token is refused (403) and changes nothing; the author then
  resumes it from the console and the timing plane decides it again.
* Each act is in the audit log (``GET /v1/audit``), by the author's principal.

And with every role (``fireledger control`` alone): run now, a backfill after its dry-run preview,
and the redrive of a dead letter, each confirmed in the browser and each in the audit log.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from e2e import Api, Service, wait_until
from fireledger.control.auth import create_tenant
from fireledger.domain.keys import FireKey, from_us, to_us
from fireledger.domain.model import FireKind, FireState, Lane, NewFire, Tenant
from fireledger.recurrence import TZDATA_VERSION, format_instant, parse_instant
from fireledger.store import Store
from storekit import add_target, add_trigger

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
S = 1_000_000
ROOT = Path(__file__).resolve().parents[2]


def _us(text: str) -> int:
    return to_us(parse_instant(text))


def last_decided(admin: Api, trigger_id: str) -> tuple[int, int] | None:
    """(scheduled µs, decided µs) of the trigger's latest fire, read through the API; None before any."""
    page = admin.ok("GET", f"/v1/triggers/{trigger_id}/fires?order=desc&limit=1")
    if not page["items"]:
        return None
    f = page["items"][0]
    return _us(f["scheduled_instant"]), _us(f["decided_at"])


def sign_in(context: BrowserContext, base: str, token: str) -> Page:
    page = context.new_page()
    page.goto(f"{base}/")                                   # the front door leads to the console
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.fill("#token", token)
    page.click("form.login button[type=submit]")
    expect(page.locator("h1")).to_contain_text("Tenant console-act")
    return page


def session_csrf(page: Page) -> str:
    value = page.locator("header form.logout input[name=csrf]").get_attribute("value")
    assert value
    return value


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    db = f"sqlite:///{tmp_path}/act.db"
    store = Store.open(db)
    now = int(time.time()) * S
    tenant_id, token = create_tenant(store, "console-act", now)
    tenant = Tenant(tenant_id, "console-act", now)
    target = add_target(store, tenant, url="http://127.0.0.1:9/hook", now_us=now)
    paused, _, _ = add_trigger(store, tenant, target, {"every": "1s"}, now_us=now)
    witness, _, _ = add_trigger(store, tenant, target, {"every": "1s"}, now_us=now)
    store.close()
    return {"db": db, "token": token, "paused": paused.id, "paused_name": paused.name, "witness": witness.id}


def test_reader_sees_no_buttons_author_pauses_and_the_timing_plane_stops(world: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    control = Service(world["db"], tmp_path, command="control").start()
    timing = Service(world["db"], tmp_path, command="timing").start()
    try:
        admin = Api(control.base, world["token"])
        reader = admin.ok("POST", "/v1/principals", {"name": "reader", "roles": ["reader"]})
        author = admin.ok("POST", "/v1/principals", {"name": "author", "roles": ["reader", "author"]})
        # The timing process decides both triggers, second after second.
        first = wait_until(lambda: last_decided(admin, world["paused"]), 30, "a first decided fire")
        wait_until(lambda: (last_decided(admin, world["paused"]) or (0, 0))[0] > first[0], 30, "a second one")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                _reader_sees_no_buttons(browser, control.base, reader["token"], world)
                pause_at = _author_pauses(browser, control.base, author, admin, world)
            finally:
                browser.close()
        rows = admin.ok("GET", "/v1/audit?limit=1000")["items"]
        acts = [(r["actor"], r["action"], (r["new"] or {}).get("trigger_id")) for r in rows]
        assert (author["id"], "trigger.pause", world["paused"]) in acts
        assert (author["id"], "trigger.resume", world["paused"]) in acts
        denied = [r for r in rows if r["action"] == "denied" and r["actor"] == reader["id"]]
        assert denied and denied[0]["new"]["missing_role"] == "author"
        assert pause_at > 0
    finally:
        timing.stop()
        control.stop()


def _reader_sees_no_buttons(browser: Browser, base: str, token: str, world: dict[str, Any]) -> None:
    context = browser.new_context()
    page = sign_in(context, base, token)
    page.goto(f"{base}/console/triggers/{world['paused']}")
    expect(page.locator("h1")).to_contain_text(world["paused_name"])
    expect(page.locator("#actions")).to_have_count(0)
    expect(page.locator("a.button")).to_have_count(0)
    expect(page.locator("form.act")).to_have_count(0)
    assert page.goto(f"{base}/console/triggers/{world['paused']}/act/pause").status == 403
    # Even with its own session's token, the reader's POST is refused by the API's role check (audited).
    r = context.request.post(f"{base}/console/triggers/{world['paused']}/act/pause",
                             form={"csrf": session_csrf(page), "confirm": "yes"})
    assert r.status == 403
    context.close()


def _author_pauses(browser: Browser, base: str, author: dict[str, Any], admin: Api,
                   world: dict[str, Any]) -> int:
    """Pause through the confirmation page; show the timing plane stops within a second; forged and
    missing tokens refused; resume; returns the pause instant (µs)."""
    context = browser.new_context()
    page = sign_in(context, base, author["token"])
    page.goto(f"{base}/console/triggers/{world['paused']}")
    expect(page.locator("#actions a.act-pause")).to_be_visible()
    expect(page.locator("#actions a.act-backfill")).to_have_count(0)   # an author has no backfill role
    page.click("#actions a.act-pause")
    expect(page.locator("#question")).to_contain_text("Pause this trigger?")
    (ROOT / "artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "artifacts" / "console-confirm-pause.png"), full_page=True)
    assert admin.ok("GET", f"/v1/triggers/{world['paused']}")["state"] == "active"   # a GET changed nothing
    page.click("form#confirm button[type=submit]")
    expect(page.locator("#done")).to_contain_text("Paused")
    expect(page.locator("h1 .state")).to_have_text("paused")
    rows = admin.ok("GET", "/v1/audit?limit=1000")["items"]
    pause_at = _us(next(r["at"] for r in rows if r["action"] == "trigger.pause"))
    # The witness keeps being decided 3 s past the pause: the timing plane is alive and deciding...
    wait_until(lambda: (last_decided(admin, world["witness"]) or (0, 0))[1] >= pause_at + 3 * S, 30,
               "the timing plane to decide the other trigger 3 s past the pause")
    # ... but decided nothing for the paused trigger later than a second after the pause.
    stopped = last_decided(admin, world["paused"])
    assert stopped is not None and stopped[1] <= pause_at + S, (stopped, pause_at)
    assert stopped[0] <= pause_at + S, (stopped, pause_at)
    # A forged or a missing CSRF token: 403, and it stays paused (the resume is refused).
    resume = f"{base}/console/triggers/{world['paused']}/act/resume"
    for form in ({"csrf": "forged-" + session_csrf(page)[7:], "confirm": "yes"}, {"confirm": "yes"}):
        r = context.request.post(resume, form=form)
        assert r.status == 403 and "nothing changed" in r.text()
    assert admin.ok("GET", f"/v1/triggers/{world['paused']}")["state"] == "paused"
    assert last_decided(admin, world["paused"]) == stopped
    # Resume from the console: the timing plane decides the trigger again.
    page.click("#actions a.act-resume")
    page.click("form#confirm button[type=submit]")
    expect(page.locator("#done")).to_contain_text("Resumed")
    wait_until(lambda: (last_decided(admin, world["paused"]) or (0, 0))[1] > pause_at + 3 * S, 30,
               "the resumed trigger to be decided again")
    context.close()
    return pause_at


@pytest.fixture
def dead_letter_world(tmp_path: Path) -> dict[str, Any]:
    """A cron trigger every 5 minutes with one fire that ended failed (a dead letter) an hour ago."""
    db = f"sqlite:///{tmp_path}/acts.db"
    store = Store.open(db)
    now = int(time.time()) * S
    tenant_id, token = create_tenant(store, "console-act", now)
    tenant = Tenant(tenant_id, "console-act", now)
    target = add_target(store, tenant, url="http://127.0.0.1:9/hook", now_us=now)
    trig, _, _ = add_trigger(store, tenant, target, {"cron": "*/5 * * * *", "zone": "UTC"}, now_us=now - 2 * 3600 * S)
    at = now - 3600 * S - now % (300 * S)
    fire = NewFire(tenant_id, trig.id, at, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.FAILED, at + 1000,
                   TZDATA_VERSION, "node-a", cause="failed: HTTP 404 is final")
    assert store.timing.insert_fires([fire])
    store.close()
    return {"db": db, "token": token, "trigger": trig.id, "dead": str(FireKey(tenant_id, trig.id, at, 0)), "now": now}


def test_run_now_backfill_after_its_preview_and_redrive_each_confirmed_and_audited(
        dead_letter_world: dict[str, Any], tmp_path: Path) -> None:
    w = dead_letter_world
    control = Service(w["db"], tmp_path, command="control").start()
    try:
        admin = Api(control.base, w["token"])
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = sign_in(browser.new_context(), control.base, w["token"])   # every role
                # Run now: confirmed, then the new manual fire's page.
                page.goto(f"{control.base}/console/triggers/{w['trigger']}")
                page.click("#actions a.act-run")
                page.click("form#confirm button[type=submit]")
                expect(page.locator("#done")).to_contain_text("Run now")
                run_key = page.url.rsplit("/", 1)[1].split("?")[0]
                assert admin.ok("GET", f"/v1/fires/{run_key}")["kind"] == "manual"
                # Backfill: the dry run lists the window's instants and stores nothing; then confirmed.
                page.goto(f"{control.base}/console/triggers/{w['trigger']}")
                page.click("#actions a.act-backfill")
                lo = w["now"] - 3600 * S - w["now"] % (300 * S) - 1800 * S
                page.fill("#from", _text(lo))
                page.fill("#to", _text(lo + 1800 * S))
                page.click("form#backfill-preview button[type=submit]")
                expect(page.locator("#preview-summary")).to_contain_text("would create 6")
                assert _kinds(admin, w["trigger"]).count("backfill") == 0
                page.click("form#confirm button[type=submit]")
                expect(page.locator("#done")).to_contain_text("Backfilled")
                assert _kinds(admin, w["trigger"]).count("backfill") == 6
                # Redrive the dead letter from its page.
                page.goto(f"{control.base}/console/fires/{w['dead']}")
                page.click("#actions a.act-redrive")
                expect(page.locator("#question")).to_contain_text("SAME key")
                page.click("form#confirm button[type=submit]")
                expect(page.locator("#done")).to_contain_text("Redriven")
                assert admin.ok("GET", f"/v1/fires/{w['dead']}")["state"] == "pending"
                expect(page.locator("#actions")).to_have_count(0)   # pending: nothing to redrive
            finally:
                browser.close()
        acts = [(r["action"], r["new"]) for r in admin.ok("GET", "/v1/audit?limit=1000")["items"]]
        assert ("trigger.run", {"trigger_id": w["trigger"], "fire_key": run_key}) in acts
        assert [n["created"] for a, n in acts if a == "trigger.backfill"] == [6]
        assert [n["fire_key"] for a, n in acts if a == "fire.redrive"] == [w["dead"]]
    finally:
        control.stop()


def _text(us: int) -> str:
    return format_instant(from_us(us))


def _kinds(admin: Api, trigger_id: str) -> list[str]:
    return [f["kind"] for f in admin.ok("GET", f"/v1/triggers/{trigger_id}/fires?limit=1000")["items"]]
