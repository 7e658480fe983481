"""Reading a lake with SQL: a query over the bare table names, current or pinned at a snapshot (with the views
of schemas/views.py it names), and the snapshot list. `Lake.query`, `Lake.snapshots`, `Lake.current_snapshot`
and `Lake.count` are the entry points; the typed reads other stages make are store/reads.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import duckdb

from trajlake.core.errors import SnapshotError, TrajlakeError
from trajlake.schemas.views import VIEWS
from trajlake.store.attach import ALIAS, check_read_only

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

    from trajlake.core.display import Rows
    from trajlake.store.connection import Connection

# polars, pyarrow and the schemas (pyarrow) are imported where a result or a snapshot's tables need them: a query
# printed for people (output "rows") needs neither

#: each view's name as a word of a query's text
_VIEW_NAMES = {name: re.compile(rf"\b{name}\b", re.IGNORECASE) for name in VIEWS}


def views_read_by(sql: str) -> list[str]:
    """The views `sql` names and the views those read, in VIEWS' order (a view reads only views before it)."""
    needed: list[str] = []
    for name in reversed(VIEWS):
        if _VIEW_NAMES[name].search(sql) or any(_VIEW_NAMES[name].search(VIEWS[n]) for n in needed):
            needed.append(name)
    return needed[::-1]


def query(conn: Connection, sql: str, params: list | None = None, *, snapshot: int | None = None,
          output: Literal["polars", "arrow", "rows"] = "polars", tables: Mapping[str, pa.Table] | None = None,
          max_rows: int | None = None) -> pl.DataFrame | pa.Table | Rows:
    """Run `sql` over the store's tables at `snapshot` (None: the current one); see `Lake.query`."""
    if conn.read_only:
        check_read_only(sql)
    cur = conn.cursor()
    try:
        if snapshot is None:
            cur.execute(f"USE {ALIAS}")
        else:
            pin(cur, snapshot)
        for name, table in (tables or {}).items():
            cur.register(name, table)
        # per query, over the (maybe pinned) bare table names, only the views a query names and those they
        # read: creating one binds it to the tables, which costs time at every query, and fails at a snapshot
        # from before a column it reads (a lake of an older version)
        for name in views_read_by(sql):
            cur.execute(f"CREATE TEMP VIEW {name} AS {VIEWS[name]}")
        try:
            rel = cur.execute(sql, params) if params else cur.sql(sql)
            if output == "rows":
                return _rows(cur if params else rel, max_rows)
            import polars as pl
            import pyarrow as pa

            if rel is None:
                return pl.DataFrame() if output == "polars" else pa.table({})
            table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.fetch_arrow_table()
        except duckdb.Error as e:
            raise TrajlakeError(f"query failed: {conn.explain(e)}") from None
        return pl.from_arrow(table) if output == "polars" else table
    finally:
        cur.close()


#: DuckDB's type ids as polars names them: a table printed from `Rows` reads as one printed from a frame
_TYPE_NAMES = {
    "boolean": "boolean", "tinyint": "int8", "smallint": "int16", "integer": "int32", "bigint": "int64",
    "hugeint": "int128", "utinyint": "uint8", "usmallint": "uint16", "uinteger": "uint32", "ubigint": "uint64",
    "float": "float32", "double": "float64", "varchar": "string", "blob": "binary", "date": "date", "time": "time",
    "timestamp": "datetime", "timestamp with time zone": "datetime", "timestamp_ms": "datetime",
    "timestamp_ns": "datetime", "timestamp_s": "datetime", "interval": "duration", "map": "list",
    "uuid": "string", "json": "string", "null": "null",
}
#: rows fetched at a time while counting a result's rows past those printed
_COUNT_BATCH = 10_000


def _rows(rel, max_rows: int | None) -> Rows:
    """The first `max_rows` rows (all: None) of a relation (or of the cursor that executed a statement), as Python
    values, with the result's row count. A statement that returns nothing gives no column and no row."""
    from trajlake.core.display import Rows

    if rel is None or rel.description is None:
        return Rows((), (), [], 0)
    names = tuple(d[0] for d in rel.description)
    duck_types = [d[1] for d in rel.description]  # DuckDB's types, of a relation or of an executed statement
    types = tuple(_TYPE_NAMES.get(t.id, t.id) for t in duck_types)
    rows = rel.fetchall() if max_rows is None else rel.fetchmany(max_rows)
    height = len(rows)
    if max_rows is not None and height == max_rows:  # the rest counted, a batch at a time (never all held)
        while batch := rel.fetchmany(_COUNT_BATCH):
            height += len(batch)
    arrays = {i for i, t in enumerate(duck_types) if t.id == "array"}
    if arrays:  # a fixed-size ARRAY comes as a tuple; polars shows it as a list
        rows = [tuple(list(v) if i in arrays and v is not None else v for i, v in enumerate(row)) for row in rows]
    return Rows(names, types, rows, height)


def pin(cur: duckdb.DuckDBPyConnection, snapshot: int) -> None:
    """Make the cursor's bare table names read the lake as it was at `snapshot` (temporary views)."""
    from trajlake.schemas.tables import TABLES

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


def snapshots(conn: Connection, *, changes: bool = True, output: Literal["polars", "rows"] = "polars",
              max_rows: int | None = None) -> pl.DataFrame | Rows:
    """Every snapshot: id, time, stage (author), message, run id, and (`changes`) what changed."""
    return query(
        conn,
        f"SELECT snapshot_id, snapshot_time, author AS stage, commit_message AS message, "
        f"json_extract_string(commit_extra_info, '$.run_id') AS run_id{', changes' if changes else ''} "
        f"FROM ducklake_snapshots('{ALIAS}') ORDER BY snapshot_id",
        output=output, max_rows=max_rows,
    )


def current_snapshot(conn: Connection) -> int:
    """The id of the lake's latest snapshot."""
    cur = conn.cursor()
    try:
        return cur.execute(f"SELECT id FROM {ALIAS}.current_snapshot()").fetchone()[0]
    finally:
        cur.close()


def count(conn: Connection, table: str, *, snapshot: int | None = None) -> int:
    """Rows of `table` (a store table's name) at `snapshot`."""
    from trajlake.schemas.tables import table_def

    table_def(table)
    return int(query(conn, f"SELECT count(*) AS n FROM {table}", snapshot=snapshot)["n"][0])
