"""What user SQL may do: filter fragments read the lake's tables and nothing else; read-only queries never reach
a function that changes the lake.

User SQL reaches the store in two shapes. A *fragment* (`--where`, a config's `sft_filter` / `train_filter` /
`replay_filter`, a reward spec's `sql` / `process` expr) is pasted into trajlake's own queries, which run on the
connection that also writes: so a fragment may only be one expression over columns, constants, operators and
scalar functions, with subqueries over the lake's own tables. A *query* (`trajlake sql`, `export --query`) runs
on a lake attached read-only, but DuckLake's maintenance functions delete files before the read-only catalog
refuses their commit (`ducklake_cleanup_old_files` in a `SELECT` removed scheduled files), so a query may not
name them either.

Both checks read DuckDB's own parse tree (`json_serialize_sql`), not the text: a function hidden in a
subquery, a CTE, a join or a lambda is found wherever it sits.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from functools import lru_cache

import duckdb

from trajlake.core.errors import TrajlakeError

#: DuckLake's functions that only read (its snapshot list, options, files and change feeds). Every other
#: `ducklake_*` function (maintenance, options, commits, adding files: and any a later DuckLake adds) is refused.
READ_ONLY_DUCKLAKE = frozenset({
    "snapshots", "current_snapshot", "last_committed_snapshot", "options", "settings", "table_info", "list_files",
    "table_changes", "table_insertions", "table_deletions", "scan",
})
#: the qualifiers DuckDB's parser itself gives built-in functions (a list literal is `main.list_value`)
_BUILTIN_QUALIFIERS = frozenset({"", "main", "system", "pg_catalog"})
#: functions that run SQL given as text or data (and so would run what the parse tree never shows), or change
#: the database's own state
_REFUSED_ALWAYS = frozenset({
    "query", "query_table", "json_execute_serialized_sql", "checkpoint", "force_checkpoint", "enable_logging",
    "disable_logging", "truncate_duckdb_logs", "enable_profiling", "disable_profiling", "nextval", "setval",
    "currval",
})


class UnsafeSQLError(TrajlakeError):
    """User SQL that could write, or read outside what it may read; nothing was run."""


def _parse_tree(sql: str) -> dict:
    """DuckDB's parse tree of SELECT statement(s) `sql` as JSON; raises duckdb.Error on a syntax error."""
    # a cursor per call: threads checking at once would otherwise fetch each other's results off one connection
    with _con().cursor() as cur:
        tree = json.loads(cur.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        raise duckdb.ParserException(tree.get("error_message", "cannot parse"))
    return tree


@lru_cache(maxsize=1)
def _con() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()  # parsing only: never attached to a lake


def _nodes(node) -> Iterator[dict]:
    """Every object of the parse tree, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def _function(node: dict) -> tuple[str, str] | None:
    """(qualifier, name) of a function call node (scalar or table), lower case; None for other nodes."""
    if node.get("class") == "FUNCTION" and "function_name" in node:
        qualifier = node.get("catalog") or node.get("schema") or ""
        return qualifier.lower(), str(node["function_name"]).lower()
    return None


def _refused_function(qualifier: str, name: str) -> str | None:
    """Why the call `qualifier.name(...)` is refused in a read, or None when it only reads."""
    if name in _REFUSED_ALWAYS:
        return f"{name}() runs SQL of its own or changes the database"
    if name.startswith("ducklake_") and name.removeprefix("ducklake_") not in READ_ONLY_DUCKLAKE:
        return f"{name}() changes the lake (maintenance belongs to `trajlake maintain`)"
    if qualifier not in _BUILTIN_QUALIFIERS and name not in READ_ONLY_DUCKLAKE:
        return f"{qualifier}.{name}() is a catalog function that may change the lake"
    return None


def check_query(sql: str) -> None:
    """Refuse a read-only statement (already known to be one SELECT) that calls a function that could change the
    lake or run SQL hidden from this check. Statements DuckDB cannot show as a parse tree pass unchecked: only
    SELECT can, and the read-only rule (store.attach.check_read_only) admits nothing else."""
    try:
        tree = _parse_tree(sql)
    except duckdb.Error:
        return  # the query itself reports its syntax error, in DuckDB's words
    for node in _nodes(tree):
        call = _function(node)
        if call:
            why = _refused_function(*call)
            if why:
                raise UnsafeSQLError(f"refused: {why}; sql and export only read")


def check_expression(expr: str, what: str, tables: Collection[str]) -> None:
    """Refuse `expr` unless it is one SQL expression whose subqueries read only `tables` (bare names) and call
    no table function, no catalog function and nothing of `_REFUSED_ALWAYS`. `what` names the fragment in the
    error (e.g. "rewards --where"). It is pasted into queries on the connection that writes, hence the rule."""
    if not isinstance(expr, str) or not expr.strip():
        raise UnsafeSQLError(f"{what} must be a non-empty SQL expression")
    try:
        duckdb.SQLExpression(expr)  # exactly one expression: a `)` or `;` cannot end it and start SQL of its own
        tree = _parse_tree(f"SELECT 1 WHERE (\n{expr}\n)")  # newlines: a trailing `--` comment ends at its line
    except duckdb.Error as e:
        raise UnsafeSQLError(f"{what} {expr!r} is not one SQL expression: {_first_line(str(e))}") from None
    allowed = {t.lower() for t in tables}
    ctes = {name.lower() for node in _nodes(tree) for name in _cte_names(node)}
    for node in _nodes(tree):
        if node.get("type") == "TABLE_FUNCTION":
            name = _function(node.get("function") or {}) or ("", "?")
            raise UnsafeSQLError(f"refused: {what} may not call table function {name[1]}(); a filter reads the "
                                 f"lake's tables ({', '.join(sorted(allowed))}) only")
        if node.get("type") == "BASE_TABLE":
            qualified = node.get("catalog_name") or node.get("schema_name")
            table = str(node.get("table_name", "")).lower()
            if qualified or (table not in allowed and table not in ctes):
                shown = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"),
                                             node.get("table_name")) if p)
                raise UnsafeSQLError(f"refused: {what} may read the lake's tables only "
                                     f"({', '.join(sorted(allowed))}), not {shown!r}")
        call = _function(node)
        if call:
            qualifier, name = call
            if name in _REFUSED_ALWAYS or name.startswith("ducklake_") or qualifier not in _BUILTIN_QUALIFIERS:
                shown = f"{qualifier}.{name}" if qualifier else name
                raise UnsafeSQLError(f"refused: {what} may not call {shown}(): a filter may use columns, "
                                     "operators, scalar functions and subqueries over the lake's tables only")


def check_filter(expr: str, what: str) -> None:
    """`check_expression` over the lake's own tables and views (schemas/): the rule for every user filter."""
    from trajlake.schemas.tables import TABLES
    from trajlake.schemas.views import VIEWS

    check_expression(expr, what, [*TABLES, *VIEWS])


def _cte_names(node: dict) -> list[str]:
    cte_map = node.get("cte_map")
    if not isinstance(cte_map, dict):
        return []
    return [entry.get("key", "") for entry in cte_map.get("map", []) if isinstance(entry, dict)]


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg


__all__ = ["READ_ONLY_DUCKLAKE", "UnsafeSQLError", "check_expression", "check_filter", "check_query"]
