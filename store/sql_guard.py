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
subquery, a CTE, a join or a lambda is found wherever it sits. A fragment's table names are read with SQL's
scoping: a CTE's name means the CTE only where that CTE is in scope (elsewhere the same bare name is a catalog or
system view, e.g. `duckdb_tables`). Both refuse SQL nested deeper than MAX_DEPTH levels, in one line, before
anything recurses that deep.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from functools import lru_cache

import duckdb

from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_str

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
#: the prefixes of functions that reach another database: a PostgreSQL or SQLite catalog's own (where they run
#: SQL given as text, hidden from this check: `postgres_execute('__ducklake_metadata_lake', ...)`), or any
#: other by its connection string, or attach one
_OTHER_DATABASE = ("postgres_", "sqlite_", "mysql_", "pg_clear_cache")
#: how deep user SQL may nest: brackets, and levels of the parse tree (an operator, a function call, a query);
#: the lake's own queries and any sensible filter stay far below, and json's decoder, a Python walk and DuckDB's
#: parser all recurse per level
MAX_DEPTH = 128
#: what DuckDB's parser says of SQL nested past its limits (its max_expression_depth, its parser stack)
_DEPTH_ERRORS = ("max expression depth", "memory exhausted")


class UnsafeSQLError(TrajlakeError):
    """User SQL that could write, or read outside what it may read; nothing was run."""


class SQLNestingError(UnsafeSQLError):
    """User SQL nested deeper than MAX_DEPTH levels; refused before anything walks it (a Python walk, or DuckDB's
    parser, recursing that deep would fail with RecursionError or tell the user to raise a setting)."""


def nesting_error(what: str) -> SQLNestingError:
    return SQLNestingError(f"refused: {what} nests deeper than {MAX_DEPTH} levels (of brackets, operators or "
                           "subqueries)")


def sql_tokens(sql: str, what: str = "SQL") -> list[tuple[int, duckdb.token_type]]:
    """`duckdb.tokenize(sql)` with each token's position as an index into `sql` (DuckDB gives the byte offset in
    UTF-8, which differs from the character index once a character before it is not ASCII). Text that cannot be
    UTF-8 (a lone surrogate: what Python makes of a command-line byte that is not UTF-8) is refused by name; the
    tokenizer would raise a TypeError on it."""
    try:
        data = sql.encode()
    except UnicodeEncodeError as e:
        raise UnsafeSQLError(f"{what} is not valid text: character {e.start + 1} is a lone surrogate "
                            f"(U+{ord(sql[e.start]):04X}; a byte that is not UTF-8?)") from None
    tokens = duckdb.tokenize(sql)
    if len(data) == len(sql):  # ASCII: bytes are characters
        return tokens
    char_at = [0] * (len(data) + 1)
    offset = 0
    for index, char in enumerate(sql):
        char_at[offset] = index
        offset += len(char.encode())
    char_at[offset] = len(sql)
    return [(char_at[start], kind) for start, kind in tokens]


def check_nesting(sql: str, what: str) -> None:
    """Refuse `sql` when its brackets nest deeper than MAX_DEPTH. DuckDB's tokenizer tells a bracket from one in
    a string, a quoted name or a comment. (DuckDB drops redundant parentheses from its parse tree, so the tree's
    depth alone would let 5000 of them through to its parser, whose stack gives out at about 10000.)"""
    try:
        tokens = sql_tokens(sql, what)
    except duckdb.Error:
        return  # the parser reports it
    depth = 0
    for start, kind in tokens:  # a token's position is its first character's
        if kind == duckdb.token_type.operator and sql[start] in "([":
            depth += 1
            if depth > MAX_DEPTH:
                raise nesting_error(what)
        elif kind == duckdb.token_type.operator and sql[start] in ")]":
            depth -= 1


def too_deep(message: str) -> bool:
    """Whether DuckDB's parser gave up on `message`'s SQL for its nesting (its expression depth limit, or its
    parser stack)."""
    return any(text in message.lower() for text in _DEPTH_ERRORS)


def parse_expression(expr: str, what: str) -> duckdb.Expression:
    """`duckdb.SQLExpression(expr)` (one expression, or duckdb.Error), with nesting past MAX_DEPTH refused as
    SQLNestingError first: the checks that parse a filter before `check_filter` use this."""
    check_nesting(expr, what)
    try:
        return duckdb.SQLExpression(expr)
    except duckdb.Error as e:
        if too_deep(str(e)):
            raise nesting_error(what) from None
        raise


def _parse_tree(sql: str, what: str) -> dict:
    """DuckDB's parse tree of SELECT statement(s) `sql` as JSON; raises duckdb.Error on a syntax error and
    SQLNestingError where it nests too deep to read."""
    # a cursor per call: threads checking at once would otherwise fetch each other's results off one connection
    with _con().cursor() as cur:
        if "\x00" in sql:  # a NUL would end a literal early; a parameter carries it (and costs pandas' import)
            text = cur.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
        else:  # a literal, not a parameter: DuckDB imports pandas (half a second) to look at a parameter list
            text = cur.execute(f"SELECT json_serialize_sql({sql_str(sql)})").fetchone()[0]
    try:
        tree = json.loads(text)
    except RecursionError:  # json's decoder recurses per level: a tree past Python's stack is past MAX_DEPTH
        raise nesting_error(what) from None
    if tree.get("error"):
        message = tree.get("error_message", "cannot parse")
        if too_deep(message):
            raise nesting_error(what)
        raise duckdb.ParserException(message)
    return tree


@lru_cache(maxsize=1)
def _con() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()  # parsing only: never attached to a lake


def _walk(tree: dict, what: str) -> Iterator[tuple[dict, frozenset[str]]]:
    """Every object of the parse tree, depth first, with the CTE names in scope where it sits; SQLNestingError
    past MAX_DEPTH levels. A stack of (node, scope, depth), not recursion: a deep tree cannot overflow Python's.

    SQL's scoping, as DuckDB binds it: a WITH's CTEs are visible in its query's body (and the subqueries nested
    there), and each CTE's own query sees the CTEs before it; a recursive CTE's recursive term sees the CTE
    itself, its anchor does not. A name outside that scope is whatever the catalog holds by that name."""
    stack: list[tuple[object, frozenset[str], int]] = [(tree, frozenset(), 0)]
    while stack:
        node, scope, depth = stack.pop()
        if isinstance(node, list):
            stack.extend((value, scope, depth) for value in reversed(node))
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("type"), str):  # an expression, query or table reference: one level
            depth += 1
            if depth > MAX_DEPTH:
                raise nesting_error(what)
        yield node, scope
        body, later = scope, []
        for entry in _cte_entries(node):  # each CTE sees those before it; the body sees them all
            later.append((entry.get("value"), body, depth))
            body = body | {str(entry.get("key", "")).lower()}
        children = {k: v for k, v in node.items() if k != "cte_map"}
        if node.get("type") == "RECURSIVE_CTE_NODE":
            itself = body | {str(node.get("cte_name", "")).lower()}
            later.append((children.pop("right", None), itself, depth))
        later += [(value, body, depth) for value in children.values()]
        stack.extend(reversed(later))


def _scope_hint(tree: dict, table: str, what: str) -> str:
    """Why `table` is not the CTE of that name the SQL defines, if it defines one elsewhere."""
    defined = {str(e.get("key", "")).lower() for node, _ in _walk(tree, what) for e in _cte_entries(node)}
    return (f" (the CTE {table} is in scope only in the query that defines it and those nested there)"
            if table in defined else "")


def _cte_entries(node: dict) -> list[dict]:
    cte_map = node.get("cte_map")
    if not isinstance(cte_map, dict):
        return []
    return [entry for entry in cte_map.get("map", []) if isinstance(entry, dict)]


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
    if name.startswith(_OTHER_DATABASE):
        return f"{name}() reaches a database beside the lake (a catalog's own, or any other)"
    if name.startswith("ducklake_") and name.removeprefix("ducklake_") not in READ_ONLY_DUCKLAKE:
        return f"{name}() changes the lake (maintenance belongs to `trajlake maintain`)"
    if qualifier not in _BUILTIN_QUALIFIERS and name not in READ_ONLY_DUCKLAKE:
        return f"{qualifier}.{name}() is a catalog function that may change the lake"
    return None


def check_query(sql: str) -> None:
    """Refuse a read-only statement (already known to be one SELECT) that calls a function that could change the
    lake or run SQL hidden from this check, or that nests deeper than MAX_DEPTH. Statements DuckDB cannot show
    as a parse tree pass unchecked: only SELECT can, and the read-only rule (store.attach.check_read_only) admits
    nothing else."""
    check_nesting(sql, "the query")
    try:
        tree = _parse_tree(sql, "the query")
    except duckdb.Error:
        return  # the query itself reports its syntax error, in DuckDB's words
    for node, _ in _walk(tree, "the query"):
        call = _function(node)
        if call:
            why = _refused_function(*call)
            if why:
                raise UnsafeSQLError(f"refused: {why}; sql and export only read")


def check_expression(expr: str, what: str, tables: Collection[str]) -> None:
    """Refuse `expr` unless it is one SQL expression whose subqueries read only `tables` (bare names) or CTEs in
    scope where they are read, call no table function, no catalog function and nothing of `_REFUSED_ALWAYS`,
    and nest at most MAX_DEPTH levels. `what` names the fragment in the error (e.g. "rewards --where"). It is
    pasted into queries on the connection that writes, hence the rule."""
    if not isinstance(expr, str) or not expr.strip():
        raise UnsafeSQLError(f"{what} must be a non-empty SQL expression")
    try:
        parse_expression(expr, what)  # one expression: a `)` or `;` cannot end it and start SQL of its own
        tree = _parse_tree(f"SELECT 1 WHERE (\n{expr}\n)", what)  # newlines: a trailing `--` comment ends there
    except duckdb.Error as e:
        raise UnsafeSQLError(f"{what} {_shown(expr)} is not one SQL expression: {_first_line(str(e))}") from None
    allowed = {t.lower() for t in tables}
    for node, ctes in _walk(tree, what):
        why = _refused_node(node, ctes, allowed, what)
        if why:
            if node.get("type") == "BASE_TABLE":
                why += _scope_hint(tree, str(node.get("table_name", "")).lower(), what)
            raise UnsafeSQLError(f"refused: {why}")


def _refused_node(node: dict, ctes: Collection[str], allowed: set[str], what: str) -> str | None:
    """Why one node of a filter's parse tree is refused (check_expression's rule), or None."""
    kind = node.get("type")
    lake_tables = ", ".join(sorted(allowed))
    if kind == "TABLE_FUNCTION":
        name = _function(node.get("function") or {}) or ("", "?")
        return f"{what} may not call table function {name[1]}(); a filter reads the lake's tables ({lake_tables}) only"
    if kind == "SHOW_REF":  # DESCRIBE, SHOW, SUMMARIZE: they read the catalog's own tables
        return f"{what} may not use DESCRIBE, SHOW or SUMMARIZE; a filter reads the lake's tables ({lake_tables}) only"
    if kind == "BASE_TABLE":
        qualified = node.get("catalog_name") or node.get("schema_name")
        table = str(node.get("table_name", "")).lower()
        if qualified or (table not in allowed and table not in ctes):
            shown = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"), node.get("table_name"))
                             if p)
            return f"{what} may read the lake's tables only ({lake_tables}), not {shown!r}"
        return None
    call = _function(node)
    if call:
        qualifier, name = call
        if (name in _REFUSED_ALWAYS or name.startswith(("ducklake_", *_OTHER_DATABASE))
                or qualifier not in _BUILTIN_QUALIFIERS):
            shown = f"{qualifier}.{name}" if qualifier else name
            return (f"{what} may not call {shown}(): a filter may use columns, operators, scalar functions and "
                    "subqueries over the lake's tables only")
    return None


def check_filter(expr: str, what: str) -> None:
    """`check_expression` over the lake's own tables and views (schemas/): the rule for every user filter."""
    from trajlake.schemas.tables import TABLES
    from trajlake.schemas.views import VIEWS

    check_expression(expr, what, [*TABLES, *VIEWS])


def _shown(expr: str) -> str:
    """`expr` quoted for an error line, cut short: a refused filter may be thousands of characters."""
    return repr(expr if len(expr) <= 120 else expr[:100] + "...")


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg


__all__ = ["MAX_DEPTH", "READ_ONLY_DUCKLAKE", "SQLNestingError", "UnsafeSQLError", "check_expression", "check_filter",
           "check_nesting", "check_query", "nesting_error", "parse_expression", "sql_tokens", "too_deep"]
