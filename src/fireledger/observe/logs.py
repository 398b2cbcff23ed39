"""Structured JSON logs: one object per line, carrying fire keys and never payloads.

A line has ``ts``, ``level``, ``logger``, ``msg`` and, when the call passes them through ``extra``,
only the whitelisted evidence fields below (identifiers, states, numbers) — so nothing else a caller
attaches, a payload included, can reach a log line. Exceptions are reduced to their last line.

Log an attempt's outcome with :func:`attempt_fields`::

    log.info("attempt %s", res.outcome, extra=attempt_fields(key, job.attempt, res.outcome, ...))
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: The only ``extra`` attributes a log line may carry (never a payload, a token or a URL query).
FIELDS = ("fire_key", "trigger_id", "tenant_id", "node", "lane", "state", "attempt", "result", "http_status",
          "duration_s", "lateness_s", "cause", "partition")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k in FIELDS:
            v = getattr(record, k, None)
            if v is not None:
                out[k] = v if isinstance(v, int | float | bool) else str(v)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(out)


def attempt_fields(fire_key: str, attempt: int, result: str, *, trigger_id: str | None = None,
                   lane: str | None = None, http_status: int | None = None, duration_s: float | None = None,
                   lateness_s: float | None = None, state: str | None = None) -> dict[str, Any]:
    """``extra`` for the log line of one attempt's outcome (identifiers and numbers only)."""
    return {"fire_key": fire_key, "attempt": attempt, "result": result, "trigger_id": trigger_id, "lane": lane,
            "http_status": http_status, "duration_s": duration_s, "lateness_s": lateness_s, "state": state}


def setup(level: str = "info") -> None:
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("uvicorn.access").setLevel("WARNING")


__all__ = ["FIELDS", "JsonFormatter", "attempt_fields", "setup"]
