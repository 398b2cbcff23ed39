"""The recurrence compiler: pure evaluation of cron, interval and one-shot recurrences in IANA zones.

Compile once (:func:`compile_spec`, :func:`compile_cron`, :func:`compile_interval`,
:func:`compile_once`; several specs compile to one :class:`UnionRecurrence`; exclusion calendars by
:func:`compile_calendar`), then ask :func:`next_after` — the single definition of "when is it due",
used by the timing loop and by preview alike. No function here reads a clock or does I/O.
"""

from .calendar import Calendar, Exclusion, compile_calendar, excluded, exclusion_cause
from .dst import dst_label, dst_label_us, parse_dst_label
from .errors import NoMatchError, RecurrenceError
from .explain import explain as explain_schedule
from .instants import format_duration, format_instant, parse_duration, parse_instant
from .schedule import (
    CronRecurrence,
    IntervalRecurrence,
    Occurrence,
    OneShotRecurrence,
    Recurrence,
    SingleRecurrence,
    UnionRecurrence,
    Window,
    compile_cron,
    compile_interval,
    compile_once,
    compile_spec,
    iter_occurrences,
    next_after,
    next_occurrence,
    preview,
)
from .union import format_specs, parse_specs
from .zones import TZDATA_VERSION, load_zone, zone_names

__all__ = [
    "TZDATA_VERSION",
    "Calendar",
    "CronRecurrence",
    "Exclusion",
    "IntervalRecurrence",
    "NoMatchError",
    "Occurrence",
    "OneShotRecurrence",
    "Recurrence",
    "RecurrenceError",
    "SingleRecurrence",
    "UnionRecurrence",
    "Window",
    "compile_calendar",
    "compile_cron",
    "compile_interval",
    "compile_once",
    "compile_spec",
    "dst_label",
    "dst_label_us",
    "excluded",
    "exclusion_cause",
    "explain_schedule",
    "format_duration",
    "format_instant",
    "format_specs",
    "iter_occurrences",
    "load_zone",
    "next_after",
    "next_occurrence",
    "parse_dst_label",
    "parse_duration",
    "parse_instant",
    "parse_specs",
    "preview",
    "zone_names",
]
