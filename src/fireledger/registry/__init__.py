"""The definitions service (issue 14): create, amend, pause, resume, delete, manual run and backfill
of a trigger, each checked by one body of code and written with its audit row in one store
transaction. Above the store and security, below the surfaces (``control``, the CLI): it imports
neither. See :mod:`.service`."""

from .errors import Conflict, Invalid, LimitReached, NotFound, RegistryError
from .service import Current, Definition, Registry, definition

__all__ = ["Conflict", "Current", "Definition", "Invalid", "LimitReached", "NotFound", "Registry", "RegistryError",
           "definition"]
