"""The root of every exception the fireledger package defines.

Pure: no I/O, no imports. Every project exception derives from ``FireledgerError`` so that a caller
(an entry point, an embedding application) can catch "anything fireledger refused" in one clause.
Each exception also keeps the standard base its callers catch it by (``ValueError``,
``RuntimeError``, click's ``UsageError`` ...), so deriving from the root changes no behaviour.
"""

from __future__ import annotations

__all__ = ["FireledgerError"]


class FireledgerError(Exception):
    """Base class of every exception defined in the fireledger package."""
