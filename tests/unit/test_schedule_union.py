"""Several specs per trigger (decision 0155): the compiled union, pure.

Properties (hypothesis): the union's next instant is the minimum of its members' next instants; its
instants are strictly increasing with no duplicates; the integer next function the timing loop uses
equals the datetime one; the specs a fire records are exactly the members whose instants include it.
Examples: the single-spec form is unchanged on the wire, errors name ``schedule.specs[i].<field>``, a
member keeps its own DST rules, the union's window bounds every member.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fireledger.definitions import matched_fn, next_fn, next_us
from fireledger.domain.keys import to_us
from fireledger.recurrence import (
    NoMatchError,
    RecurrenceError,
    UnionRecurrence,
    compile_spec,
    next_after,
    preview,
)
from fireledger.registry.checks import compile_schedule, schedule_error

ANCHOR = "2026-01-01T00:00:00Z"
CRONS = ["0 9 * * *", "*/15 * * * *", "30 2 * * *", "0 0 1 * *", "0 */6 * * 1-5", "45 1 * * 0", "0 12 25 12 *"]
ZONES = ["UTC", "Europe/London", "America/New_York", "Australia/Lord_Howe"]
EVERY = ["15m", "1h", "90m", "7h", "1d"]

member = st.one_of(
    st.builds(lambda c, z: {"cron": c, "zone": z}, st.sampled_from(CRONS), st.sampled_from(ZONES)),
    st.builds(lambda e, k: {"every": e, "anchor": (datetime(2026, 1, 1, tzinfo=UTC)
                                                    + timedelta(minutes=7 * k)).strftime("%Y-%m-%dT%H:%M:%SZ")},
              st.sampled_from(EVERY), st.integers(0, 200)),
    st.builds(lambda d: {"at": (datetime(2026, 3, 1, tzinfo=UTC) + timedelta(minutes=15 * d))
                         .strftime("%Y-%m-%dT%H:%M:%SZ")}, st.integers(0, 4000)),
)
afters = st.integers(0, 300 * 24 * 3600).map(lambda s: datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=s))


@settings(max_examples=150, deadline=None)
@given(st.lists(member, min_size=1, max_size=4), afters)
def test_union_next_is_the_minimum_of_its_members(specs: list[dict[str, str]], after: datetime) -> None:
    union = compile_spec({"specs": specs})
    assert isinstance(union, UnionRecurrence)
    members = [compile_spec(s) for s in specs]
    nexts = [next_after(m, after) for m in members]
    want = min((n for n in nexts if n is not None), default=None)
    assert next_after(union, after) == want
    # The timing loop's integer function agrees, and the matched specs are exactly those on it.
    assert next_fn(union)(to_us(after)) == (None if want is None else to_us(want))
    assert next_us(union, to_us(after)) == (None if want is None else to_us(want))
    if want is not None:
        matched = matched_fn(union)
        assert matched is not None
        assert matched(to_us(want)) == tuple(i for i, n in enumerate(nexts) if n == want)


@settings(max_examples=60, deadline=None)
@given(st.lists(member, min_size=2, max_size=4), afters)
def test_union_instants_strictly_increase_without_duplicates(specs: list[dict[str, str]], after: datetime) -> None:
    union = compile_spec({"specs": specs})
    occs = preview(union, after, 40)
    instants = [o.instant for o in occs]
    assert all(a < b for a, b in itertools.pairwise(instants)), instants
    assert len(set(instants)) == len(instants)
    assert all(o.specs for o in occs)   # every instant names the spec(s) that produced it
    # Every member instant in the covered span is in the union (nothing lost by the dedup).
    if occs:
        for spec in specs:
            m = compile_spec(spec)
            for o in preview(m, after, 40):
                if o.instant <= instants[-1]:
                    assert o.instant in instants


def test_a_shared_instant_is_one_instant_naming_both_specs() -> None:
    union = compile_spec({"specs": [{"cron": "0 9 * * *", "zone": "UTC"},
                                    {"every": "1h", "anchor": ANCHOR}]})
    occs = preview(union, datetime(2026, 3, 2, 7, 30, tzinfo=UTC), 3)
    assert [(o.instant.hour, o.specs) for o in occs] == [(8, (1,)), (9, (0, 1)), (10, (1,))]


def test_the_single_spec_form_is_unchanged_on_the_wire() -> None:
    rec = compile_spec({"cron": "0 9 * * 1-5", "zone": "Europe/Paris"})
    assert rec.spec() == {"cron": "0 0 9 * * 1-5", "zone": "Europe/Paris"}
    assert not isinstance(rec, UnionRecurrence) and matched_fn(rec) is None


def test_the_union_round_trips_normalised() -> None:
    body = {"specs": [{"cron": "0 9 * * *", "zone": "Europe/London"}, {"every": "90m"}],
            "not_after": "2027-01-01T00:00:00Z", "calendars": ["holidays"]}
    rec = compile_spec(body, default_anchor=datetime(2026, 1, 1, tzinfo=UTC))
    spec = rec.spec()
    assert spec["specs"][1] == {"every": "1h30m", "anchor": ANCHOR, "zone": "UTC"}
    assert spec["calendars"] == ["holidays"] and spec["not_after"] == "2027-01-01T00:00:00Z"
    assert compile_spec(spec).spec() == spec


def test_each_member_keeps_its_own_dst_rules() -> None:
    # 01:30 does not exist in London on 2026-03-29: that member fires at the jump (01:00 UTC), noted "gap".
    union = compile_spec({"specs": [{"cron": "30 1 * * *", "zone": "Europe/London"},
                                    {"cron": "0 3 * * *", "zone": "UTC"}]})
    occs = preview(union, datetime(2026, 3, 29, 0, 0, tzinfo=UTC), 2)
    assert [(o.instant, o.note, o.specs) for o in occs] == [
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), "gap", (0,)),
        (datetime(2026, 3, 29, 3, 0, tzinfo=UTC), None, (1,))]


def test_the_union_window_bounds_every_member() -> None:
    union = compile_spec({"specs": [{"every": "1h", "anchor": ANCHOR}, {"cron": "30 * * * *"}],
                          "not_before": "2026-02-01T00:00:00Z", "not_after": "2026-02-01T02:00:00Z"})
    got = [o.instant for o in preview(union, datetime(2026, 1, 1, tzinfo=UTC), 10)]
    assert [t.strftime("%H:%M") for t in got] == ["00:00", "00:30", "01:00", "01:30", "02:00"]
    f = next_fn(union)
    assert f(to_us(got[-1])) is None


@pytest.mark.parametrize(("schedule", "field"), [
    ({"specs": [{"cron": "0 9 * * *"}, {"cron": "0 61 * * *"}]}, "schedule.specs[1].cron"),
    ({"specs": [{"cron": "0 9 * * *", "zone": "Mars/Base"}]}, "schedule.specs[0].zone"),
    ({"specs": [{"every": "0s"}]}, "schedule.specs[0].every"),
    ({"specs": [{"at": "tomorrow"}]}, "schedule.specs[0].at"),
    ({"specs": [{"cron": "0 9 * * *", "every": "1h"}]}, "schedule.specs[0]"),
    ({"specs": [{"cron": "0 9 * * *", "calendars": ["x"]}]}, "schedule.specs[0].calendars"),
    ({"specs": [{"specs": []}]}, "schedule.specs[0].specs"),
    ({"specs": []}, "schedule.specs"),
    ({"specs": [{"cron": "0 9 * * *"}] * 17}, "schedule.specs"),
    ({"specs": [{"cron": "0 9 * * *"}], "zone": "UTC"}, "schedule.zone"),
    ({"specs": "0 9 * * *"}, "schedule.specs"),
    ({"specs": [3]}, "schedule.specs[0]"),
    ({"cron": "0 9 * * *", "calendars": "holidays"}, "schedule.calendars"),
    ({"cron": "0 9 * * *", "calendars": ["ok", "-bad"]}, "schedule.calendars[1]"),
    ({"cron": "0 9 * * *", "calendars": ["a", "a"]}, "schedule.calendars[1]"),
])
def test_problems_name_the_field(schedule: dict[str, object], field: str) -> None:
    errors: list[tuple[str, str]] = []
    assert compile_schedule(schedule, to_us(datetime(2026, 1, 1, tzinfo=UTC)), errors) is None
    assert [f for f, _ in errors] == [field], errors


def test_a_member_that_never_matches_is_the_same_distinct_error() -> None:
    with pytest.raises(NoMatchError) as exc:
        compile_spec({"specs": [{"cron": "0 9 * * *"}, {"cron": "0 0 30 2 *"}]})
    assert schedule_error(exc.value)[0] == "schedule.specs[1].cron"


def test_member_string_fields_are_checked_per_spec() -> None:
    errors: list[tuple[str, str]] = []
    compile_schedule({"specs": [{"cron": 5}, {"anchor": ANCHOR, "cron": "0 9 * * *"}]}, 0, errors)
    assert errors == [("schedule.specs[0].cron", "must be a string"),
                      ("schedule.specs[1].anchor", "applies only to an interval schedule (every)")]


def test_an_exhausted_member_leaves_the_others() -> None:
    union = compile_spec({"specs": [{"at": "2026-03-01T10:00:00Z"}, {"cron": "0 12 * * *"}]})
    after = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    got = [(o.instant.day, o.instant.hour, o.specs) for o in preview(union, after, 3)]
    assert got == [(1, 10, (0,)), (1, 12, (1,)), (2, 12, (1,))]
    only_past = compile_spec({"specs": [{"at": "2026-03-01T10:00:00Z"}]})
    assert next_after(only_past, after + timedelta(hours=2)) is None
    with pytest.raises(RecurrenceError):
        compile_spec({"specs": [{"cron": "0 9 * * *", "not_before": "2026-02-01T00:00:00Z",
                                 "not_after": "2026-01-01T00:00:00Z"}]})
