"""The versioned trajectory store: a DuckLake catalog plus parquet data files.

Every write is one transaction and so one DuckLake snapshot, with a commit message naming the stage and
run id. Appends are validated against the schemas first and are idempotent by key. Reads can pin any
snapshot. See `store.uri` for the catalog backends.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import duckdb
import polars as pl
import pyarrow as pa

from trajlake.core.errors import CatalogError, SnapshotError, TrajlakeError
from trajlake.schemas.tables import TABLES, duckdb_type, table_def
from trajlake.schemas.views import VIEWS
from trajlake.store import extensions, objectstore
from trajlake.store.attach import ALIAS, _attach, check_read_only
from trajlake.store.uri import CatalogURI, parse_uri
from trajlake.store.validate import conform

#: each view's name as a word of a query's text
_VIEW_NAMES = {name: re.compile(rf"\b{name}\b", re.IGNORECASE) for name in VIEWS}


def _views_read_by(sql: str) -> list[str]:
    """The views `sql` names and the views those read, in VIEWS' order (a view reads only views before it)."""
    needed: list[str] = []
    for name in reversed(VIEWS):
        if _VIEW_NAMES[name].search(sql) or any(_VIEW_NAMES[name].search(VIEWS[n]) for n in needed):
            needed.append(name)
    return needed[::-1]
#: Rows per parquet row group of the lake's data files (DuckLake's default is 122,880). A turn carries about
#: 500 token ids and as many list levels: DuckDB's parquet writer builds each row group's list levels in
#: buffers that at 100k turns (about 200 MB) are fresh pages from the OS every time, which made ingest about
#: twice as slow as pyarrow's writer (bench/store.py); at 8,192 turns they are reused. Files stay as small.
ROW_GROUP_ROWS = 8192
#: Transient errors of concurrent writers that a retry resolves.
_RETRYABLE = ("conflict", "database is locked", "could not serialize", "deadlock", "busy")
#: ... and of concurrent first opens, which create the same schema and tables
_RACES = (*_RETRYABLE, "already exists", "duplicate key value")
MAX_RETRIES = 30
#: A one-row table every append of a multi-process catalog updates in its transaction. DuckLake lets two
#: transactions insert into one table without conflict, so two writers' `WHERE NOT EXISTS` key checks could
#: both pass and store a key twice; two transactions that both update this row conflict at commit instead, and
#: the loser retries, now seeing the winner's rows. Appends to one lake are serialised at commit.
WRITE_TOKEN = "write_token"
#: Tables whose rows always go to parquet, never inlined into the catalog: SQLite and PostgreSQL catalogs fail to
#: commit an inlined row holding a NUL inside a nested string (a list of episode ids, a map's keys), which data
#: from imports and env servers may hold. Their rows are few (one per train step, one per episode scored).
NEVER_INLINED = tuple(t.name for t in TABLES.values()
                      if any(pa.types.is_nested(f.type) and "string" in str(f.type) for f in t.schema))


@dataclass(frozen=True)
class CommitResult:
    """What one append did: the snapshot it made (None when every row was already stored)."""

    snapshot_id: int | None
    inserted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


class Lake:
    """A trajectory lake. Open with `Lake.open(uri)`; safe to share between threads of one process."""

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog: CatalogURI, read_only: bool = False):
        self._con = con
        self.catalog = catalog
        self.read_only = read_only
        self._lock = threading.Lock()  # guards the base connection, which is used only to make cursors
        # last_committed_snapshot() is per attached lake, not per cursor: no other thread may commit between
        # a commit and reading its snapshot id
        self._commit_lock = threading.Lock()

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, uri: str | None = None, *, read_only: bool = False) -> Lake:
        """Open (creating if new) the lake at `uri`: a folder, `sqlite:FILE` or `postgres:CONNINFO`.

        `read_only`: never create or change anything: a missing lake is an error, the catalog is attached
        read-only, and `query` runs one read statement at a time (`check_read_only`)."""
        catalog = parse_uri(uri)
        if read_only:
            why = catalog.missing()
            if why:
                raise CatalogError(f"cannot open lake {catalog.raw}: {why}")
        else:
            catalog.prepare()
        con = extensions.connect(catalog.extensions)
        try:
            if catalog.remote:
                objectstore.configure(con, catalog.data_path)
            for attempt in range(MAX_RETRIES):  # a new PostgreSQL schema made by several processes at once
                try:
                    catalog = _attach(con, catalog, read_only=read_only)
                    break
                except CatalogError as e:
                    if attempt + 1 == MAX_RETRIES or not any(s in str(e).lower() for s in _RACES):
                        raise
                    time.sleep(0.05 * (1 + random.random()))
        except BaseException:
            con.close()
            raise
        lake = cls(con, catalog, read_only)
        if not read_only:
            for attempt in range(MAX_RETRIES):  # another process may be creating the same tables right now
                try:
                    lake._ensure_tables()
                    break
                except TrajlakeError as e:
                    if attempt + 1 == MAX_RETRIES or not any(s in str(e).lower() for s in _RACES):
                        con.close()
                        raise
                    time.sleep(0.05 * (1 + random.random()))
        return lake

    def _ensure_tables(self) -> None:
        """Create missing tables and add columns the schemas gained since the lake was made."""
        cur = self._cursor()
        existing = {
            (t, c)
            for t, c in cur.execute(
                "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ?", [ALIAS]
            ).fetchall()
        }
        tables = {t for t, _ in existing}
        statements = []
        if self.catalog.multi_process and WRITE_TOKEN not in tables:
            statements += [f"CREATE TABLE {ALIAS}.{WRITE_TOKEN} (n BIGINT)",
                           f"INSERT INTO {ALIAS}.{WRITE_TOKEN} VALUES (0)"]
        for tdef in TABLES.values():
            if tdef.name not in tables:
                statements.append(tdef.ddl(ALIAS))
                continue
            added = [f.name for f in tdef.schema if (tdef.name, f.name) not in existing]
            for f in tdef.schema:
                if f.name in added:
                    statements.append(f"ALTER TABLE {ALIAS}.{tdef.name} ADD COLUMN {f.name} {duckdb_type(f)}")
            # derived columns new to this lake: computed for the rows already stored, in the same snapshot
            # (so every snapshot either lacks the column, see `_pin`, or has it filled)
            fill = [f"{c} = {tdef.length_sql(c)}" for c, _ in tdef.list_lengths if c in added]
            if fill:
                statements.append(f"UPDATE {ALIAS}.{tdef.name} SET {', '.join(fill)}")
        rows = cur.execute(f"SELECT option_name, value, scope, scope_entry FROM {ALIAS}.options()").fetchall()
        options = {name: value for name, value, scope, _ in rows if scope == "GLOBAL"}
        settings = [] if options.get("parquet_version") == "V2" else [("parquet_version", "2")]
        if "parquet_row_group_size" not in options:  # a lake's own setting is kept
            settings.append(("parquet_row_group_size", str(ROW_GROUP_ROWS)))
        not_inlined = {entry for name, _, scope, entry in rows
                       if name == "data_inlining_row_limit" and scope == "TABLE"}
        table_settings = [t for t in NEVER_INLINED if f"main.{t}" not in not_inlined]
        if statements or settings:
            self._transaction(
                lambda c: [c.execute(s) for s in statements]
                + [c.execute(f"CALL {ALIAS}.set_option('{name}', '{value}')") for name, value in settings],
                stage="store",
                message="store: create or upgrade tables",
            )
        if table_settings:  # DuckLake sets a table's options only once the table is committed
            self._transaction(
                lambda c: [c.execute(f"CALL {ALIAS}.set_option('data_inlining_row_limit', 0, table_name => ?)", [t])
                           for t in table_settings],
                stage="store",
                message="store: never inline " + ", ".join(table_settings),
            )

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _explain(self, error: Exception) -> str:
        """An error's first line; for data on object storage, with the server's reason and what to check."""
        return objectstore.explain(str(error), self.catalog.data_path)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self._con.cursor()

    # ---- writing -------------------------------------------------------------------------------
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
        if not data:
            raise TrajlakeError("append needs at least one table")
        staged = {name: conform(rows, table_def(name)) for name, rows in data.items()}
        inserted: dict[str, int] = {}

        def write(cur: duckdb.DuckDBPyConnection) -> bool:
            inserted.clear()
            if self.catalog.multi_process:
                cur.execute(f"UPDATE {ALIAS}.{WRITE_TOKEN} SET n = n + 1")
            for name, table in staged.items():
                view = f"_incoming_{name}"
                key = table_def(name).key
                match = " AND ".join(f"t.{k} = i.{k}" for k in key)
                # Look the keys up first, on the key columns alone: when none is stored (the usual case) the
                # rows go straight from Arrow to parquet; an anti-join in the INSERT itself would first copy
                # every incoming row, token lists included, into its hash table.
                cur.register(view, table.select(list(key)))
                stored = cur.execute(
                    f"SELECT count(*) FROM {view} i WHERE EXISTS (SELECT 1 FROM {ALIAS}.{name} t WHERE {match})"
                ).fetchone()[0]
                cur.unregister(view)
                cur.register(view, table)
                n = cur.execute(
                    f"INSERT INTO {ALIAS}.{name} SELECT * FROM {view} i"
                    + (f" WHERE NOT EXISTS (SELECT 1 FROM {ALIAS}.{name} t WHERE {match})" if stored else "")
                ).fetchone()[0]
                cur.unregister(view)
                inserted[name] = int(n)
            return any(inserted.values())

        msg = message or f"{stage}: append " + ", ".join(f"{n} ({t.num_rows})" for n, t in staged.items())
        snapshot = self._transaction(write, stage=stage, message=msg, run_id=run_id)
        skipped = {name: staged[name].num_rows - inserted.get(name, 0) for name in staged}
        return CommitResult(snapshot, dict(inserted), skipped)

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
        tdef = table_def(table)
        if set(key) != set(tdef.key):
            raise TrajlakeError(f"update of {table} needs its key {tdef.key}, got {tuple(key)}")
        unknown = [c for c in values if c not in tdef.schema.names or c in tdef.key]
        if unknown:
            raise TrajlakeError(f"cannot update column(s) {', '.join(unknown)} of {table}")
        derived = dict(tdef.list_lengths)
        computed = [c for c in values if c in derived]
        if computed:
            raise TrajlakeError(f"cannot update column(s) {', '.join(computed)} of {table}: the store computes "
                                f"them from {', '.join(derived[c] for c in computed)}")
        values = dict(values)
        for column, source in tdef.list_lengths:  # a new list brings its new length
            if source in values:
                values[column] = len(values[source] or ())
        sets = ", ".join(f"{c} = ?" for c in values)
        where = " AND ".join(f"{k} = ?" for k in key)
        params = [json.dumps(v) if _is_json_col(table, c) and v is not None else v for c, v in values.items()]

        def write(cur: duckdb.DuckDBPyConnection) -> bool:
            n = cur.execute(f"UPDATE {ALIAS}.{table} SET {sets} WHERE {where}", params + list(key.values()))
            return bool(n.fetchone()[0])

        return self._transaction(write, stage=stage, run_id=run_id, message=message or f"{stage}: update {table}")

    def _transaction(self, write, *, stage: str, message: str, run_id: str | None = None) -> int | None:
        """Run `write(cursor)` in one transaction with a commit message; retry transient conflicts.

        `write` returns whether it changed anything; if not, the transaction is rolled back and no
        snapshot is made. Returns the snapshot id committed, or None.
        """
        extra = json.dumps({"stage": stage, "run_id": run_id, "commit": uuid.uuid4().hex})
        for attempt in range(MAX_RETRIES):
            cur = self._cursor()
            try:
                cur.execute("BEGIN TRANSACTION")
                changed = write(cur)
                if changed is False:
                    cur.execute("ROLLBACK")
                    return None
                cur.execute(
                    f"CALL {ALIAS}.set_commit_message(?, ?, extra_info => ?)", [stage, message, extra]
                )
                with self._commit_lock:
                    cur.execute("COMMIT")
                    return cur.execute(f"SELECT id FROM {ALIAS}.last_committed_snapshot()").fetchone()[0]
            except duckdb.Error as e:
                _rollback(cur)
                if attempt + 1 < MAX_RETRIES and any(s in str(e).lower() for s in _RETRYABLE):
                    time.sleep(min(0.01 * 2**attempt, 0.5) * (0.5 + random.random()))
                    continue
                raise TrajlakeError(f"{stage}: write failed, nothing was stored: {self._explain(e)}") from e
            finally:
                cur.close()
        raise AssertionError("unreachable")

    # ---- reading -------------------------------------------------------------------------------
    def query(
        self,
        sql: str,
        params: list | None = None,
        *,
        snapshot: int | None = None,
        output: Literal["polars", "arrow"] = "polars",
        tables: Mapping[str, pa.Table] | None = None,
    ) -> pl.DataFrame | pa.Table:
        """Run `sql` over the store's tables (bare names: `episodes`, `turns`, ...).

        With `snapshot`, every table is read as it was at that snapshot (and so is every view of
        schemas/views.py, e.g. `token_rewards`). `tables` are extra Arrow tables the query may read by name.
        Returns polars or Arrow.
        """
        if self.read_only:
            check_read_only(sql)
        cur = self._cursor()
        try:
            if snapshot is None:
                cur.execute(f"USE {ALIAS}")
            else:
                self._pin(cur, snapshot)
            for name, table in (tables or {}).items():
                cur.register(name, table)
            # per query, over the (maybe pinned) bare table names, only the views a query names and those they
            # read: creating one binds it to the tables, which costs time at every query, and fails at a snapshot
            # from before a column it reads (a lake of an older version)
            for name in _views_read_by(sql):
                cur.execute(f"CREATE TEMP VIEW {name} AS {VIEWS[name]}")
            try:
                rel = cur.execute(sql, params) if params else cur.sql(sql)
                if rel is None:
                    return pl.DataFrame() if output == "polars" else pa.table({})
                table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.fetch_arrow_table()
            except duckdb.Error as e:
                raise TrajlakeError(f"query failed: {self._explain(e)}") from None
            return pl.from_arrow(table) if output == "polars" else table
        finally:
            cur.close()

    def _pin(self, cur: duckdb.DuckDBPyConnection, snapshot: int) -> None:
        ids = [r[0] for r in cur.execute(f"SELECT snapshot_id FROM ducklake_snapshots('{ALIAS}')").fetchall()]
        if snapshot not in ids:
            raise SnapshotError(f"snapshot {snapshot} does not exist (snapshots {min(ids)}..{max(ids)})")
        for name, tdef in TABLES.items():
            source = f"{ALIAS}.{name} AT (VERSION => {int(snapshot)})"
            try:
                cur.execute(f"CREATE TEMP VIEW {name} AS SELECT * FROM {source}")
                if tdef.list_lengths:  # a snapshot from before the store derived these columns: compute them
                    have = {d[0] for d in cur.execute(f"SELECT * FROM {name} LIMIT 0").description}
                    missing = [f"{tdef.length_sql(c)} AS {c}" for c, _ in tdef.list_lengths if c not in have]
                    if missing:
                        cur.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS "
                                    f"SELECT *, {', '.join(missing)} FROM {source}")
            except duckdb.Error:
                raise SnapshotError(f"snapshot {snapshot} predates table {name}") from None

    def snapshots(self) -> pl.DataFrame:
        """Every snapshot: id, time, stage (author), message, run id, and what changed."""
        return self.query(
            f"SELECT snapshot_id, snapshot_time, author AS stage, commit_message AS message, "
            f"json_extract_string(commit_extra_info, '$.run_id') AS run_id, changes "
            f"FROM ducklake_snapshots('{ALIAS}') ORDER BY snapshot_id"
        )

    def current_snapshot(self) -> int:
        cur = self._cursor()
        try:
            return cur.execute(f"SELECT id FROM {ALIAS}.current_snapshot()").fetchone()[0]
        finally:
            cur.close()

    def count(self, table: str, *, snapshot: int | None = None) -> int:
        table_def(table)
        return int(self.query(f"SELECT count(*) AS n FROM {table}", snapshot=snapshot)["n"][0])
    # ---- maintenance ---------------------------------------------------------------------------
    def maintain(self, *, expire_older_than: timedelta | None = None, grace: timedelta = timedelta(hours=1)) -> dict:
        """Flush inlined rows, merge small files, expire old snapshots, delete unused files (store/maintain.py)."""
        from trajlake.store.maintain import maintain

        return maintain(self, expire_older_than=expire_older_than, grace=grace)


def _is_json_col(table: str, column: str) -> bool:
    from trajlake.schemas.tables import is_json

    return is_json(TABLES[table].schema.field(column))


def _rollback(cur: duckdb.DuckDBPyConnection) -> None:
    """Roll back the cursor's transaction; one the failure already ended has nothing to roll back."""
    with contextlib.suppress(duckdb.Error):
        cur.execute("ROLLBACK")
