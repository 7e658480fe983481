"""Writing values into SQL text, for the places where a bound parameter cannot go (ATTACH options, views,
generated scoring queries). Everywhere else, queries take parameters."""

from __future__ import annotations

from collections.abc import Iterable


def sql_str(s: str) -> str:
    """`s` as a SQL string literal (single quotes doubled)."""
    return "'" + s.replace("'", "''") + "'"


def sql_list(values: Iterable[str]) -> str:
    """The string literals of `values`, comma-separated (for `IN (...)`)."""
    return ", ".join(sql_str(v) for v in values)


__all__ = ["sql_str", "sql_list"]
