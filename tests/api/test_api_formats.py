"""The forms ``/openapi.json`` declares are the forms the server enforces (decision 0141).

Each pattern of :mod:`fireledger.control.formats` is compared with the server's own parser over
exhaustive or systematic inputs (a value the pattern admits is accepted by the parser, one the
parser accepts in the API's form is admitted by the pattern), the declarations are checked in the
published document, and the cursor forms are exercised end to end — the new ones page, the earlier
base64url ones are still honoured, anything else is a problem naming ``cursor``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from apikit import Api, Session, assert_problem
from fireledger.control import formats
from fireledger.domain.keys import FireKey, to_us
from fireledger.recurrence import RecurrenceError, parse_duration, parse_instant


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    a = Api(tmp_path_factory.mktemp("formats"))
    yield a
    a.close()


@pytest.fixture(scope="module")
def owner(api: Api) -> Session:
    return api.tenant("acme")[1]


def _parses_instant(text: str) -> bool:
    try:
        parse_instant(text)
    except RecurrenceError:
        return False
    return True


def test_instant_pattern_admits_exactly_the_dates_that_exist() -> None:
    pattern = re.compile(formats.INSTANT_PATTERN)
    years = [0, 1, 4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 2400, 9996, 9999]
    checked = 0
    for year in years:
        for month in range(14):
            for day in range(33):
                text = f"{year:04d}-{month:02d}-{day:02d}T12:00:00Z"
                assert bool(pattern.match(text)) == _parses_instant(text), text
                checked += 1
    assert checked == len(years) * 14 * 33


@pytest.mark.parametrize(("text", "admitted"), [
    ("2026-03-29T01:30:00Z", True), ("2026-03-29t01:30:00z", True), ("2026-03-29T01:30:00.123456789+14:00", True),
    ("2026-03-29T23:59:59-23:59", True), ("2026-03-29T24:00:00Z", False), ("2026-03-29T12:60:00Z", False),
    ("2026-03-29T12:00:60Z", False), ("2026-03-29T12:00:00", False), ("2026-03-29T12:00:00+24:00", False),
    ("2026-03-29T12:00:00.Z", False), ("2026-03-29T12:00:00.1234567890Z", False), ("２０２６-03-29T12:00:00Z", False),
])
def test_instant_pattern_times_and_offsets(text: str, admitted: bool) -> None:
    assert bool(re.match(formats.INSTANT_PATTERN, text)) == admitted
    if admitted:
        assert _parses_instant(text)


def test_instant_pattern_leaves_only_the_calendar_edges_to_the_server() -> None:
    """The one admitted form the parser refuses: a UTC value outside years 0001-9999."""
    for text in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:30:00-01:00"):
        assert re.match(formats.INSTANT_PATTERN, text)
        assert not _parses_instant(text)


@pytest.mark.parametrize("text", ["90s", "15m", "1h30m", "500ms", "2d", "0s", "1d2h3m4s5ms", "007s"])
def test_duration_pattern_admits_what_the_parser_reads(text: str) -> None:
    assert re.match(formats.DURATION_PATTERN, text)
    assert parse_duration(text) >= timedelta(0)


@pytest.mark.parametrize("text", ["", "90", "s", "1.5s", "-1s", "1 s", "1hh", "1w", "ninety", "1h 30m", "٥s", " 1s"])
def test_duration_pattern_refuses_what_is_not_one(text: str) -> None:
    assert not re.match(formats.DURATION_PATTERN, text)


def test_fire_key_pattern_matches_the_key_parser() -> None:
    pattern = re.compile(formats.FIRE_KEY_PATTERN)
    key = FireKey("t_1", "tr_2", to_us(datetime(2024, 2, 29, 23, 59, 59, 5, tzinfo=UTC)), 3)
    assert pattern.match(str(key)) and FireKey.parse(str(key)) == key
    for bad in ("t.tr.20230229T000000Z.0", "t.tr.20240230T000000Z.0", "t.tr.20240101T240000Z.0",
                "t.tr.00000101T000000Z.0", "t.tr.20240101T000000.0", "t..20240101T000000Z.0"):
        assert not pattern.match(bad), bad
        with pytest.raises(ValueError):
            FireKey.parse(bad)


def _param(doc: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    return next(p for p in doc["paths"][path][method]["parameters"] if p["name"] == name)


def _string_schema(param: dict[str, Any]) -> dict[str, Any]:
    """The string branch of an optional parameter, with top-level keywords beside ``anyOf`` merged in."""
    schema = param["schema"]
    branch = next((s for s in schema.get("anyOf", [schema]) if s.get("type") == "string"), {})
    return {**{k: v for k, v in schema.items() if k != "anyOf"}, **branch}


def test_the_document_declares_the_forms(api: Api) -> None:
    doc = api.app.openapi()
    comps = doc["components"]["schemas"]
    for path in ("/v1/fires", "/v1/triggers/{trigger_id}/fires"):
        frm = _string_schema(_param(doc, path, "get", "from"))
        assert frm["pattern"] == formats.INSTANT_PATTERN and frm["format"] == "date-time"
        assert _string_schema(_param(doc, path, "get", "state"))["pattern"] == formats.STATE_LIST_PATTERN
    assert _string_schema(_param(doc, "/v1/fires", "get", "cursor"))["pattern"] == formats.TENANT_CURSOR_PATTERN
    assert _string_schema(_param(doc, "/v1/targets", "get", "cursor"))["pattern"] == formats.ID_CURSOR_PATTERN
    assert _string_schema(_param(doc, "/v1/audit", "get", "cursor"))["pattern"] == formats.SEQ_CURSOR_PATTERN
    horizon = comps["TriggerCreate"]["properties"]["catchup_horizon"]
    assert horizon["pattern"] == formats.DURATION_PATTERN
    assert horizon["x-fireledger-duration"] == {"minimum": "0s", "maximum": "1d", "whole_seconds": True}
    assert comps["PrincipalCreate"]["properties"]["roles"]["uniqueItems"] is True
    assert comps["PolicyPatch"]["minProperties"] == 1 and comps["TriggerPatch"]["minProperties"] == 1
    assert comps["TargetCreate"]["properties"]["kind"]["enum"] == ["http", "queue", "internal"]
    assert [b["properties"]["kind"]["const"] for b in comps["TargetCreate"]["oneOf"]] == ["http", "queue", "internal"]
    schedule = comps["TriggerCreate"]["properties"]["schedule"]
    # cron | every | at | several specs (decision 0155: the union form names none of the single forms' keys)
    assert schedule["additionalProperties"] is False and len(schedule["oneOf"]) == 4
    assert schedule["oneOf"][3]["required"] == ["specs"]
    ack = comps["AckRequest"]["properties"]["fire_keys"]["items"]
    assert ack["pattern"] == formats.FIRE_KEY_PATTERN


@pytest.mark.parametrize(("params", "field", "problem"), [
    ({"from": "2026-03-29 01:30:00Z"}, "from", formats.INSTANT_HINT),
    ({"to": "2026-02-30T00:00:00Z"}, "to", formats.INSTANT_HINT),
    ({"state": "delivered, failed"}, "state", formats.STATE_LIST_HINT),
    ({"state": "delivered,"}, "state", formats.STATE_LIST_HINT),
    ({"from": "0001-01-01T00:00:00+01:00"}, "from", "must be an instant within the years 0001-9999 in UTC"),
    ({"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "to", "must be later than `from`"),
])
def test_refusals_name_the_field_and_the_form(owner: Session, params: dict[str, str], field: str,
                                              problem: str) -> None:
    body = assert_problem(owner.get("/v1/fires", params=params), 422, field)
    assert any(e["field"] == field and e["problem"] == problem for e in body["errors"]), body
    assert all(v not in body["detail"] for k, v in params.items() if k != "state")   # input not echoed


def test_a_duration_in_the_wrong_form_names_the_field(owner: Session) -> None:
    tg = owner.target()
    t = owner.trigger(tg["id"])
    body = assert_problem(owner.patch(f"/v1/triggers/{t['id']}", json={"timeout": " 30s"}), 422, "timeout")
    assert body["errors"][0]["problem"] == formats.DURATION_HINT
    body = assert_problem(owner.patch(f"/v1/triggers/{t['id']}", json={"timeout": "16m"}), 422, "timeout")
    assert "longer than the maximum" in body["errors"][0]["problem"]


def _legacy(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def test_cursors_page_in_the_declared_form_and_legacy_ones_are_honoured(owner: Session) -> None:
    targets = [owner.target(f"https://page{i}.example.com/")["id"] for i in range(3)]
    first = owner.get("/v1/targets", params={"limit": 1}).json()
    assert re.match(formats.ID_CURSOR_PATTERN, first["next"])
    new = owner.get("/v1/targets", params={"limit": 100, "cursor": first["next"]}).json()
    legacy = owner.get("/v1/targets", params={"limit": 100, "cursor": _legacy("i:" + first["items"][0]["id"])}).json()
    assert [t["id"] for t in new["items"]] == [t["id"] for t in legacy["items"]]
    assert set(targets) <= {first["items"][0]["id"], *(t["id"] for t in new["items"])}


def test_fire_cursors_page_in_the_declared_form(api: Api, owner: Session) -> None:
    tg = owner.target("https://fires.example.com/")
    t = owner.trigger(tg["id"])
    keys = []
    for _ in range(3):
        keys.append(owner.post(f"/v1/triggers/{t['id']}/run").json()["key"])
        api.clock.advance(1_000_000)
    seen: list[str] = []
    for path, pattern in ((f"/v1/triggers/{t['id']}/fires", formats.FIRE_CURSOR_PATTERN),
                          ("/v1/fires", formats.TENANT_CURSOR_PATTERN)):
        got: list[str] = []
        page = owner.get(path, params={"limit": 1, "trigger_id": t["id"]} if path == "/v1/fires"
                         else {"limit": 1}).json()
        while True:
            got += [f["key"] for f in page["items"]]
            if not page["next"]:
                break
            assert re.match(pattern, page["next"]), page["next"]
            params = {"limit": 1, "cursor": page["next"]}
            if path == "/v1/fires":
                params["trigger_id"] = t["id"]
            page = owner.get(path, params=params).json()
        assert sorted(got) == sorted(keys)
        seen += got
    assert len(seen) == 6


@pytest.mark.parametrize(("path", "cursor"), [
    ("/v1/targets", "i."), ("/v1/targets", "i.a.b"), ("/v1/targets", "f.1.2"), ("/v1/audit", "i.abc"),
    ("/v1/audit", "i." + "9" * 19), ("/v1/fires", "g.1.tr_x"), ("/v1/fires", "f.1.2"), ("/v1/fires", _legacy("g:x")),
])
def test_other_cursors_are_problems_naming_cursor(owner: Session, path: str, cursor: str) -> None:
    body = assert_problem(owner.get(path, params={"cursor": cursor}), 422, "cursor")
    assert body["errors"][0]["problem"] == formats.CURSOR_HINT
