"""The checks of a reward spec's SQL expressions and regexes, run when the spec loads: each is parsed, held to the
user-SQL rule (store/sql_guard.py), and bound against empty tables with the store's schemas, so a bad one is
refused with DuckDB's explanation before any episode is scored."""

from __future__ import annotations

import re
import threading
from typing import Any

import duckdb

from trajlake.core.errors import TrajlakeError
from trajlake.schemas.tables import TABLES
from trajlake.store.sql_guard import check_filter, parse_expression


class ScratchSchemaDB:
    """The one scratch DuckDB the checks bind against: in memory, holding empty `episodes` and `turns` tables with
    the store's schemas. Created on first use (loading a spec without SQL in it opens none), and used by one
    check at a time: a DuckDB connection is not safe to share between threads, and specs load on any thread."""

    def __init__(self) -> None:
        self._connection: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def execute(self, sql: str, params: list[Any] | None = None) -> None:
        """Run `sql` for its errors only (its result is dropped); a DuckDB error propagates."""
        with self._lock:
            if self._connection is None:
                connection = duckdb.connect()
                for name in ("episodes", "turns"):
                    connection.execute(TABLES[name].ddl("memory"))
                self._connection = connection
            self._connection.execute(sql, params)


SCRATCH_DB = ScratchSchemaDB()


def check_sql(expr: str, table: str, what: str) -> None:
    """Fail with DuckDB's explanation when `expr` is not a valid scalar expression over `table`."""
    if not isinstance(expr, str) or not expr.strip():
        raise TrajlakeError(f"{what} must be a non-empty SQL expression")
    extra = ", NULL::VARCHAR AS prev_observation" if table == "turns" else ""
    try:
        parse_expression(expr, what)  # one expression: a `)` or `;` in it cannot end the query it is pasted into
    except duckdb.Error as e:
        raise TrajlakeError(f"{what} {expr!r} is not valid over {table} columns: {_first_line(e)}") from None
    check_filter(expr, what)  # reading no table or catalog function: it runs on the connection that writes
    try:
        SCRATCH_DB.execute(f"SELECT CAST(({expr}\n) AS DOUBLE) FROM (SELECT *{extra} FROM {table}) LIMIT 0")
    except duckdb.Error as e:
        raise TrajlakeError(f"{what} {expr!r} is not valid over {table} columns: {_first_line(e)}") from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


def check_regex(pattern: Any) -> None:
    """Fail unless `pattern` is a regex both Python (the reference, user code) and DuckDB (RE2, the query) read."""
    if not isinstance(pattern, str) or not pattern:
        raise TrajlakeError("pattern must be a non-empty regular expression")
    try:
        re.compile(pattern)
        SCRATCH_DB.execute("SELECT regexp_matches('', ?)", [pattern])
    except (re.error, duckdb.Error) as e:
        raise TrajlakeError(f"bad regex {pattern!r}: {str(e).strip().splitlines()[0]}") from None
