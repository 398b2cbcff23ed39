"""fireledger: a durable, multi-tenant scheduled-trigger service.

The timing plane decides; the dispatch plane delivers; the only thing crossing between them is an
immutable, deterministically keyed fire record, committed before anything is delivered.
"""

__version__ = "0.1.0"
