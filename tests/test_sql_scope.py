"""A CTE's name holds only where SQL's scoping puts it, user SQL nests at most MAX_DEPTH levels, and read-only
SQL reaches no database beside the lake (store/sql_guard.py, store/attach.py).

A filter may read a CTE it defines, but the same bare name in a subquery where that CTE is not in scope is a
catalog or system view (`duckdb_tables`): refused there, through every filter that is a config field (the CLI
options are tests/test_bad_inputs_sql.py's), on every catalog. Nesting past the cap is refused in one line
naming it, never a RecursionError or DuckDB's advice to raise a setting. EXPLAIN behind comments is read.
"""

from __future__ import annotations

import pytest

from tests.conftest import BACKENDS, make_uri
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Episode
from trajlake.store import Lake
from trajlake.store.attach import check_read_only
from trajlake.store.sql_guard import MAX_DEPTH, SQLNestingError, UnsafeSQLError, check_filter, check_query

#: a CTE's name read where that CTE is out of scope: the name is DuckDB's system view there
SHADOWED = {
    "sibling IN subqueries": "run_id IN (WITH duckdb_tables AS (SELECT 1 AS x) SELECT x FROM duckdb_tables) "
                             "OR run_id IN (SELECT table_name FROM duckdb_tables)",
    "sibling UNION branch": "run_id IN ((WITH duckdb_settings AS (SELECT 'a' AS name) SELECT name FROM "
                            "duckdb_settings) UNION ALL SELECT name FROM duckdb_settings)",
    "IN subquery, then scalar": "run_id IN (WITH duckdb_databases AS (SELECT 'x' AS path) SELECT path FROM "
                                "duckdb_databases) OR (SELECT count(*) FROM duckdb_databases) > 0",
    "scalar subquery, then IN": "(SELECT count(*) FROM (WITH duckdb_views AS (SELECT 1) SELECT * FROM duckdb_views))"
                                " > 0 AND run_id IN (SELECT view_name FROM duckdb_views)",
    "defined in a later CTE": "run_id IN (WITH a AS (SELECT database_name FROM duckdb_databases), duckdb_databases "
                              "AS (SELECT 'x' AS database_name) SELECT * FROM a)",
    "a CTE reading its own name": "run_id IN (WITH duckdb_tables AS (SELECT table_name FROM duckdb_tables) "
                                  "SELECT table_name FROM duckdb_tables)",
    "a recursive CTE's anchor": "run_id IN (WITH RECURSIVE duckdb_tables AS (SELECT table_name FROM duckdb_tables "
                                "UNION ALL SELECT table_name FROM duckdb_tables WHERE false) SELECT table_name FROM "
                                "duckdb_tables)",
    "nested WITH, read outside": "run_id IN (SELECT x FROM (WITH duckdb_tables AS (SELECT 1 AS x) SELECT x FROM "
                                 "duckdb_tables) q) AND EXISTS (SELECT 1 FROM duckdb_tables)",
    "nested WITH named as a lake table": "run_id IN (WITH episodes AS (SELECT table_name AS run_id FROM "
                                         "duckdb_tables) SELECT run_id FROM episodes)",
}
#: CTEs read where they are in scope (and a CTE named as a lake table beside that table): fine
SCOPED = [
    "run_id IN (WITH r AS (SELECT run_id FROM runs) SELECT run_id FROM r)",
    "run_id IN (WITH r AS (SELECT run_id FROM runs) SELECT run_id FROM r WHERE run_id IN (SELECT run_id FROM r))",
    "run_id IN (WITH a AS (SELECT run_id FROM runs), b AS (SELECT * FROM a) SELECT run_id FROM b)",
    "run_id IN (WITH r AS (SELECT run_id FROM runs) SELECT run_id FROM r UNION SELECT run_id FROM r)",
    "run_id IN (WITH a AS (SELECT run_id FROM runs) SELECT * FROM (WITH b AS (SELECT * FROM a) SELECT * FROM b))",
    "run_id IN (WITH a AS MATERIALIZED (SELECT run_id FROM runs) SELECT * FROM A)",
    "num_turns IN (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM (SELECT * FROM n) WHERE i < 5) "
    "SELECT i FROM n)",
    "run_id IN (WITH runs AS (SELECT 'x' AS run_id) SELECT run_id FROM runs) OR run_id IN (SELECT run_id FROM runs)",
]
#: filters nested past the cap, as brackets, operators and subqueries
DEEP = {
    "5000 parentheses": "(" * 5000 + "success" + ")" * 5000,
    "5000 NOTs": "NOT " * 5000 + "success",
    "300 NOTs": "NOT " * 300 + "success",
    "3000 terms": "+".join(["num_turns"] * 3000) + " > 0",
    "200 subqueries": "run_id IN " + "(SELECT run_id FROM runs WHERE run_id IN " * 200 + "(SELECT 'r1')" + ")" * 200,
    "2000 subqueries": "run_id IN " + "(SELECT run_id FROM runs WHERE run_id IN " * 2000 + "(SELECT 'r1')" + ")" * 2000,
    "200 list brackets": "[" * 200 + "1" + "]" * 200 + " IS NOT NULL",
}


@pytest.mark.parametrize("expr", SHADOWED.values(), ids=SHADOWED.keys())
def test_a_cte_name_out_of_its_scope_is_the_catalogs(expr):
    with pytest.raises(UnsafeSQLError, match=r"refused: --where may read the lake's tables only .* not 'duckdb_"):
        check_filter(expr, "--where")


def test_the_refusal_says_where_the_cte_holds():
    with pytest.raises(UnsafeSQLError, match="the CTE duckdb_tables is in scope only in the query that defines it"):
        check_filter(SHADOWED["sibling IN subqueries"], "--where")


@pytest.mark.parametrize("expr", SCOPED)
def test_a_cte_in_scope_may_be_read(expr):
    check_filter(expr, "--where")


@pytest.mark.parametrize("expr", DEEP.values(), ids=DEEP.keys())
def test_a_filter_nested_too_deep_is_refused_in_one_line(expr):
    with pytest.raises(SQLNestingError) as e:
        check_filter(expr, "--where")
    assert str(e.value) == f"refused: --where nests deeper than {MAX_DEPTH} levels (of brackets, operators or " \
                           "subqueries)"


def test_the_cap_is_the_cap():
    check_filter("(" * MAX_DEPTH + "success" + ")" * MAX_DEPTH, "--where")
    check_filter("'" + "(" * 1000 + "' = env -- " + "(" * 1000, "--where")  # in a string or comment: no nesting
    with pytest.raises(SQLNestingError):
        check_filter("(" * (MAX_DEPTH + 1) + "success" + ")" * (MAX_DEPTH + 1), "--where")


@pytest.mark.parametrize("expr", DEEP.values(), ids=DEEP.keys())
def test_a_query_nested_too_deep_is_refused_in_one_line(expr):
    with pytest.raises(SQLNestingError, match=f"refused: the query nests deeper than {MAX_DEPTH} levels"):
        check_read_only(f"SELECT count(*) FROM episodes WHERE {expr}")


def test_a_spec_expression_nested_too_deep_is_refused():
    from trajlake.rewards.expr_checks import check_sql

    with pytest.raises(SQLNestingError, match="component x nests deeper"):
        check_sql("NOT " * 5000 + "true", "episodes", "component x")


@pytest.mark.parametrize("sql", ["/* x */ EXPLAIN /* y */ SELECT 1", "-- c\nEXPLAIN SELECT 1",
                                 "explain/**/analyse--z\nselect 1", "EXPLAIN /* a */ ANALYZE /* b */ FROM episodes"])
def test_explain_behind_comments_is_read(sql):
    check_read_only(sql)


@pytest.mark.parametrize("sql, text", [
    ("/* x */ EXPLAIN /* y */ DELETE FROM turns", "DELETE statements are refused"),
    ("-- c\nEXPLAIN COPY episodes TO 'x.csv'", "COPY statements are refused"),
    ("EXPLAIN /* a */ ANALYZE -- b\nSELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",
     "refused: ducklake_cleanup_old_files()"),
    ("/**/EXPLAIN SELECT " + "NOT " * 5000 + "true", "nests deeper than"),
])
def test_explain_behind_comments_of_a_write_is_refused(sql, text):
    with pytest.raises(TrajlakeError, match=text.replace("(", r"\(").replace(")", r"\)")):
        check_read_only(sql)


@pytest.mark.parametrize("call", [
    "postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
    "postgres_execute('__ducklake_metadata_lake', 'DROP SCHEMA s CASCADE')",
    "postgres_scan('dbname=test', 'public', 'ducklake_snapshot')", "postgres_attach('dbname=test')",
    "sqlite_query('__ducklake_metadata_lake', 'DELETE FROM ducklake_snapshot')", "sqlite_attach('c.sqlite')",
    "sqlite_scan('c.sqlite', 'ducklake_snapshot')", "pg_clear_cache()",
])
def test_a_query_reaches_no_database_beside_the_lake(call):
    with pytest.raises(UnsafeSQLError, match="reaches a database beside the lake"):
        check_query(f"SELECT * FROM {call}")
    with pytest.raises(UnsafeSQLError, match="refused: --where may not call"):
        check_filter(f"EXISTS (FROM {call})", "--where")


@pytest.fixture(scope="module", params=BACKENDS)
def lake(request, tmp_path_factory):
    """A lake per catalog for the module: two episodes of run r1."""
    tmp = tmp_path_factory.mktemp("scope")

    class Request:  # make_uri asks for the function-scoped pg_schema fixture: a schema dropped at the end here
        schema = None

        @classmethod
        def getfixturevalue(cls, name):
            import uuid

            from tests.conftest import _pg_available

            why = _pg_available()
            if why:
                pytest.skip(why)
            cls.schema = "trajlake_scope_" + uuid.uuid4().hex[:10]
            return cls.schema

    lk = Lake.open(make_uri(request.param, tmp, Request))
    lk.append({"episodes": [Episode(f"e{i}", run_id="r1", env="doors", success=i == 0) for i in range(2)]},
              stage="test", run_id="r1")
    yield lk
    lk.close()
    if Request.schema:
        import psycopg

        from tests.conftest import pg_conninfo

        with psycopg.connect(pg_conninfo(), autocommit=True) as con:
            con.execute(f'DROP SCHEMA IF EXISTS "{Request.schema}" CASCADE')


@pytest.mark.parametrize("field", ["sft_filter", "train_filter", "replay_filter"])
def test_config_filters_keep_ctes_in_scope(field, lake):
    from trajlake.train.batch import check_episode_filter
    from trajlake.train.config import ConfigError

    snapshots = lake.snapshots().height
    for name, expr in [*SHADOWED.items(), ("nested too deep", DEEP["5000 NOTs"])]:
        with pytest.raises(ConfigError, match=f"refused: train config: {field} ") as e:
            check_episode_filter(lake, expr, field=field)
        assert "\n" not in str(e.value), name
    for expr in ["episode_id IN (WITH e AS (SELECT episode_id FROM episodes) SELECT episode_id FROM e)",
                 "episode_id IN (WITH a AS (SELECT episode_id FROM episodes), b AS (SELECT * FROM a) "
                 "SELECT episode_id FROM b UNION SELECT episode_id FROM a WHERE episode_id IN (SELECT * FROM b))"]:
        assert check_episode_filter(lake, expr, field=field) == 2
    assert lake.snapshots().height == snapshots


def test_a_task_selector_keeps_ctes_in_scope(lake, tmp_path):
    from trajlake.train.task_select import TaskSelectorError, candidate_table, selector_query

    query = tmp_path / "q.sql"
    for name, expr in [*SHADOWED.items(), ("nested too deep", DEEP["5000 NOTs"])]:
        query.write_text(f"SELECT task_id FROM candidates WHERE {expr.replace('run_id', 'task_id')}")
        with pytest.raises(TaskSelectorError, match=f"task_selector {query}: refused") as e:
            selector_query(str(query))
        assert "\n" not in str(e.value), name
    query.write_text("WITH c AS (SELECT task_id, position FROM candidates) SELECT task_id FROM c WHERE task_id NOT "
                     "IN (WITH done AS (SELECT task_id FROM episodes) SELECT task_id FROM done) ORDER BY position")
    sql = selector_query(str(query))
    out = lake.query(sql, tables={"candidates": candidate_table([])})
    assert out.columns == ["task_id"]
