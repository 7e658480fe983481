"""The checks of a reward spec's SQL expressions and regexes, run when the spec loads: each is parsed, held to the
user-SQL rule (store/sql_guard.py), and bound against empty tables with the store's schemas, so a bad one is
refused with DuckDB's explanation before any episode is scored."""

from __future__ import annotations

import re
from typing import Any

import duckdb

from trajlake.core.errors import TrajlakeError
from trajlake.schemas.tables import TABLES
from trajlake.store.sql_guard import check_filter

_schema_con: duckdb.DuckDBPyConnection | None = None


def _schema_db() -> duckdb.DuckDBPyConnection:
    global _schema_con
    if _schema_con is None:
        _schema_con = duckdb.connect()
        for name in ("episodes", "turns"):
            _schema_con.execute(TABLES[name].ddl("memory"))
    return _schema_con


def check_sql(expr: str, table: str, what: str) -> None:
    """Fail with DuckDB's explanation when `expr` is not a valid scalar expression over `table`."""
    if not isinstance(expr, str) or not expr.strip():
        raise TrajlakeError(f"{what} must be a non-empty SQL expression")
    extra = ", NULL::VARCHAR AS prev_observation" if table == "turns" else ""
    try:
        duckdb.SQLExpression(expr)  # one expression: a `)` or `;` in it cannot end the query it is pasted into
    except duckdb.Error as e:
        raise TrajlakeError(f"{what} {expr!r} is not valid over {table} columns: {_first_line(e)}") from None
    check_filter(expr, what)  # reading no table or catalog function: it runs on the connection that writes
    try:
        _schema_db().execute(f"SELECT CAST(({expr}\n) AS DOUBLE) FROM (SELECT *{extra} FROM {table}) LIMIT 0")
    except duckdb.Error as e:
        raise TrajlakeError(f"{what} {expr!r} is not valid over {table} columns: {_first_line(e)}") from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0]


def check_regex(pattern: Any) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise TrajlakeError("pattern must be a non-empty regular expression")
    try:
        re.compile(pattern)
        _schema_db().execute("SELECT regexp_matches('', ?)", [pattern])
    except (re.error, duckdb.Error) as e:
        raise TrajlakeError(f"bad regex {pattern!r}: {str(e).strip().splitlines()[0]}") from None
