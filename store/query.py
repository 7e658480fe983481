"""Reading a lake with SQL: a query over the bare table names, current or pinned at a snapshot (with the views
of schemas/views.py it names), and the snapshot list. `Lake.query`, `Lake.snapshots`, `Lake.current_snapshot`
and `Lake.count` are the entry points; the typed reads other stages make are store/reads.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import duckdb
import polars as pl
import pyarrow as pa

from trajlake.core.errors import SnapshotError, TrajlakeError
from trajlake.schemas.tables import TABLES, table_def
from trajlake.schemas.views import VIEWS
from trajlake.store.attach import ALIAS, check_read_only

if TYPE_CHECKING:
    from trajlake.store.connection import Connection

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
          output: Literal["polars", "arrow"] = "polars",
          tables: Mapping[str, pa.Table] | None = None) -> pl.DataFrame | pa.Table:
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
            if rel is None:
                return pl.DataFrame() if output == "polars" else pa.table({})
            table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.fetch_arrow_table()
        except duckdb.Error as e:
            raise TrajlakeError(f"query failed: {conn.explain(e)}") from None
        return pl.from_arrow(table) if output == "polars" else table
    finally:
        cur.close()


def pin(cur: duckdb.DuckDBPyConnection, snapshot: int) -> None:
    """Make the cursor's bare table names read the lake as it was at `snapshot` (temporary views)."""
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


def snapshots(conn: Connection) -> pl.DataFrame:
    """Every snapshot: id, time, stage (author), message, run id, and what changed."""
    return query(
        conn,
        f"SELECT snapshot_id, snapshot_time, author AS stage, commit_message AS message, "
        f"json_extract_string(commit_extra_info, '$.run_id') AS run_id, changes "
        f"FROM ducklake_snapshots('{ALIAS}') ORDER BY snapshot_id",
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
    table_def(table)
    return int(query(conn, f"SELECT count(*) AS n FROM {table}", snapshot=snapshot)["n"][0])
