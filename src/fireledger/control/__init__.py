"""The control plane: the HTTP API (management, history), authn/authz."""

from .app import create_app
from .partition import partition_of

__all__ = ["create_app", "partition_of"]
