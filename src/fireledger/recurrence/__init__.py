"""The recurrence compiler: pure evaluation of cron, interval and one-shot recurrences in IANA zones.

Compile once (:func:`compile_spec`, :func:`compile_cron`, :func:`compile_interval`,
:func:`compile_once`), then ask :func:`next_after` — the single definition of "when is it due",
used by the timing loop and by preview alike. No function here reads a clock or does I/O.
"""

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
from .zones import TZDATA_VERSION, load_zone, zone_names

__all__ = [
    "TZDATA_VERSION",
    "CronRecurrence",
    "IntervalRecurrence",
    "NoMatchError",
    "Occurrence",
    "OneShotRecurrence",
    "Recurrence",
    "RecurrenceError",
    "Window",
    "compile_cron",
    "compile_interval",
    "compile_once",
    "compile_spec",
    "dst_label",
    "dst_label_us",
    "explain_schedule",
    "format_duration",
    "format_instant",
    "iter_occurrences",
    "load_zone",
    "next_after",
    "next_occurrence",
    "parse_dst_label",
    "parse_duration",
    "parse_instant",
    "preview",
    "zone_names",
]
