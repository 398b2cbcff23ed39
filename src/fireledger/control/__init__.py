"""The control plane: the HTTP API (management, history), authn/authz.

``create_app`` is imported lazily so operator commands (``fireledger tenant create``) do not pay
for importing the web framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
