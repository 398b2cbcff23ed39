"""The timing plane: decides fires and commits them before anything is delivered.

``TimingLoop`` (one node's scan/plan/commit cycle), ``LeaseManager`` (partition leases across nodes),
``ShadowRebuilder`` (continuous comparison of the due index with the registry), ``TimingNode`` (what
a process runs: all of them together). Imported lazily, so the CLI's ``due-index`` and
``partitions`` commands start without loading the planes.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "LeaseManager": "leases", "LeaseSettings": "leases", "Ownership": "leases",
    "TickResult": "loop", "TimingLoop": "loop",
    "TimingNode": "node",
    "ShadowRebuilder": "shadow",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'fireledger.timing' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{mod}"), name)


__all__ = ["LeaseManager", "LeaseSettings", "Ownership", "ShadowRebuilder", "TickResult", "TimingLoop",
           "TimingNode"]
