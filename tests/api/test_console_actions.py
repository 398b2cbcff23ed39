"""Acting from the console (issue 17 item 5, decisions 0180–0183), in-process on a real SQLite store:
the front door, buttons only for what the API route's own role check allows, the confirmation step,
the session-bound CSRF token (a forged, missing or cross-site one changes nothing), and each act as
the API's with the API's audit row — pause, resume, run now, backfill after a dry-run preview, redrive.
The browser flows are tests/e2e/test_console_act.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts

from apikit import SENTINEL, Api, Session, us
from fireledger.control.console.actions import ACTS, _checks_of
from fireledger.domain.keys import FireKey
from fireledger.domain.model import FireKind, FireState, Lane, NewFire
from fireledger.recurrence import TZDATA_VERSION

HOUR = 3600 * 1_000_000


@pytest.fixture
def api(tmp_path: Path):
    a = Api(tmp_path)
    yield a
    a.close()


def login(api: Api, token: str) -> str:
    """Sign in as a browser does (the test client keeps the cookie); returns the session's form token."""
    api.http.cookies.clear()
    page = api.http.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text[:300]
    r = api.http.post("/console/login", data={"csrf": csrf.group(1), "token": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/", r.text
    overview = api.http.get("/console/")
    token_field = re.search(r'name="csrf" value="([^"]+)"', overview.text)
    assert overview.status_code == 200 and token_field
    return token_field.group(1)


def principal(s: Session, *roles: str) -> dict[str, Any]:
    r = s.post("/v1/principals", json={"name": "-".join(roles), "roles": list(roles)})
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def audit_actions(api: Api, tenant_id: str) -> list[tuple[str, str]]:
    return [(e.actor, e.action) for e in api.store.trust.audit_rows(tenant_id=tenant_id)]


def buttons(html: str) -> list[str]:
    return re.findall(r'class="button act-([a-z]+)"', html)


def test_the_front_door_is_the_console(api: Api) -> None:
    r = api.http.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/"
    assert api.http.get("/").url.path == "/console/login"          # then the sign-in page
    assert "/" not in api.app.openapi()["paths"]


def test_buttons_follow_the_api_routes_role_check(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    # The console's check IS the route's dependency: the same object, whatever roles it names.
    for act in ACTS.values():
        (check,) = _checks_of(api.app, act)
        route = next(rc.original_route for rc in iter_route_contexts(api.app.routes)
                     if rc.path == act.api_path and "POST" in (rc.methods or ()))
        assert check in [d.call for d in route.dependant.dependencies]
    reader = principal(s, "reader")
    login(api, reader["token"])
    page = api.http.get(f"/console/triggers/{t['id']}")
    assert page.status_code == 200 and buttons(page.text) == [] and 'id="actions"' not in page.text
    assert api.http.get(f"/console/triggers/{t['id']}/act/pause").status_code == 403   # not even the form
    login(api, principal(s, "reader", "author")["token"])
    assert set(buttons(api.http.get(f"/console/triggers/{t['id']}").text)) >= {"pause"}
    assert "backfill" not in buttons(api.http.get(f"/console/triggers/{t['id']}").text)
    login(api, s.token)   # every role
    shown = buttons(api.http.get(f"/console/triggers/{t['id']}").text)
    assert shown == ["pause", "run", "backfill"]
    assert SENTINEL not in api.http.get(f"/console/triggers/{t['id']}").text


def test_a_reader_posting_an_act_is_refused_audited_and_changes_nothing(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    reader = principal(s, "reader")
    csrf = login(api, reader["token"])
    before = api.snapshot()
    r = api.http.post(f"/console/triggers/{t['id']}/act/pause", data={"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 403 and "lacks the role" in r.text
    assert api.snapshot() == before
    [(actor, action)] = [row for row in audit_actions(api, tenant_id) if row[1] == "denied"]
    assert actor == reader["id"]
    [denial] = [e for e in api.store.trust.audit_rows(tenant_id=tenant_id) if e.action == "denied"]
    assert denial.as_json()["new"]["missing_role"] == "author"


def test_pause_needs_the_session_token_and_a_confirmation_then_is_the_apis_act(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    author = principal(s, "reader", "author")
    csrf = login(api, author["token"])
    url = f"/console/triggers/{t['id']}/act/pause"
    before = api.snapshot()
    confirm = api.http.get(url)     # the confirmation page changes nothing
    assert confirm.status_code == 200 and 'id="question"' in confirm.text and f'value="{csrf}"' in confirm.text
    for data, headers in (({"confirm": "yes"}, {}),                                  # no token
                          ({"csrf": "forged", "confirm": "yes"}, {}),                # a forged one
                          ({"csrf": csrf[:-2] + "xx", "confirm": "yes"}, {}),
                          ({"csrf": "é" + csrf[1:], "confirm": "yes"}, {}),                # not even ASCII
                          ({"csrf": csrf, "confirm": "yes"}, {"sec-fetch-site": "cross-site"})):
        r = api.http.post(url, data=data, headers=headers)
        assert r.status_code == 403 and "nothing changed" in r.text, r.text[:300]
    # Another session's token is no good either.
    other_csrf = login(api, s.token)
    csrf = login(api, author["token"])     # a new session: a new token
    assert other_csrf != csrf and api.http.post(url, data={"csrf": other_csrf, "confirm": "yes"}).status_code == 403
    # Without confirm=yes: the confirmation page again, nothing done.
    r = api.http.post(url, data={"csrf": csrf})
    assert r.status_code == 200 and 'id="confirm"' in r.text
    assert api.snapshot() == before
    assert api.http.post(url, data={"csrf": csrf, "confirm": "yes"}, follow_redirects=False).status_code == 303
    assert s.get(f"/v1/triggers/{t['id']}").json()["state"] == "paused"
    page = api.http.get(f"/console/triggers/{t['id']}?done=pause")
    assert 'id="done"' in page.text and buttons(page.text) == ["resume"]
    assert (author["id"], "trigger.pause") in audit_actions(api, tenant_id)
    # Pausing again: the API's own refusal (409), shown; nothing more written.
    r = api.http.post(url, data={"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 409 and "not active" in r.text
    # Resume, from the console; the API's act writes the same row.
    r = api.http.post(f"/console/triggers/{t['id']}/act/resume", data={"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 200 and r.url.path == f"/console/triggers/{t['id']}"
    assert s.get(f"/v1/triggers/{t['id']}").json()["state"] == "active"
    assert audit_actions(api, tenant_id)[-2:] == [(author["id"], "trigger.pause"), (author["id"], "trigger.resume")]
    # The API's pause writes the same audit row (actor: the token's principal).
    assert s.post(f"/v1/triggers/{t['id']}/pause").status_code == 200
    assert audit_actions(api, tenant_id)[-1][1] == "trigger.pause"


def test_run_now_commits_one_manual_fire_audited(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    csrf = login(api, s.token)
    r = api.http.post(f"/console/triggers/{t['id']}/act/run", data={"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 200 and r.url.path.startswith("/console/fires/") and 'id="done"' in r.text
    key = r.url.path.rsplit("/", 1)[1]
    fire = api.store.history.get_fire(FireKey.parse(key))
    assert fire is not None and fire.kind == FireKind.MANUAL
    [row] = [e for e in api.store.trust.audit_rows(tenant_id=tenant_id) if e.action == "trigger.run"]
    assert row.as_json()["new"]["fire_key"] == key


def test_backfill_previews_a_dry_run_then_commits_the_confirmed_window(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"], {"cron": "*/15 * * * *", "zone": "UTC"})
    csrf = login(api, s.token)
    url = f"/console/triggers/{t['id']}/act/backfill"
    form = api.http.get(url)
    assert form.status_code == 200 and 'id="backfill-preview"' in form.text
    before = api.snapshot()
    window = {"csrf": csrf, "step": "preview", "from": "2026-03-27T09:00:00Z", "to": "2026-03-27T10:00:00Z"}
    r = api.http.post(url, data=window)
    assert r.status_code == 200 and "would create <strong>4</strong>" in r.text, r.text[:2000]
    assert r.text.count("<td>create</td>") == 4
    assert api.snapshot() == before                                     # the dry run stored nothing
    bad = api.http.post(url, data={**window, "to": "tomorrow"})
    assert bad.status_code == 422 and 'id="errors"' in bad.text and api.snapshot() == before
    late = api.http.post(url, data={**window, "to": "2026-03-28T10:00:00Z"})   # after now: the API's words
    assert late.status_code == 422 and 'id="errors"' in late.text and api.snapshot() == before
    # Confirmed: the window of the preview, committed by the API's backfill with its audit row.
    r = api.http.post(url, data={**window, "step": "confirm", "confirm": "yes"})
    assert r.status_code == 200 and r.url.path == f"/console/triggers/{t['id']}" and 'id="done"' in r.text
    fires = api.store.history.history_fires(tenant_id, trigger_id=t["id"], limit=100)
    assert sorted(f.scheduled_us for f in fires if f.kind == FireKind.BACKFILL) == [
        us("2026-03-27T09:00:00Z") + i * HOUR // 4 for i in range(4)]
    [row] = [e for e in api.store.trust.audit_rows(tenant_id=tenant_id) if e.action == "trigger.backfill"]
    assert row.actor != "operator"
    # A backfill role is needed: an author is refused (audited), nothing stored.
    author = principal(s, "reader", "author")
    csrf = login(api, author["token"])
    before = api.snapshot()
    assert api.http.post(url, data={**window, "csrf": csrf}).status_code == 403
    assert api.snapshot() == before


def test_redrive_a_dead_letter_from_its_page(api: Api) -> None:
    tenant_id, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    at = us("2026-03-27T08:00:00Z")
    fire = NewFire(tenant_id, t["id"], at, 0, 1, FireKind.SCHEDULED, Lane.ON_TIME, FireState.FAILED, at + 1000,
                   TZDATA_VERSION, "node-a", cause="failed: HTTP 404 is final")
    assert api.store.timing.insert_fires([fire])
    key = str(FireKey(tenant_id, t["id"], at, 0))
    reader = principal(s, "reader")
    login(api, reader["token"])
    assert buttons(api.http.get(f"/console/fires/{key}").text) == []
    csrf = login(api, s.token)
    assert buttons(api.http.get(f"/console/fires/{key}").text) == ["redrive"]
    before = api.snapshot()
    assert api.http.get(f"/console/fires/{key}/redrive").status_code == 200
    assert api.http.post(f"/console/fires/{key}/redrive", data={"csrf": "x", "confirm": "yes"}).status_code == 403
    assert api.snapshot() == before
    r = api.http.post(f"/console/fires/{key}/redrive", data={"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 200 and 'id="done"' in r.text
    stored = api.store.history.get_fire(FireKey.parse(key))
    assert stored is not None and stored.state == FireState.PENDING
    assert audit_actions(api, tenant_id)[-1][1] == "fire.redrive"
    assert buttons(r.text) == []                          # pending now: nothing to redrive
    r = api.http.post(f"/console/fires/{key}/redrive", data={"csrf": csrf, "confirm": "yes"})
    assert r.status_code == 409 and "pending" in r.text


def test_without_a_session_an_act_goes_to_the_sign_in_page(api: Api) -> None:
    _, s = api.tenant("acme")
    t = s.trigger(s.target()["id"])
    before = api.snapshot()
    r = api.http.post(f"/console/triggers/{t['id']}/act/pause", data={"csrf": "x", "confirm": "yes"},
                      follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    assert api.snapshot() == before


def test_a_token_with_non_ascii_text_is_refused_not_an_error(api: Api) -> None:
    """The sign-in, sign-out and act forms compare tokens as bytes: ``é`` is unequal, not a 500."""
    _, s = api.tenant("acme")
    api.http.get("/console/login")
    r = api.http.post("/console/login", data={"csrf": "é", "token": s.token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login?error=expired"
    login(api, s.token)
    r = api.http.post("/console/logout", data={"csrf": "é"}, follow_redirects=False)
    assert r.status_code == 403
    assert api.http.get("/console/", follow_redirects=False).status_code == 200   # still signed in
