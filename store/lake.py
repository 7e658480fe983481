"""The versioned trajectory store: a DuckLake catalog plus parquet data files, behind one class, `Lake`.

Every write is one transaction and so one DuckLake snapshot, with a commit message naming the stage and
run id. Appends are validated against the schemas first and are idempotent by key. Reads can pin any
snapshot. See `store.uri` for the catalog backends.

`Lake` holds the connection (store/connection.py); its jobs live beside it, one module each, every one working on
that connection: opening (store/connect.py, attaching in store/attach.py), bringing the tables up to the schemas
(store/migrate.py), writing (store/write.py), reading with SQL (store/query.py) and maintenance
(store/maintain.py). The typed reads other stages make of stored data are store/reads.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import duckdb

from trajlake.core.errors import TrajlakeError
from trajlake.store import connect, query
from trajlake.store.connection import Connection
from trajlake.store.uri import CatalogURI

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

    from trajlake.core.display import Rows
    from trajlake.store.write import CommitResult

# The modules that write (migrate.py, write.py, maintain.py: pyarrow, through the schemas) load when a lake first
# writes: a read-only command (`trajlake sql`) pays for duckdb only.

__all__ = ["Lake"]


class Lake:
    """A trajectory lake. Open with `Lake.open(uri)`; safe to share between threads of one process."""

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog: CatalogURI, read_only: bool = False):
        self._connection = Connection(con, catalog, read_only)

    @property
    def catalog(self) -> CatalogURI:
        """The catalog URI as opened."""
        return self._connection.catalog

    @property
    def read_only(self) -> bool:
        return self._connection.read_only

    @property
    def _con(self) -> duckdb.DuckDBPyConnection:
        return self._connection.con

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, uri: str | None = None, *, read_only: bool = False) -> Lake:
        """Open (creating if new) the lake at `uri`: a folder, `sqlite:FILE` or `postgres:CONNINFO`.

        `read_only`: never create or change anything: a missing lake is an error, the catalog is attached
        read-only, and `query` runs one read statement at a time (`check_read_only`)."""
        con, catalog = connect.open_connection(uri, read_only=read_only)
        lake = cls(con, catalog, read_only)
        if not read_only:
            from trajlake.store import migrate

            try:  # another process may be creating the same tables right now
                connect.retrying_races(lambda: migrate.ensure_tables(lake._connection), TrajlakeError)
            except BaseException:
                lake.close()
                raise
        return lake

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _explain(self, error: Exception) -> str:
        """An error's first line; for data on object storage, with the server's reason and what to check."""
        return self._connection.explain(error)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        return self._connection.cursor()

    # ---- writing (store/write.py) --------------------------------------------------------------
    def append(
        self,
        data: Mapping[str, Any],
        *,
        stage: str,
        run_id: str | None = None,
        message: str | None = None,
    ) -> CommitResult:
        """Append rows to one or more tables in one transaction (one snapshot).

        `data` maps table names to Arrow tables, polars DataFrames or lists of records. Everything is
        validated before anything is written. Rows whose key is already stored are skipped, so a writer
        that died after committing can retry without duplicates. Returns the snapshot made, or None.
        """
        from trajlake.store import write

        return write.append(self._connection, data, stage=stage, run_id=run_id, message=message)

    def update(
        self,
        table: str,
        key: Mapping[str, Any],
        values: Mapping[str, Any],
        *,
        stage: str,
        run_id: str | None = None,
        message: str | None = None,
    ) -> int | None:
        """Set `values` on the row of `table` with `key` (e.g. a run's status), in one snapshot."""
        from trajlake.store import write

        return write.update(self._connection, table, key, values, stage=stage, run_id=run_id, message=message)

    def _transaction(self, write_rows, *, stage: str, message: str, run_id: str | None = None) -> int | None:
        """Run `write_rows(cursor)` in one transaction with a commit message; retry transient conflicts.

        `write_rows` returns whether it changed anything; if not, the transaction is rolled back and no
        snapshot is made. Returns the snapshot id committed, or None.
        """
        from trajlake.store import write

        return write.transaction(self._connection, write_rows, stage=stage, message=message, run_id=run_id)

    # ---- reading (store/query.py) --------------------------------------------------------------
    def query(
        self,
        sql: str,
        params: list | None = None,
        *,
        snapshot: int | None = None,
        output: Literal["polars", "arrow", "rows"] = "polars",
        tables: Mapping[str, pa.Table] | None = None,
        max_rows: int | None = None,
    ) -> pl.DataFrame | pa.Table | Rows:
        """Run `sql` over the store's tables (bare names: `episodes`, `turns`, ...).

        With `snapshot`, every table is read as it was at that snapshot (and so is every view of
        schemas/views.py, e.g. `token_rewards`). `tables` are extra Arrow tables the query may read by name.
        Returns polars, Arrow or, for printing, `display.Rows` (the first `max_rows` rows as Python values, with
        the whole count; no polars or pyarrow imported).
        """
        return query.query(self._connection, sql, params, snapshot=snapshot, output=output, tables=tables,
                           max_rows=max_rows)

    def snapshots(self, *, changes: bool = True, output: Literal["polars", "rows"] = "polars",
                  max_rows: int | None = None) -> pl.DataFrame | Rows:
        """Every snapshot: id, time, stage (author), message, run id, and (`changes`) what changed; as polars
        or, for printing, `display.Rows` (`Lake.query`)."""
        return query.snapshots(self._connection, changes=changes, output=output, max_rows=max_rows)

    def current_snapshot(self) -> int:
        return query.current_snapshot(self._connection)

    def count(self, table: str, *, snapshot: int | None = None) -> int:
        return query.count(self._connection, table, snapshot=snapshot)

    # ---- maintenance (store/maintain.py) -------------------------------------------------------
    def maintain(self, *, expire_older_than: timedelta | None = None, grace: timedelta = timedelta(hours=1)) -> dict:
        """Flush inlined rows, merge small files, expire old snapshots, delete unused files (store/maintain.py)."""
        from trajlake.store import maintain as maintenance

        return maintenance.maintain(self._connection, expire_older_than=expire_older_than, grace=grace)
