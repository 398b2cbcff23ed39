"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgserver import PgServer, pg_server_from_env


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL server for the whole run (``FIRELEDGER_TEST_PG_URL`` or a throwaway one).

    ``pg_server.url`` is an admin URL; ``pg_server.new_database()`` gives each test its own empty
    database.
    """
    with pg_server_from_env() as server:
        yield server
