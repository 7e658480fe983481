"""SQL tricks through every place a user's SQL reaches the lake, and script payloads in ids, generated: each
writing statement DuckDB has and each DuckLake function that writes (expire, cleanup, flush, merge, orphans,
rewrite, options) in `sql` and `export --query`, and as a subquery in every filter (`rewards --where`,
`rewards diff --where`, `export --dataset --where`, `train --train-filter`, a spec's `sql` expression). Every
one is refused in one line with the lake's snapshots, rows and data files unchanged (tests/bad_inputs_common).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import bad_inputs_common as common
from tests.bad_inputs_common import case, check_case, params

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


#: the FILTER_CALLS and FILTER_INJECTIONS every place gets in the fast tier (expire, cleanup, flush, merge;
#: a smuggled DELETE and CALL)
FAST_CALLS, FAST_INJECTIONS = (0, 2, 4, 5), (0, 3)


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
        # function: what each other place adds is calling it before it writes); the slow tier: all of them
        for i, sql in enumerate(FILTER_CALLS):
            out.append(case([*argv, sql], 1, "refused", id=f"{place} call {i}: {sql[:50]}",
                            slow=n > 0 and i not in FAST_CALLS))
        for i, sql in enumerate(FILTER_INJECTIONS):
            out.append(case([*argv, sql], 1, "", id=f"{place} injection {i}: {sql[:40]}",
                            slow=n > 0 and i not in FAST_INJECTIONS))
    return out


def _statement_cases() -> list:
    out = []
    for n, (place, argv) in enumerate((("sql", [*L, "sql"]), ("export", [*L, "export", "{out}/x.parquet",
                                                                           "--query"]))):
        for i, sql in enumerate(STATEMENTS):
            out.append(case([*argv, sql], 1, "", id=f"{place} statement {i}: {sql[:50]}", slow=n > 0 and i % 4 != 0))
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


SPEC_EXPRS = FILTER_CALLS[:8] + ["1; DROP TABLE episodes", "(SELECT 1) + (SELECT count(*) FROM glob('/*'))"]


def _spec_cases() -> list:
    return [case([*L, "rewards", "--spec", f"{{tmp}}/sqlspec-{i}.toml"], 1, "", id=f"spec sql expr {i}: {e[:40]}")
            for i, e in enumerate(SPEC_EXPRS)]


CASES = _filter_cases() + _statement_cases() + _payload_cases() + _spec_cases()

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
    """The spec files with SQL expressions and the train config the cases name (written once per module)."""
    work = Path(setting["tmp"])
    for i, expr in enumerate(SPEC_EXPRS):
        expr = expr.format(**setting)
        (work / f"sqlspec-{i}.toml").write_text(
            f'name = "s{i}"\n[allocation]\nstrategy = "last_token"\n[[components]]\nkind = "sql"\n'
            f"expr = {_toml(expr)}\n")
    (work / "grpo.toml").write_text(GRPO_TOML.format(tiny=setting["tiny"]))
    return setting


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_there_are_at_least_150_sql_cases():
    assert len(CASES) >= 150


@pytest.mark.parametrize("c", params(CASES, catalog_every=4, fast_every=2))
def test_sql_trick(c, sql_files, capsys, tmp_path):
    check_case(c, sql_files, capsys, tmp_path)
