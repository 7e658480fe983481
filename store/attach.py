"""Attaching a lake's catalog (and what its errors mean), and the read-only rule of `Lake.query` on a lake
opened read-only: store/connect.py attaches with the first, store/query.py applies the second."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import duckdb

from trajlake.core.errors import CatalogError, LakeLockedError, TrajlakeError
from trajlake.store import extensions, objectstore
from trajlake.store.sql_guard import check_nesting, check_query, nesting_error, sql_tokens, too_deep
from trajlake.store.uri import CatalogURI

ALIAS = "lake"


def _attach(con: duckdb.DuckDBPyConnection, catalog: CatalogURI, *, read_only: bool = False,
            override: bool = False) -> CatalogURI:
    """Attach the lake; returns the catalog URI as opened (with the catalog's own data path when the URI left
    it to the default and the lake keeps its data on object storage)."""
    try:
        con.execute(catalog.attach_sql(ALIAS, read_only=read_only, override_data_path=override))
        return catalog
    except duckdb.Error as e:
        msg = str(e)
    if read_only and any(text in msg for text in catalog.kind.missing_on_read_only):
        # DuckLake tried to create its metadata tables: there is no lake in that database and schema
        raise CatalogError(f"cannot open lake {catalog.raw}: no lake there (a write command such as collect or "
                           "import creates one)") from None
    if "Could not set lock" in msg or "Conflicting lock" in msg:
        holder = msg.split("Conflicting lock is held in", 1)[-1].split("See also")[0].strip()
        raise LakeLockedError(
            f"lake {catalog.raw} is open in another process ({holder}); a DuckDB-file catalog admits "
            "one process at a time: for several processes use a sqlite:FILE or postgres:CONNINFO lake (a running "
            "train run also writes its metrics to <checkpoint_dir>/<run_id>/metrics.jsonl)"
        ) from None
    hint = ""
    if "does not match existing data path" in msg:
        stored = re.search(r'existing data path in the catalog "(.*?)"', msg)
        if not catalog.data_path_given and stored and objectstore.is_remote(stored.group(1)):
            # the URI left data_path to the default, and the lake keeps its data on object storage: use that
            objectstore.check_data_path(stored.group(1))
            opened = replace(catalog, data_path=stored.group(1))
            for name in opened.extensions:
                if name not in catalog.extensions:
                    con.load_extension(str(extensions.extension_path(name)))
            objectstore.configure(con, opened.data_path)
            opened = _attach(con, opened, read_only=read_only)
            try:  # the unused default data folder prepare() made, if it is empty
                Path(catalog.data_path).rmdir()
            except OSError:
                pass
            return opened
        if catalog.folder_data and stored and not override and _holds_files(catalog.data_path):
            # a folder (or sqlite file and its .data folder) moved or copied: its data is the copy beside it,
            # not the folder it was made in (which may be gone, or another lake's now)
            return _attach(con, catalog, read_only=read_only, override=True)
        hint = " (leave data_path out to use the catalog's)" if catalog.data_path_given else ""
    raise CatalogError(f"cannot open lake {catalog.raw}: {_first_line(msg)}{hint}") from None


def _holds_files(folder: str) -> bool:
    try:
        return any(Path(folder).iterdir())
    except OSError:
        return False


#: the statements a read-only query may run: reads, and EXPLAIN of a read
_READ_STATEMENTS = ("SELECT", "EXPLAIN")


def check_read_only(sql: str) -> None:
    """Refuse SQL that is not exactly one read statement (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE,
    VALUES, EXPLAIN of a read), naming what is refused. DuckDB's parser tells the statement types; the
    read-only attach stops anything else (e.g. a table function that writes) from reaching the lake."""
    check_nesting(sql, "the query")  # before DuckDB's parser: past its limits it tells the user to SET one
    statement = _one_statement(sql)
    if statement.type.name == "EXPLAIN":
        statement = _one_statement(_explained(statement.query))
        if statement.type.name != "SELECT":
            raise TrajlakeError(f"EXPLAIN {statement.type.name} is refused: the lake is read-only here (sql and "
                                "export only read)")
    # a read-only attach refuses a maintenance function's commit only after it deleted or wrote files
    check_query(statement.query)


def _one_statement(sql: str) -> duckdb.Statement:
    """The one read statement `sql` holds; TrajlakeError naming what else it holds."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        if too_deep(str(e)):
            raise nesting_error("the query") from None
        raise TrajlakeError(f"query failed: {_first_line(str(e))}") from None
    kinds = [s.type.name for s in statements]
    if not kinds:
        raise TrajlakeError("no SQL statement given")
    if len(kinds) != 1:
        raise TrajlakeError(f"one statement at a time, got {len(kinds)} ({', '.join(kinds)}): "
                            "the lake is read-only here")
    if kinds[0] not in _READ_STATEMENTS:
        raise TrajlakeError(f"{kinds[0]} statements are refused: the lake is read-only here (sql and export only "
                            "read; the store changes through collect, import, rewards and train)")
    return statements[0]


def _explained(sql: str) -> str:
    """The statement an EXPLAIN [ANALYZE] statement explains. DuckDB's tokenizer finds its words, so comments
    before, between or after them (`/* x */ EXPLAIN -- y`) are skipped as DuckDB skips them."""
    tokens = sql_tokens(sql)
    words = [re.match(r"[A-Za-z]*", sql[start:]).group().upper() for start, _ in tokens[:2]]
    skip = 1 + (len(words) > 1 and words[1] in ("ANALYZE", "ANALYSE"))
    if not words or words[0] != "EXPLAIN" or len(tokens) <= skip:
        raise TrajlakeError("EXPLAIN must be followed by the statement it explains")
    return sql[tokens[skip][0]:]


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg
