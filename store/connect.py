"""Opening a lake's connection: the catalog URI parsed and prepared (or, read-only, checked to exist), a
DuckDB connection with the catalog's extensions, object storage configured, and the catalog attached, retrying the
races of processes that open one new lake at once. `Lake.open` is the entry point; the attach itself and what its
errors mean are store/attach.py, the tables it then brings up to date store/migrate.py.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

from trajlake.core.errors import CatalogError
from trajlake.store import extensions, objectstore
from trajlake.store.attach import _attach
from trajlake.store.connection import MAX_RETRIES, RETRYABLE
from trajlake.store.uri import CatalogURI, parse_uri

#: Errors of concurrent first opens, which create the same schema and tables, that a retry resolves (besides
#: those of concurrent writers).
RACES = (*RETRYABLE, "already exists", "duplicate key value")

T = TypeVar("T")


def retrying_races(action: Callable[[], T], errors: type[Exception]) -> T:
    """`action()`, tried again (up to MAX_RETRIES times, after a short random wait) while it raises one of
    `errors` whose text names a race of concurrent opens (RACES); any other error is raised at once."""
    for attempt in range(MAX_RETRIES):
        try:
            return action()
        except errors as e:
            if attempt + 1 == MAX_RETRIES or not any(s in str(e).lower() for s in RACES):
                raise
            time.sleep(0.05 * (1 + random.random()))
    raise AssertionError("unreachable")


def open_connection(uri: str | None, *, read_only: bool) -> tuple[duckdb.DuckDBPyConnection, CatalogURI]:
    """A connection with the lake at `uri` attached, and the catalog URI as opened (see `attach._attach`).

    Read-only: a missing lake is a CatalogError and the catalog is attached read-only; otherwise a new lake's
    folder or database is prepared first. The connection is closed again when attaching fails."""
    catalog = parse_uri(uri)
    if read_only:
        why = catalog.missing()
        if why:
            raise CatalogError(f"cannot open lake {catalog.raw}: {why}")
    else:
        catalog.prepare()
    con = extensions.acquire(catalog.extensions)
    try:
        if catalog.remote:
            objectstore.configure(con, catalog.data_path)
        # a new PostgreSQL schema made by several processes at once
        catalog = retrying_races(lambda: _attach(con, catalog, read_only=read_only), CatalogError)
    except BaseException:
        extensions.release(con, reuse=False)
        raise
    return con, catalog
