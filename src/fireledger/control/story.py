"""The story of one fire (``fireledger why``, the console's fire page): what was decided, when, by
whom, under which clock evidence, each attempt with its outcome, and the cause explained in words.
Read only, never a payload (DESIGN.md invariants 11, 14). Split from :mod:`.history`, which re-exports
:func:`fire_story` and :func:`explain_cause`.
"""

from __future__ import annotations

from datetime import timedelta

from fireledger.domain.keys import FireKey, from_us
from fireledger.domain.model import Fire, FireKind, Trigger, TriggerVersion
from fireledger.recurrence import RecurrenceError, format_instant, load_zone, parse_dst_label
from fireledger.security.targets import LAPSED
from fireledger.store.deadletter import delivery_policies


def _secs(us: int) -> str:
    s = us / 1e6
    if abs(s) < 1:
        return f"{s * 1000:.1f} ms"
    if abs(s) < 120:
        return f"{s:.2f} s"
    return str(timedelta(seconds=round(s)))


def _when(us: int | None) -> str | None:
    return None if us is None else format_instant(from_us(us))


#: Lateness below this is "on time" in the story (the seed's p50 punctuality target is 1 s).
ON_TIME_US = 1_000_000

_CAUSE_EXPLAINED = (
    ("skipped: excluded by calendar", "An exclusion calendar the trigger names (schedule.calendars) "
                                      "excludes this instant, so it was recorded and never dispatched "
                                      "(GET /v1/calendars/{name} shows the entry)."),
    ("expired:", "It was missed (the scheduler could not decide it in time: an outage, a stalled timing "
                 "plane or a pause) and was older than the trigger's catch-up horizon when it was finally "
                 "decided, so it was recorded and never dispatched."),
    ("skipped: missed; fire-once-now", "It was missed; the missed-fire policy fire-once-now dispatches only "
                                       "the most recent missed instant within the horizon."),
    ("skipped: missed; missed-fire policy is skip", "It was missed; the policy skip dispatches no missed "
                                                    "instant."),
    ("range:", "Many missed instants were recorded as one range record to keep the ledger bounded."),
    ("skipped: overlap policy skip", "The overlap policy skip withheld it: the trigger's previous fire had not "
                                     "finished (no work outcome, not failed, and its outcome window not over)."),
    ("held: overlap policy queue", "The overlap policy queue holds it (committed, not dispatched) until the "
                                   "previous fire finishes; a newer instant would replace it."),
    ("superseded: overlap policy queue", "The overlap policy queue holds at most one pending fire: a newer "
                                         "instant replaced this one while the previous fire was still running."),
    ("overlap: released from hold", "It was held by the overlap policy queue and released once the previous "
                                    "fire finished, or, with no outcome, once its outcome window ended (then "
                                    "counted as finished)."),
    ("overlap: previous fire", "The previous fire reported no work outcome by the end of its outcome window: "
                               "the overlap policy counted it as finished and let this fire go (seed ADR-12), "
                               "so the two may have run at the same time."),
    ("overlap", "The overlap policy withheld it because the previous fire had not finished."),
    ("failed: HTTP", "The target answered with a final (non-retryable) status."),
    (f"not sent: {LAPSED}", "The target's ownership verification lapsed (it was not renewed before its expiry), "
                            "so the attempt was not sent; verify the target again to resume delivery."),
    ("failed: retries exhausted", "Every attempt failed with a retryable error and no attempt was left "
                                  "(the retry policy's max_attempts)."),
    ("failed: retries truncated at the trigger's next instant",
     "Every attempt failed with a retryable error and the next retry would have reached the trigger's next "
     "instant: a fire never retries into the next one."),
    ("failed: retries ended by retry.max_event_age",
     "Every attempt failed with a retryable error and the next retry would have come later than the retry "
     "policy's max_event_age allows."),
    ("unknown:", "The target did not answer before the attempt deadline and no attempt was left: the work "
                 "may or may not have run."),
)


def explain_cause(cause: str | None) -> str | None:
    """A sentence explaining a recorded cause (None when the cause is unknown to this version)."""
    if not cause:
        return None
    for prefix, text in _CAUSE_EXPLAINED:   # the cause's own head first (a note may follow it)
        if cause.startswith(prefix):
            return text
    for prefix, text in _CAUSE_EXPLAINED:
        if prefix in cause:
            return text
    return None


def _dst_line(f: Fire, version: TriggerVersion | None) -> str | None:
    """The story's DST sentence of a labelled fire (decision 0160); None when it has no label."""
    label = parse_dst_label(f.dst)
    if label is None:
        return None
    zone = f" in {version.schedule.get('zone') or 'UTC'}" if version is not None else ""
    if label["kind"] == "gap":
        return (f"DST gap: the wall time asked for, {label['wall']}{zone}, does not exist (the clocks jumped "
                "over it); it fired at the instant the clock jumped")
    return (f"DST fold: the wall time asked for, {label['wall']}{zone}, occurred twice (the clocks went back); "
            "this is its first occurrence, the second is not fired")


def fire_story(fire: Fire, trigger: Trigger | None = None, version: TriggerVersion | None = None,
               *, now_us: int | None = None) -> list[tuple[str | None, str]]:
    """The story of one fire as (instant, sentence) lines, oldest first: when it was due, who decided
    it and when, every attempt, and why it was late, skipped or expired. Never the payload."""
    f = fire
    lines: list[tuple[str | None, str]] = []
    sched = f"scheduled for {_when(f.scheduled_us)}"
    if version is not None:
        first = (version.schedule.get("specs") or [version.schedule])[0]
        zone_name = str(first.get("zone") or "UTC")
        try:
            wall = from_us(f.scheduled_us).astimezone(load_zone(zone_name)).strftime("%Y-%m-%d %H:%M:%S %Z")
            sched += f" ({wall} in {zone_name})"
        except RecurrenceError:
            pass
    name = f" of trigger {trigger.name!r}" if trigger is not None else ""
    lines.append((_when(f.scheduled_us), f"{sched}: instant{name}, definition version {f.version}, "
                                         f"tzdata {f.tzdata_version}, kind {f.kind}, seq {f.seq}"))
    dst = _dst_line(f, version)
    if dst:
        lines.append((None, dst))
    if f.specs:
        lines.append((None, f"produced by schedule.specs {f.specs.replace(',', ', ')}: one fire for the instant "
                            "whichever of the specs produced it"))
    decided_late = f.decided_us - f.scheduled_us
    note = f.cause[f.cause.index("overlap:"):] if f.cause and "overlap:" in f.cause else None
    released = note is not None and note.startswith("overlap: released from hold")
    as_state = f.state if f.state in ("expired", "skipped", "held") else ("held" if released else "pending")
    bound = ("clock bound not recorded" if f.eps_us is None
             else f"clock bound ε = {_secs(f.eps_us)} ({f.eps_source or 'source not recorded'})")
    lines.append((_when(f.decided_us), f"decided by node {f.decided_by}, {_secs(decided_late)} after the "
                                       f"scheduled instant, into the {f.lane} lane, as {as_state}; {bound}"))
    if f.kind == "catch-up" and f.state not in ("expired", "skipped"):
        lines.append((None, "caught up after it was missed: it keeps its original scheduled instant"))
    if f.state in ("expired", "skipped"):
        lines.append((None, f"not dispatched: {f.cause}"))
        why = explain_cause(f.cause)
        if why:
            lines.append((None, why))
    elif f.state == "held":
        lines.append((None, f"held, not dispatched yet: {f.cause}"))
        why = explain_cause(f.cause)
        if why:
            lines.append((None, why))
    elif note is not None:
        lines.append((None, f"overlap decision: {note}"))
        why = explain_cause(note)
        if why:
            lines.append((None, why))
    lines.extend(_attempt_lines(f, version))
    lines.extend((None, f"warning: {w}") for w in fire_warnings(f))
    if f.dispatched_us is not None:
        late = f.dispatched_us - f.scheduled_us
        if late <= ON_TIME_US:
            lines.append((None, f"first dispatched {_secs(late)} after the scheduled instant: on time"))
        else:
            parts = []
            if decided_late > ON_TIME_US:
                parts.append(f"the timing plane decided it {_secs(decided_late)} late (no timing process was "
                             "running, it was shedding on a wide clock bound, or it was behind)")
            waited = f.dispatched_us - f.decided_us
            if waited > ON_TIME_US:
                parts.append(f"it waited {_secs(waited)} in the {f.lane} lane for the dispatch plane (backlog, "
                             "rate limits, jitter, or no dispatch process was running)")
            lines.append((None, f"first dispatched {_secs(late)} late: " + ("; ".join(parts) or "see above")))
    elif f.state == "pending" and f.next_attempt_us is not None:
        age = "" if now_us is None else f" ({_secs(max(0, now_us - f.next_attempt_us))} ago)"
        lines.append((None, f"waiting for its first attempt, due at {_when(f.next_attempt_us)}{age}"))
    if f.state in ("delivered", "failed", "unknown"):
        tail = f": {f.cause}" if f.cause else ""
        lines.append((_when(f.finished_us), f"ended {f.state}{tail}"))
        why = explain_cause(f.cause) if f.state != "delivered" else None
        if why:
            lines.append((None, why))
    elif f.state == "pending" and f.attempt_list:
        lines.append((None, f"waiting for attempt {f.attempts + 1} at {_when(f.next_attempt_us)}"))
    return lines


def _attempt_lines(f: Fire, version: TriggerVersion | None) -> list[tuple[str | None, str]]:
    """The attempts of a fire, the redrive before the attempts it made (decision 0148), and the retry
    policy its attempts followed (decision 0147)."""
    lines: list[tuple[str | None, str]] = []
    for a in f.attempt_list:
        if f.redriven_us is not None and a.number == f.attempt_base + 1:
            lines.append((_when(f.redriven_us), f"redriven after {f.attempt_base} attempts: a further attempt "
                                                "under the same key, with the retry policy counted afresh"))
        took = "" if a.finished_us is None else f" after {_secs(a.finished_us - a.started_us)}"
        status = f" (HTTP {a.http_status})" if a.http_status is not None else ""
        result = a.result or "still running"
        err = f"; error: {a.error}" if a.error else ""
        lines.append((_when(a.started_us), f"attempt {a.number} on node {a.node}: {result}{status}{took}{err}"))
    if f.redriven_us is not None and f.attempts == f.attempt_base:
        lines.append((_when(f.redriven_us), f"redriven after {f.attempt_base} attempts: waiting for a further "
                                            "attempt under the same key"))
    if version is not None and f.attempt_list:
        # A dead-letter delivery retries under the default policy, not its trigger's (decision 0178).
        dl = f.kind == FireKind.DEAD_LETTER
        p = delivery_policies(version.policies) if dl else version.policies
        age = ("no event-age bound" if p.max_event_age_s is None
               else f"event age at most {_secs(p.max_event_age_s * 1_000_000)}")
        lo, hi = _secs(int(p.min_backoff_s * 1_000_000)), _secs(int(p.max_backoff_s * 1_000_000))
        whose, end = ((f"a dead-letter delivery (the default, not version {version.version}'s)",
                       "not bounded by the trigger's next instant") if dl
                      else (f"version {version.version}", "never past the next instant"))
        lines.append((None, f"retry policy of {whose}: {p.max_attempts} attempts, backoff {lo} doubling to {hi}, "
                            f"{age}, {end}"))
    return lines


def fire_key(f: Fire) -> str:
    return str(FireKey(f.tenant_id, f.trigger_id, f.scheduled_us, f.seq))


def fire_warnings(f: Fire) -> list[str]:
    """The warnings of a fire's history: each attempt refused because its target's verification lapsed
    (the refusal starts ``not sent: target verification lapsed``, :data:`~fireledger.security.targets.LAPSED`)."""
    return [f"attempt {a.number} was not sent: the target's ownership verification had lapsed; verify the "
            f"target again (POST /v1/targets/{{id}}/verify) to resume delivery ({a.error})"
            for a in f.attempt_list if a.error and LAPSED in a.error]


__all__ = ["ON_TIME_US", "explain_cause", "fire_key", "fire_story", "fire_warnings"]
