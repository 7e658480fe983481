"""Check data against a table's schema before anything is written, and bring it to the exact types.

Accepted: Arrow tables or record batches, polars DataFrames, and lists of record types. Types of the same
kind are cast losslessly (int64 -> int32 when the values fit, large_string -> string, naive timestamps read
as UTC); a value that does not fit, a column of another kind, an unknown column, a missing required column,
a null key or a key repeated within the batch is a SchemaError naming the table and column.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.core.errors import SchemaError
from trajlake.schemas.records import to_table
from trajlake.schemas.tables import TableDef, is_json


def as_arrow(data: Any, tdef: TableDef) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "to_arrow") and type(data).__module__.startswith("polars"):
        return data.to_arrow()
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        try:
            return to_table(list(data), tdef.name)
        except (TypeError, pa.ArrowException) as e:
            raise SchemaError(f"{tdef.name}: records do not fit the schema: {e}") from None
    raise SchemaError(
        f"{tdef.name}: cannot append a {type(data).__name__}; give an Arrow table, a polars DataFrame or records"
    )


def _kind(t: pa.DataType) -> str:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return "list<" + _kind(t.value_type) + ">"
    if pa.types.is_map(t):
        return "map"
    return str(t)


def _compatible(src: pa.DataType, dst: pa.DataType) -> bool:
    s, d = _kind(src), _kind(dst)
    if s == "null" or s == d:
        return True
    # ints widen to floats; a list of ints fits a list of floats
    return (s, d) in {("int", "float"), ("list<int>", "list<float>"), ("list<null>", d)}


def conform(data: Any, tdef: TableDef) -> pa.Table:
    """Validate `data` against `tdef` and return it with exactly the table's schema."""
    table = as_arrow(data, tdef)
    schema = tdef.schema
    unknown = [c for c in table.column_names if c not in schema.names]
    if unknown:
        raise SchemaError(f"{tdef.name}: unknown column(s) {', '.join(unknown)}; columns are {', '.join(schema.names)}")
    if len(set(table.column_names)) != len(table.column_names):
        raise SchemaError(f"{tdef.name}: a column appears twice")
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            if not f.nullable:
                raise SchemaError(f"{tdef.name}: required column {f.name} is missing")
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table.column(f.name)
        if not _compatible(col.type, f.type):
            raise SchemaError(f"{tdef.name}.{f.name}: expected {f.type}, got {col.type}")
        if pa.types.is_timestamp(col.type) and col.type.tz is None:
            col = pc.assume_timezone(col, "UTC")
        try:
            col = col.cast(f.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise SchemaError(f"{tdef.name}.{f.name}: values do not fit {f.type}: {e}") from None
        if not f.nullable and col.null_count:
            raise SchemaError(f"{tdef.name}.{f.name}: {col.null_count} null value(s) in a required column")
        columns.append(col)
    out = _fill_list_lengths(pa.Table.from_arrays(columns, schema=schema), tdef)
    _check_finite(out, tdef)
    _check_json(out, tdef)
    _check_unique_keys(out, tdef)
    return out


def _fill_list_lengths(table: pa.Table, tdef: TableDef) -> pa.Table:
    """Set the columns the store derives from list lengths; values a writer gave must agree with them."""
    for column, source in tdef.list_lengths:
        lengths = pc.fill_null(pc.list_value_length(table.column(source)), 0).cast(pa.int32())
        given = table.column(column)
        if given.null_count < table.num_rows:
            wrong = pc.and_kleene(pc.is_valid(given), pc.not_equal(given, lengths))
            if pc.any(wrong).as_py():
                i = pc.index(wrong, True).as_py()
                raise SchemaError(
                    f"{tdef.name}.{column}: row {i} says {given[i].as_py()} but {source} holds "
                    f"{lengths[i].as_py()} ids; leave {column} out and the store computes it")
        table = table.set_column(table.schema.get_field_index(column), table.schema.field(column), lengths)
    return table


#: The numbers rewards, advantages and reports read. A NaN or inf there spreads into every mean, advantage and
#: update taken over it, so none is stored. Each door refuses first, naming its own input (an imported file's
#: row and field, an env server's reply, a reward component and its episode or turn); this is the last line,
#: for a writer that forgot (a train run's metrics are JSON, where train/checkpoint.clean_metrics nulls them).
FINITE_COLUMNS = {"episodes": ("env_reward",), "turns": ("step_reward",),
                  "episode_rewards": ("total", "components"), "turn_rewards": ("reward",)}


def _check_finite(table: pa.Table, tdef: TableDef) -> None:
    for name in FINITE_COLUMNS.get(tdef.name, ()):
        col = table.column(name).combine_chunks()
        if pa.types.is_map(col.type):  # a MAP's numbers (episode_rewards.components), as a list per row
            col = pa.ListArray.from_arrays(col.offsets, col.items)
        values = col.flatten() if pa.types.is_list(col.type) else col
        bad = pc.fill_null(pc.invert(pc.is_finite(values)), False) if len(values) else None
        if bad is None or not pc.any(bad).as_py():
            continue
        i = pc.index(bad, True).as_py()
        row = pc.list_parent_indices(col)[i].as_py() if values is not col else i
        raise SchemaError(f"{tdef.name}.{name}: row {row} holds {values[i].as_py()}, not a finite number (rewards "
                          "and the reports and updates over them need finite numbers); nothing was written")


_JSON_DB: tuple[int, duckdb.DuckDBPyConnection] | None = None
_JSON_LOCK = threading.Lock()


def _json_cursor() -> duckdb.DuckDBPyConnection:
    """A cursor on this process's in-memory DuckDB database for JSON checks (opening a database costs about
    10 ms, a cursor on an open one almost nothing); a forked child opens its own."""
    global _JSON_DB
    with _JSON_LOCK:
        if _JSON_DB is None or _JSON_DB[0] != os.getpid():
            _JSON_DB = (os.getpid(), duckdb.connect())
        return _JSON_DB[1].cursor()


def _check_json(table: pa.Table, tdef: TableDef) -> None:
    for f in tdef.schema:
        if not is_json(f) or table.column(f.name).null_count == table.num_rows:
            continue
        con = _json_cursor()
        try:
            con.register("col", pa.table({"v": table.column(f.name)}))
            bad = con.sql(
                "SELECT i, v FROM (SELECT row_number() OVER () - 1 AS i, v FROM col) "
                "WHERE v IS NOT NULL AND NOT json_valid(v) LIMIT 1"
            ).fetchall()
        finally:
            con.close()
        if bad:
            i, v = bad[0]
            raise SchemaError(f"{tdef.name}.{f.name}: row {i} is not valid JSON: {v[:80]!r}")


def _check_unique_keys(table: pa.Table, tdef: TableDef) -> None:
    if table.num_rows < 2:
        return
    counts = table.group_by(list(tdef.key)).aggregate([([], "count_all")])
    dup = counts.filter(pc.greater(counts["count_all"], 1))
    if dup.num_rows:
        first = {k: dup.column(k)[0].as_py() for k in tdef.key}
        raise SchemaError(f"{tdef.name}: key {first} appears {dup['count_all'][0].as_py()} times in one append")
