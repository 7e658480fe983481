"""A lake's open connection, `Connection`: what the store's jobs (store/migrate.py, write.py, query.py,
maintain.py) run their SQL on. `Lake` holds one (store/connect.py opens it) and hands it to them, so none of them
needs the `Lake` class.
"""

from __future__ import annotations

import threading

import duckdb

from trajlake.store import extensions, objectstore
from trajlake.store.uri import CatalogURI

#: Transient errors of concurrent writers that a retry resolves.
RETRYABLE = ("conflict", "database is locked", "could not serialize", "deadlock", "busy")
MAX_RETRIES = 30


class Connection:
    """A DuckDB connection with a lake's catalog attached (as attach.ALIAS), opened on `catalog`, read-only or
    not. Safe to share between threads of one process: every statement runs on a cursor of its own."""

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog: CatalogURI, read_only: bool):
        self.con = con
        self.catalog = catalog
        self.read_only = read_only
        self._lock = threading.Lock()  # guards the base connection, which is used only to make cursors
        #: last_committed_snapshot() is per attached lake, not per cursor: no other thread may commit between
        #: a commit and reading its snapshot id
        self.commit_lock = threading.Lock()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self.con.cursor()

    def explain(self, error: Exception) -> str:
        """An error's first line; for data on object storage, with the server's reason and what to check."""
        return objectstore.explain(str(error), self.catalog.data_path)

    def close(self) -> None:
        """Close the connection and every cursor made from it; its DuckDB instance, with the extensions loaded,
        is kept for the next lake this process opens, unless it holds object storage's settings."""
        extensions.release(self.con, reuse=not self.catalog.remote)
