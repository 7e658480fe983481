"""SQL tricks through every place a user's SQL reaches the lake, and script payloads in ids, generated: each
writing statement DuckDB has and each DuckLake function that writes (expire, cleanup, flush, merge, orphans,
rewrite, options) in `sql` and `export --query`, and as a subquery in every filter (`rewards --where`,
`rewards diff --where`, `export --dataset --where`, `train --train-filter`, a spec's `sql` expression, a
`--task-selector` query file); a CTE's name read where it is out of scope; SQL nested past the guard's cap. Every
one is refused in one line with the lake's snapshots, rows and data files unchanged (tests/bad_inputs_common).

The cases where the catalog matters (read-only SQL that writes, filters that read or reach the catalog's own
tables) run on all three catalogs, with a module-scoped lake each: on PostgreSQL the metadata tables live in the
server (`__ducklake_metadata_lake.<schema>`, reachable through `postgres_query` and its kin), on SQLite in a file
DuckDB reads through its extension.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import bad_inputs_common as common
from tests.bad_inputs_common import CATALOG_SAMPLE, Case, case, check_case, params
from tests.test_sql_scope import DEEP, SHADOWED

setting = common.setting  # the module's lake and files (a fixture)

L = ("--lake", "{lake}")

#: subqueries that write, read outside the lake's tables, or run other SQL: refused in a filter
#: ({{ }} survive the setting's formatting as braces)
FILTER_CALLS = [
    "(SELECT count(*) FROM ducklake_expire_snapshots('lake', older_than => now())) < 0",
    "(SELECT count(*) FROM ducklake_expire_snapshots('lake', versions => [1])) < 0",
    "(SELECT count(*) FROM ducklake_cleanup_old_files('lake', cleanup_all => true)) < 0",
    "(SELECT count(*) FROM ducklake_delete_orphaned_files('lake', cleanup_all => true)) < 0",
    "(SELECT count(*) FROM ducklake_flush_inlined_data('lake')) < 0",
    "(SELECT count(*) FROM ducklake_merge_adjacent_files('lake')) < 0",
    "(SELECT count(*) FROM ducklake_rewrite_data_files('lake')) < 0",
    "(SELECT count(*) FROM ducklake_set_option('lake', 'data_inlining_row_limit', 0)) < 0",
    "(SELECT count(*) FROM ducklake_add_data_files('lake', 'episodes', '{data}/x.parquet')) < 0",
    "(SELECT count(*) FROM ducklake_snapshots('lake')) > 0",
    "(SELECT count(*) FROM ducklake_table_info('lake')) > 0",
    "(SELECT count(*) FROM ducklake_list_files('lake', 'episodes')) > 0",
    "(SELECT count(*) FROM read_parquet('{data}/**/*.parquet')) > 0",
    "(SELECT count(*) FROM read_text('/etc/passwd')) > 0",
    "(SELECT count(*) FROM read_csv('{catalog}')) > 0",
    "(SELECT count(*) FROM query('DELETE FROM episodes')) > 0",
    "(SELECT count(*) FROM query_table('episodes')) > 0",
    "(SELECT count(*) FROM duckdb_settings()) > 0",
    "(SELECT count(*) FROM duckdb_databases()) > 0",
    "(SELECT count(*) FROM glob('/*')) > 0",
    "(SELECT count(*) FROM __ducklake_metadata_lake.ducklake_snapshot) > 0",
    "success AND EXISTS (SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true))",
    "episode_id IN (SELECT snapshot_id::VARCHAR FROM ducklake_expire_snapshots('lake', older_than => now()))",
    # the catalog's own tables, by name and through the functions that reach its database
    "(SELECT count(*) FROM {meta}.ducklake_snapshot) > 0",
    "(SELECT count(*) FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')) > 0",
    "EXISTS (FROM postgres_execute('__ducklake_metadata_lake', 'DELETE FROM {pgschema}.ducklake_snapshot_changes'))",
    "(SELECT count(*) FROM postgres_scan('{conninfo}', '{pgschema}', 'ducklake_snapshot')) > 0",
    "(SELECT count(*) FROM sqlite_query('__ducklake_metadata_lake', 'DELETE FROM ducklake_snapshot_changes')) > 0",
    "run_id IN (SELECT name FROM (SHOW ALL TABLES))",
]
#: not one expression: statements smuggled after or around one
FILTER_INJECTIONS = [
    "true); DELETE FROM episodes; SELECT (1",
    "success; DROP TABLE episodes",
    "success) OR (true",
    "1=1; CALL ducklake_expire_snapshots('lake', older_than => now())",
    "true; COPY episodes TO '{tmp}/leak.csv'",
    "true; ATTACH '{tmp}/x.db' AS x",
    "true; INSTALL httpfs",
    "true; SET threads = 1",
    "success AND",
    "",
    "   ",
]
#: statements `sql` and `export --query` refuse: everything but a read
STATEMENTS = [
    "COPY episodes TO '{tmp}/leak.csv'", "COPY (SELECT 1) TO '{catalog}'", "COPY episodes FROM '{jsonl}'",
    "ATTACH '{tmp}/other.db' AS other", "ATTACH '{catalog}' AS again", "DETACH lake", "INSTALL httpfs",
    "LOAD httpfs", "SET threads = 1", "SET enable_external_access = true", "RESET threads",
    "PRAGMA enable_profiling", "CALL ducklake_expire_snapshots('lake', older_than => now())",
    "CALL ducklake_cleanup_old_files('lake', cleanup_all => true)", "CALL ducklake_flush_inlined_data('lake')",
    "CALL ducklake_merge_adjacent_files('lake')", "CALL ducklake_delete_orphaned_files('lake', cleanup_all => true)",
    "CALL ducklake_set_option('lake', 'data_inlining_row_limit', 0)", "CREATE TABLE t AS SELECT 1",
    "CREATE TABLE lake.t AS SELECT 1", "CREATE VIEW v AS SELECT 1", "CREATE MACRO m() AS 1",
    "CREATE SEQUENCE s", "CREATE SCHEMA lake.s", "DROP TABLE episodes", "DROP TABLE lake.episodes",
    "INSERT INTO episodes (episode_id) VALUES ('x')", "UPDATE episodes SET success = false",
    "DELETE FROM turns", "ALTER TABLE episodes ADD COLUMN x INT", "TRUNCATE episodes",
    "EXPORT DATABASE '{tmp}/dump'", "IMPORT DATABASE '{tmp}'", "VACUUM", "CHECKPOINT", "USE memory", "BEGIN",
    "SELECT * FROM ducklake_expire_snapshots('lake', older_than => now())",
    "SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "SELECT * FROM ducklake_flush_inlined_data('lake')", "SELECT * FROM ducklake_merge_adjacent_files('lake')",
    "SELECT * FROM ducklake_delete_orphaned_files('lake', cleanup_all => true)",
    "SELECT * FROM ducklake_rewrite_data_files('lake')",
    "WITH x AS (SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)) SELECT * FROM x",
    "SELECT (SELECT count(*) FROM ducklake_expire_snapshots('lake', older_than => now()))",
    "SELECT 1; DELETE FROM turns", "SELECT * FROM query('DELETE FROM episodes')",
    "FROM episodes; DROP TABLE episodes",
]
#: read-only SQL that reaches the catalog's own database (its server, its file), or hides a write behind comments
#: around EXPLAIN, or nests past the cap
CATALOG_STATEMENTS = [
    "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT * FROM {pgschema}.ducklake_snapshot')",
    "SELECT * FROM postgres_execute('__ducklake_metadata_lake', 'DELETE FROM {pgschema}.ducklake_snapshot_changes')",
    "SELECT * FROM postgres_scan('{conninfo}', '{pgschema}', 'ducklake_snapshot')",
    "SELECT * FROM postgres_attach('{conninfo}', source_schema => '{pgschema}')", "SELECT * FROM pg_clear_cache()",
    "CALL postgres_execute('__ducklake_metadata_lake', 'DROP SCHEMA {pgschema} CASCADE')",
    "SELECT * FROM sqlite_query('__ducklake_metadata_lake', 'DELETE FROM ducklake_snapshot_changes')",
    "SELECT * FROM sqlite_attach('{catalog}')", "ATTACH '{conninfo}' AS pg (TYPE postgres)",
    "DETACH __ducklake_metadata_lake", "DELETE FROM {meta}.ducklake_snapshot_changes",
    "INSERT INTO {meta}.ducklake_snapshot SELECT * FROM {meta}.ducklake_snapshot",
    "/* x */ EXPLAIN /* y */ DELETE FROM {meta}.ducklake_snapshot_changes",
    "-- c\nEXPLAIN SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "EXPLAIN /* a */ ANALYZE -- b\nSELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
    "SELECT " + "NOT " * 5000 + "true", "SELECT " + "(" * 5000 + "1" + ")" * 5000,
]


#: the FILTER_CALLS and FILTER_INJECTIONS every place gets in the fast tier (expire, cleanup, flush, merge;
#: a smuggled DELETE and CALL)
FAST_CALLS, FAST_INJECTIONS = (0, 2, 4, 5), (0, 3)
#: the SHADOWED and DEEP filters every place gets in the fast tier
FAST_SHADOWED, FAST_DEEP = ("sibling IN subqueries",), ("5000 NOTs",)
#: what the fast tier runs on SQLite and PostgreSQL too (a case there costs seconds: the lake's state is read
#: before and after): the metadata tables by name in a filter, and CATALOG_STATEMENTS' DELETE through
#: postgres_execute and sqlite_query and behind comments around EXPLAIN
CATALOG_CALLS, FAST_CATALOG_STATEMENTS = (23,), (1, 6, 12)

#: the cases where the catalog matters, which run on SQLite and PostgreSQL too: -> whether they run there in the
#: fast suite as well (the others there in the slow one)
ON_EVERY_CATALOG: dict[Case, bool] = {}
#: cases the fast suite runs on the DuckDB-file lake whatever `params`' every-other-case sampling says
FAST: set[Case] = set()


def _every_catalog(c: Case, fast: bool = False) -> Case:
    ON_EVERY_CATALOG[c] = fast
    return c


def _fast(c: Case) -> Case:
    FAST.add(c)
    return c


def _filter_cases() -> list:
    places = [
        ("rewards --where", [*L, "rewards", "--where"]),
        ("rewards diff --where", [*L, "rewards", "diff", "{spec}", "{spec}", "--where"]),
        ("export --dataset --where", [*L, "export", "{out}/ds", "--dataset", "--where"]),
        ("train --train-filter", [*L, "train", "--config", "{tmp}/grpo.toml", "--train-filter"]),
    ]
    out = []
    for n, (place, argv) in enumerate(places):
        # the fast tier: every payload through the first place, a few through the others (the guard is one
        # function: what each other place adds is calling it before it writes); the slow tier: all of them.
        # What reaches the catalog goes through the first place on every catalog.
        for i, sql in enumerate(FILTER_CALLS):
            c = case([*argv, sql], 1, "refused", id=f"{place} call {i}: {sql[:50]}", slow=n > 0 and i not in FAST_CALLS)
            out.append(_every_catalog(c, fast=True) if n == 0 and i in CATALOG_CALLS else c)
        for i, sql in enumerate(FILTER_INJECTIONS):
            out.append(case([*argv, sql], 1, "", id=f"{place} injection {i}: {sql[:40]}",
                            slow=n > 0 and i not in FAST_INJECTIONS))
        for name, sql in SHADOWED.items():
            c = case([*argv, sql], 1, "not 'duckdb_", id=f"{place} scope: {name}",
                     slow=n > 0 and name not in FAST_SHADOWED)
            out.append(_every_catalog(c, fast=name in FAST_SHADOWED) if n == 0 else c)
        for name, sql in DEEP.items():
            out.append(case([*argv, sql], 1, "nests deeper than", id=f"{place} deep: {name}",
                            slow=n > 0 and name not in FAST_DEEP))
    return out


def _statement_cases() -> list:
    out = []
    for n, (place, argv) in enumerate((("sql", [*L, "sql"]), ("export", [*L, "export", "{out}/x.parquet",
                                                                           "--query"]))):
        for i, sql in enumerate(STATEMENTS):
            c = case([*argv, sql], 1, "", id=f"{place} statement {i}: {sql[:50]}", slow=n > 0 and i % 4 != 0)
            out.append(_every_catalog(c) if n == 0 and i % 4 == 0 else c)  # the guard is the catalog's own
        for i, sql in enumerate(CATALOG_STATEMENTS):
            c = case([*argv, sql], 1, "refused", id=f"{place} catalog statement {i}: {sql[:50]}",
                     slow=n > 0 and i % 4 != 1)
            if n == 0 or i % 4 == 1:  # on every catalog: all of them through sql, the fast ones through export
                c = _every_catalog(c, fast=n == 0 and i in FAST_CATALOG_STATEMENTS)
            out.append(c)
    # comments around EXPLAIN of a read: read (they sent the check into endless recursion once)
    out += [case([*L, "sql", sql], 0, id=f"sql explain behind comments {i}")
            for i, sql in enumerate(["/* x */ EXPLAIN /* y */ SELECT 1", "-- c\nEXPLAIN SELECT count(*) FROM turns",
                                     "/* é ü */ EXPLAIN SELECT 'ß'"])]
    # text that is not ASCII (DuckDB's tokenizer counts bytes) or not Unicode (a lone surrogate: what Python makes
    # of a command-line byte that is not UTF-8) is read, or refused by name: once an IndexError or TypeError
    for place in ("where", "sql"):
        argv, prefix = ([*L, "export", f"{{out}}/ds-{place}", "--dataset", "--where"], "") if place == "where" else \
            ([*L, "sql"], "SELECT ")
        out += [case([*argv, "'\x80' = '(' OR num_turns > 0"], 1, "selects no episode", id="where non-ascii: read")
                if place == "where" else case([*argv, "SELECT '\x80' = '('"], 0, id="sql non-ascii: read"),
                case([*argv, prefix + "\x80;"], 1, "", id=f"{place} U+0080 then a semicolon"),
                case([*argv, prefix + "'é' = 'é' OR " + "(" * 130 + "1" + ")" * 130], 1, "nests deeper than",
                     id=f"{place} non-ascii before deep brackets"),
                case([*argv, prefix + "'\udc80'"], 1, "is not valid text: character", id=f"{place} lone surrogate")]
    return out


#: script payloads where ids and names are given: refused as ids, or looked up and not found, never echoed raw
XSS = ["<script>alert(1)</script>", "x'><script>alert(4)</script>", "\"><svg onload=alert(3)>",
       "javascript:alert(1)", "' OR 1=1 --"]


def _payload_cases() -> list:
    out = []
    for i, p in enumerate(XSS):
        out += [
            case([*L, "collect", "--env", "doors", "--policy", f"policy:{p}", "--tokenizer", "{tiny}"], 1,
                 "in the store", id=f"collect policy:payload {i}"),
            case([*L, "evaluate", "--env", "doors", "--policy", f"run:{p}"], 1, "no checkpoint",
                 id=f"evaluate run:payload {i}"),
            case([*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}", "--run-id",
                  p], 1, "--run-id", id=f"collect --run-id payload {i}"),
            # run ids: refused as ids (cli.common.run_id_arg) before any lake lookup
            case([*L, "train", "--replay", p, "--step", "1"], 1, "--replay", id=f"train --replay payload {i}"),
            case([*L, "view", "--out", "{out}/site", "--spec", p], 1, "reward spec", id=f"view --spec payload {i}"),
            case([*L, "report", "--out", "{out}/report", "--runs", p], 1, "--runs",
                 id=f"report --runs payload {i}"),
            case([*L, "sql", f"SELECT {_quote(p)} AS x", "-f", "json"], 0, id=f"sql payload literal {i}: fine"),
        ]
    return out


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


#: a spec's sql expressions, and what the one error line says
SPEC_EXPRS = [*((e, "") for e in FILTER_CALLS[:8]), ("1; DROP TABLE episodes", ""),
              ("(SELECT 1) + (SELECT count(*) FROM glob('/*'))", ""),
              *((e, "not 'duckdb_") for e in SHADOWED.values()), (DEEP["5000 NOTs"], "nests deeper than")]
#: a --task-selector's query files (SHADOWED over the candidates, too deep, an EXPLAIN), and what the one error
#: line says
SELECTORS = [*((f"SELECT task_id FROM candidates WHERE {e.replace('run_id', 'task_id')}", "not 'duckdb_")
               for e in SHADOWED.values()),
             (f"SELECT task_id FROM candidates WHERE {DEEP['300 NOTs']}", "nests deeper than"),
             ("/* x */ EXPLAIN /* y */ SELECT task_id FROM candidates", "")]


def _spec_cases() -> list:
    out = [case([*L, "rewards", "--spec", f"{{tmp}}/sqlspec-{i}.toml"], 1, text, id=f"spec sql expr {i}: {e[:40]}",
                slow=text == "not 'duckdb_") for i, (e, text) in enumerate(SPEC_EXPRS)]
    scope = [c.text for c in out].index("not 'duckdb_")
    return [_fast(c) if i in (scope, len(out) - 1) else c for i, c in enumerate(out)]  # a CTE out of scope, depth


def _selector_cases() -> list:
    argv = [*L, "train", "--config", "{tmp}/grpo-select.toml", "--task-selector"]
    out = [case([*argv, f"{{tmp}}/select-{i}.sql"], 1, text, id=f"train --task-selector {i}: {sql[36:76]}",
                slow=i > 0) for i, (sql, text) in enumerate(SELECTORS)]
    return [_fast(out[0]), *out[1:]]


CASES = _filter_cases() + _statement_cases() + _payload_cases() + _spec_cases() + _selector_cases()

GRPO_TOML = """algo = "grpo"
model = "{tiny}"
run_id = "t-filter"
old_logprobs = "behaviour"
tasks = 1
samples = 2
minibatch_size = 2
micro_batch = 1
env = "doors"
max_turns = 1
"""


@pytest.fixture(scope="module")
def sql_files(setting):
    """The setting, with where its catalog keeps the metadata tables ({meta} as a query names them, {pgschema}
    inside a PostgreSQL server, {conninfo}); and the spec files with SQL expressions, the selector query files and
    the train configs the cases name (written once per module)."""
    from tests.conftest import pg_conninfo
    from trajlake.store.uri import parse_uri

    schema = parse_uri(setting["lake"]).metadata_schema
    setting = {**setting, "meta": "__ducklake_metadata_lake" + (f".{schema}" if schema else ""),
               "pgschema": schema or "public", "conninfo": pg_conninfo()}
    work = Path(setting["tmp"])
    for i, (expr, _) in enumerate(SPEC_EXPRS):
        expr = expr.format(**setting)
        (work / f"sqlspec-{i}.toml").write_text(
            f'name = "s{i}"\n[allocation]\nstrategy = "last_token"\n[[components]]\nkind = "sql"\n'
            f"expr = {_toml(expr)}\n")
    for i, (sql, _) in enumerate(SELECTORS):
        (work / f"select-{i}.sql").write_text(sql)
    (work / "grpo.toml").write_text(GRPO_TOML.format(tiny=setting["tiny"]))
    # a query selector chooses from the split's first task_pool tasks (doors' train split has no end)
    (work / "grpo-select.toml").write_text(GRPO_TOML.format(tiny=setting["tiny"]) + "task_pool = 4\n")
    return setting


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_there_are_at_least_150_sql_cases():
    assert len(CASES) >= 150


def _matrix(cases: list[Case]) -> list:
    """(case, catalog) params: every case on the DuckDB-file lake, marked as `params` marks it (FAST fast); those of
    ON_EVERY_CATALOG on SQLite and PostgreSQL too (slow unless marked fast there), and `params`' sample of the
    others there in the slow suite. The setting (the lake) is module-scoped per catalog (scope="module" below):
    pytest orders the cases by catalog and makes each lake once."""
    out = []
    for p in params(cases, catalog_every=8, fast_every=2):
        c, sampled = p.values[0], any(m.name == CATALOG_SAMPLE for m in p.marks)
        fast = ON_EVERY_CATALOG.get(c, False)
        marks = [m for m in p.marks if m.name != CATALOG_SAMPLE and not ((fast or c in FAST) and m.name == "slow")]
        out.append(pytest.param(c, "duckdb", id=f"duckdb: {p.id}", marks=marks))
        if c in ON_EVERY_CATALOG or sampled:
            there = [*(m for m in marks if m.name != "slow"), *([] if fast else [pytest.mark.slow]),
                     getattr(pytest.mark, CATALOG_SAMPLE)]
            # a case of its own per catalog (its id names the catalog): pytest groups module-scoped params by value,
            # and one value shared by three catalogs would pull them together, opening the lakes in turn per case
            out += [pytest.param(c._replace(id=f"{other}: {p.id}"), other, id=f"{other}: {p.id}", marks=there)
                    for other in ("sqlite", "postgres")]
    return out


@pytest.mark.parametrize("c, setting", _matrix(CASES), indirect=["setting"], scope="module")
def test_sql_trick(c, setting, sql_files, capsys, tmp_path):
    check_case(c, sql_files, capsys, tmp_path)
