"""One throwaway Postgres server for the whole test session (tests/local_postgres.py), started on
first use; each test gets databases of its own.

`AGL_TEST_STORE=postgres` runs the Gateways that tests start (tests/conftest.py) on it instead of
SQLite or memory: `make test` runs the API suite once more that way. Without Postgres binaries the
tests that need them skip, and fail under CI=true.
"""

from __future__ import annotations

import atexit
import itertools
import os
from pathlib import Path

import pytest

from tests.local_postgres import LocalPostgres, find_bin_dir

_server: LocalPostgres | None = None
_names = itertools.count()
_by_path: dict[Path, str] = {}


def store_is_postgres() -> bool:
    return os.environ.get("AGL_TEST_STORE", "") == "postgres"


def require_postgres() -> None:
    if find_bin_dir() is None:
        message = "PostgreSQL server binaries are missing (Debian: apt-get install postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def server() -> LocalPostgres:
    global _server
    require_postgres()
    if _server is None:
        _server = LocalPostgres(fsync=False).start()
        atexit.register(stop)
    return _server


def stop() -> None:
    global _server
    if _server is not None:
        _server.destroy()
        _server = None


def new_database() -> str:
    """The URL of a new, empty database."""
    return server().create_database(f"t{os.getpid()}_{next(_names)}")


def database_for(path: Path) -> str:
    """The same database for the same path: a test restarting its Gateway on one store keeps it."""
    url = _by_path.get(path)
    if url is None:
        url = _by_path[path] = new_database()
    return url
