"""Bringing a lake's tables up to the schemas: missing tables created, columns the schemas gained since the lake
was made added (derived ones filled for the rows already stored), and the lake's parquet and inlining options
set. `Lake.open` runs `ensure_tables` on every lake it opens for writing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from trajlake.schemas.tables import TABLES, duckdb_type
from trajlake.store.attach import ALIAS
from trajlake.store.write import WRITE_TOKEN, transaction

if TYPE_CHECKING:
    from trajlake.store.connection import Connection

#: Rows per parquet row group of the lake's data files (DuckLake's default is 122,880). A turn carries about
#: 500 token ids and as many list levels: DuckDB's parquet writer builds each row group's list levels in
#: buffers that at 100k turns (about 200 MB) are fresh pages from the OS every time, which made ingest about
#: twice as slow as pyarrow's writer (bench/store.py); at 8,192 turns they are reused. Files stay as small.
ROW_GROUP_ROWS = 8192
#: Tables whose rows always go to parquet, never inlined into the catalog: SQLite and PostgreSQL catalogs fail to
#: commit an inlined row holding a NUL inside a nested string (a list of episode ids, a map's keys), which data
#: from imports and env servers may hold. Their rows are few (one per train step, one per episode scored).
NEVER_INLINED = tuple(t.name for t in TABLES.values()
                      if any(pa.types.is_nested(f.type) and "string" in str(f.type) for f in t.schema))


def _table_statements(existing: set[tuple[str, str]], *, with_write_token: bool) -> list[str]:
    """The statements that bring a lake holding the (table, column) pairs `existing` to the schemas: tables
    created, columns added (a derived column filled for the rows already stored, in the same snapshot, so every
    snapshot either lacks it, see `query.pin`, or has it filled), and a multi-process catalog's write token."""
    tables = {t for t, _ in existing}
    statements = []
    if with_write_token and WRITE_TOKEN not in tables:
        statements += [f"CREATE TABLE {ALIAS}.{WRITE_TOKEN} (n BIGINT)",
                       f"INSERT INTO {ALIAS}.{WRITE_TOKEN} VALUES (0)"]
    for tdef in TABLES.values():
        if tdef.name not in tables:
            statements.append(tdef.ddl(ALIAS))
            continue
        added = [f.name for f in tdef.schema if (tdef.name, f.name) not in existing]
        statements += [f"ALTER TABLE {ALIAS}.{tdef.name} ADD COLUMN {f.name} {duckdb_type(f)}"
                       for f in tdef.schema if f.name in added]
        fill = [f"{c} = {tdef.length_sql(c)}" for c, _ in tdef.list_lengths if c in added]
        if fill:
            statements.append(f"UPDATE {ALIAS}.{tdef.name} SET {', '.join(fill)}")
    return statements


def ensure_tables(conn: Connection) -> None:
    """Create missing tables and add columns the schemas gained since the lake was made."""
    cur = conn.cursor()
    existing = {
        (t, c)
        for t, c in cur.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ?", [ALIAS]
        ).fetchall()
    }
    statements = _table_statements(existing, with_write_token=conn.catalog.multi_process)
    rows = cur.execute(f"SELECT option_name, value, scope, scope_entry FROM {ALIAS}.options()").fetchall()
    options = {name: value for name, value, scope, _ in rows if scope == "GLOBAL"}
    settings = [] if options.get("parquet_version") == "V2" else [("parquet_version", "2")]
    if "parquet_row_group_size" not in options:  # a lake's own setting is kept
        settings.append(("parquet_row_group_size", str(ROW_GROUP_ROWS)))
    not_inlined = {entry for name, _, scope, entry in rows
                   if name == "data_inlining_row_limit" and scope == "TABLE"}
    table_settings = [t for t in NEVER_INLINED if f"main.{t}" not in not_inlined]
    if statements or settings:
        transaction(
            conn,
            lambda c: [c.execute(s) for s in statements]
            + [c.execute(f"CALL {ALIAS}.set_option('{name}', '{value}')") for name, value in settings],
            stage="store",
            message="store: create or upgrade tables",
        )
    if table_settings:  # DuckLake sets a table's options only once the table is committed
        transaction(
            conn,
            lambda c: [c.execute(f"CALL {ALIAS}.set_option('data_inlining_row_limit', 0, table_name => ?)", [t])
                       for t in table_settings],
            stage="store",
            message="store: never inline " + ", ".join(table_settings),
        )
