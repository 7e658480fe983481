"""User SQL cannot write: every DuckLake function that changes a lake, called from a filter (rewards --where,
rewards diff --where, export --dataset --where, a spec's sql expr, a train config's filters) or from read-only
`sql` / `export --query`, is refused before it runs, on every catalog: the snapshots, the row counts, the files
on disk and the files scheduled for deletion stay as they were. Reads keep working after `maintain`."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import make_uri
from trajlake.cli import main
from trajlake.schemas import TABLES, Episode, Turn
from trajlake.store import Lake
from trajlake.store.attach import ALIAS
from trajlake.store.sql_guard import READ_ONLY_DUCKLAKE, UnsafeSQLError, check_filter, check_query, sql_tokens

#: DuckDB-file in the fast suite; SQLite and PostgreSQL in the slow one (CI runs both)
BACKENDS = ["duckdb", pytest.param("sqlite", marks=pytest.mark.slow), pytest.param("postgres", marks=pytest.mark.slow)]

#: every DuckLake function that changes a lake, called as a user would to do harm (and the catalog-scoped forms)
WRITING_CALLS = [
    "ducklake_expire_snapshots('lake', older_than => now())",
    "ducklake_cleanup_old_files('lake', cleanup_all => true)",
    "ducklake_delete_orphaned_files('lake', cleanup_all => true)",
    "ducklake_flush_inlined_data('lake')",
    "ducklake_merge_adjacent_files('lake')",
    "ducklake_rewrite_data_files('lake')",
    "ducklake_set_option('lake', 'parquet_version', '1')",
    "ducklake_set_commit_message('lake', 'me', 'hello')",
    "ducklake_add_data_files('lake', 'episodes', 'elsewhere.parquet')",
    "ducklake_commit('lake')",
    "lake.merge_adjacent_files()",
    "lake.set_option('parquet_version', '1')",
    "lake.cleanup_old_files(cleanup_all => true)",
]

#: filters that are fine: columns, operators, scalar functions, lambdas, subqueries over the lake's tables
GOOD_FILTERS = [
    "success", "success AND policy_id LIKE 'scripted:%' AND env = 'doors'", "run_id = 'a--b' -- a note",
    "episode_id IN (SELECT episode_id FROM turns GROUP BY episode_id HAVING sum(num_prompt_tokens) <= 2048)",
    "episode_id IN (WITH t AS (SELECT episode_id FROM turns) SELECT * FROM t)",
    "list_transform([1, 2], x -> x + 1)[1] = 2", "upper(env) = 'DOORS'", "num_turns BETWEEN 1 AND 3",
    "EXISTS (SELECT 1 FROM runs r WHERE r.run_id = run_id)", "coalesce(success, false) /* a block note */",
    "episode_id IN (SELECT episode_id FROM token_rewards)",
]

#: filters refused, and what the line names
BAD_FILTERS = [
    *[(f"(SELECT count(*) FROM {call}) < 0", "refused") for call in WRITING_CALLS],
    ("(SELECT count(*) FROM lake.turns) > 0", "not 'lake.turns'"),
    ("(SELECT count(*) FROM __ducklake_metadata_lake.ducklake_snapshot) > 0", "__ducklake_metadata_lake"),
    ("(SELECT count(*) FROM read_text('/etc/passwd')) > 0", "table function read_text()"),
    ("(SELECT count(*) FROM 'elsewhere.parquet') > 0", "not 'elsewhere.parquet'"),
    ("(SELECT count(*) FROM query('SELECT 1')) > 0", "table function query()"),
    ("(SELECT 1 FROM range(3) LIMIT 1) = 1", "table function range()"),
    ("ducklake_snapshots('lake') IS NULL", "ducklake_snapshots()"),
    ("lake.set_option('a', 'b') IS NULL", "lake.set_option()"),
    ("nextval('s') > 0", "nextval()"),
    ("episode_id IN (WITH t AS (SELECT * FROM ducklake_flush_inlined_data('lake')) SELECT 1 FROM t)",
     "ducklake_flush_inlined_data()"),
    ("true); DELETE FROM episodes; SELECT (1", "is not one SQL expression"),
    ("success AND", "is not one SQL expression"),
    ("", "must be a non-empty SQL expression"),
]


@pytest.mark.parametrize("expr", GOOD_FILTERS)
def test_a_filter_may_read_the_lake(expr):
    check_filter(expr, "--where")


@pytest.mark.parametrize("expr, text", BAD_FILTERS)
def test_a_filter_may_not_call_functions_or_read_elsewhere(expr, text):
    with pytest.raises(UnsafeSQLError) as e:
        check_filter(expr, "--where")
    assert text in str(e.value) and "--where" in str(e.value)


def test_every_ducklake_function_is_classified(tmp_path):
    """Each DuckLake function this build has either only reads (and passes) or is refused in a query and in a
    filter: one that a later DuckLake adds is refused until it is known to read."""
    with Lake.open(str(tmp_path / "lake")) as lake:
        names = lake.query("SELECT DISTINCT function_name FROM duckdb_functions() "
                           "WHERE function_name LIKE 'ducklake_%' ORDER BY 1")["function_name"].to_list()
    assert len(names) >= 20
    for name in names:
        sql = f"SELECT * FROM {name}('{ALIAS}')"
        if name.removeprefix("ducklake_") in READ_ONLY_DUCKLAKE:
            check_query(sql)
        else:
            with pytest.raises(UnsafeSQLError, match=f"refused: {name}"):
                check_query(sql)
        with pytest.raises(UnsafeSQLError, match="refused"):
            check_filter(f"(SELECT count(*) FROM {name}('{ALIAS}')) > 0", "--where")


def _fill(uri: str) -> None:
    """Episodes in several files, an update (a delete file), merged by maintain with an hour's grace (so files
    are scheduled for deletion, not deleted), then one more small append (inlined rows where the catalog
    inlines them, as PostgreSQL's does)."""
    with Lake.open(uri) as lake:
        for i in range(3):
            lake.append({"episodes": [Episode(f"e{i}", run_id="r1", env="doors", success=i % 2 == 0, num_turns=1)],
                         "turns": [Turn(f"e{i}", 0, observation="start", action_text="open red",
                                        response_token_ids=[1, 2, 3])]}, stage="test", run_id="r1")
        lake.update("episodes", {"episode_id": "e1"}, {"success": True}, stage="test")
        lake.maintain(grace=timedelta(hours=1))
        lake.append({"episodes": [Episode("e9", run_id="r2", env="doors", success=False, num_turns=1)]},
                    stage="test", run_id="r2")


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and "catalog" not in p.name}


def _state(uri: str) -> tuple:
    with Lake.open(uri, read_only=True) as lake:
        root = Path(lake.catalog.data_path)
        snaps = tuple(lake.snapshots()["snapshot_id"].to_list())
        counts = tuple(lake.count(t) for t in TABLES)
        schema = f"{lake.catalog.metadata_schema}." if lake.catalog.metadata_schema else ""
        scheduled = lake.query(f"SELECT count(*) AS n FROM __ducklake_metadata_{ALIAS}.{schema}"
                               "ducklake_files_scheduled_for_deletion")["n"][0]
        options = lake.query(f"SELECT option_name, value FROM {ALIAS}.options() ORDER BY 1").rows()
    return snaps, counts, scheduled, tuple(options), _files(root)


@pytest.fixture(scope="module", params=BACKENDS)
def filled(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("guard")

    class Req:  # make_uri asks the request for the pg_schema fixture, which is function-scoped
        @staticmethod
        def getfixturevalue(name):
            import uuid

            from tests.conftest import _pg_available

            why = _pg_available()
            if why:
                pytest.skip(why)
            return "trajlake_guard_" + uuid.uuid4().hex[:10]

    uri = make_uri(request.param, tmp, Req)
    _fill(uri)
    spec = tmp / "spec.toml"
    spec.write_text('name = "s"\n[allocation]\nstrategy = "last_token"\n[[components]]\nkind = "goal"\n')
    yield uri, tmp, spec
    if request.param == "postgres":
        import psycopg

        from tests.conftest import pg_conninfo

        schema = uri.split("metadata_schema=")[1].split()[0]
        with psycopg.connect(pg_conninfo(), autocommit=True) as con:
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _commands(call: str, tmp: Path, spec: Path) -> list[list[str]]:
    flt = f"(SELECT count(*) FROM {call}) < 0"
    bad_spec = tmp / "bad-spec.toml"
    bad_spec.write_text('name = "bad"\n[allocation]\nstrategy = "last_token"\n[[components]]\nkind = "sql"\n'
                        f'expr = {json.dumps(flt)}\n')
    return [
        ["sql", f"SELECT * FROM {call}"],
        ["sql", f"WITH x AS (SELECT * FROM {call}) SELECT count(*) FROM x"],
        ["sql", f"SELECT count(*) FROM episodes WHERE {flt}"],
        ["export", str(tmp / "out.parquet"), "--query", f"SELECT * FROM {call}"],
        ["rewards", "--where", flt],
        ["rewards", "diff", str(spec), str(spec), "--where", flt],
        ["rewards", "--spec", str(bad_spec)],
        ["export", str(tmp / "ds"), "--dataset", "--where", flt],
        ["export", str(tmp / "ds"), "--dataset", "--spec", str(spec), "--where", flt],
    ]


#: the fast suite runs three calls through every command (tests/test_bad_inputs_sql.py has more there); the slow
#: one runs every call
CLI_CALLS = [pytest.param(call, marks=[] if i < 3 else [pytest.mark.slow]) for i, call in enumerate(WRITING_CALLS)]


@pytest.mark.parametrize("call", CLI_CALLS)
def test_no_command_writes_through_user_sql(call, filled, capsys):
    uri, tmp, spec = filled
    before = _state(uri)
    for argv in _commands(call, tmp, spec):
        rc = main(["--lake", uri, *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1, (argv, err)
        assert len(err) == 1 and err[0].startswith("error: ") and "refused" in err[0], (argv, err)
    assert _state(uri) == before
    assert not (tmp / "out.parquet").exists() and not (tmp / "ds").exists()


@pytest.mark.parametrize("field", ["sft_filter", "train_filter", "replay_filter"])
def test_train_filters_are_refused_before_reading(field, filled):
    from trajlake.train.batch import check_episode_filter
    from trajlake.train.config import ConfigError

    uri, tmp, _ = filled
    before = _state(uri)
    with Lake.open(uri) as lake:
        for call in WRITING_CALLS:
            with pytest.raises(ConfigError, match=f"refused: train config: {field}"):
                check_episode_filter(lake, f"(SELECT count(*) FROM {call}) < 0", field=field)
        assert check_episode_filter(lake, "success", field=field) == 3
    assert _state(uri) == before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("expire", [False, True])
def test_reads_work_after_maintain(backend, expire, tmp_path, request, capsys):
    """After maintain (files merged and scheduled for deletion or deleted, inlined rows flushed, snapshots
    expired) and with fresh inlined rows, every read command works on a read-only open."""
    uri = make_uri(backend, tmp_path, request)
    _fill(uri)
    with Lake.open(uri) as lake:
        lake.maintain(expire_older_than=timedelta(0) if expire else None, grace=timedelta(0))
        lake.append({"episodes": [Episode("e10", run_id="r3", env="doors", success=True, num_turns=1)]},
                    stage="test", run_id="r3")
    out = tmp_path / "out"
    for argv in (["sql", "SELECT count(*) AS n FROM episodes", "-f", "json"], ["snapshots"], ["tables"],
                 ["export", str(out / "x.parquet"), "--query", "SELECT * FROM turns"],
                 ["export", str(out / "ds"), "--dataset"], ["report", "--out", str(out / "report")]):
        rc = main(["--lake", uri, *argv])
        captured = capsys.readouterr()
        assert rc == 0, (argv, captured.err)
        if argv[0] == "sql":
            assert json.loads(captured.out) == [{"n": 5}]
    assert (out / "x.parquet").exists() and (out / "ds").is_dir()


@pytest.mark.slow  # 7 s per catalog: every output path tried
@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_into_the_lake_are_refused(backend, tmp_path, request, capsys):
    uri = make_uri(backend, tmp_path, request)
    _fill(uri)
    with Lake.open(uri, read_only=True) as lake:
        catalog, data = lake.catalog.catalog_path, Path(lake.catalog.data_path)
    data_files = sorted(p for p in data.rglob("*.parquet"))
    link = tmp_path / "innocent.parquet"
    os.symlink(data_files[0], link)
    targets = [data_files[0], data / "new.parquet", link]
    if catalog is not None:
        targets += [catalog, Path(f"{catalog}-wal"), Path(f"{catalog}.wal")]
    before = _state(uri)
    for target in targets:
        for argv in (["sql", "SELECT 1 AS x", "-f", "csv", "-o", str(target)],
                     ["export", str(target), "--query", "SELECT 1 AS x"],
                     ["export", str(target), "--dataset"], ["view", "--out", str(target)],
                     ["report", "--out", str(target)]):
            rc = main(["--lake", uri, *argv])
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 1 and len(err) == 1 and "is inside the lake" in err[0], (argv, err)
    assert _state(uri) == before


def test_threads_checking_at_once_each_get_their_own_answer():
    """Spec loading checks filters from several threads: each check reads its own parse, never another's."""
    from concurrent.futures import ThreadPoolExecutor

    from trajlake.store.sql_guard import check_filter

    exprs = [f"success AND turns > {i}" for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda e: check_filter(e, "filter"), exprs)) == [None] * len(exprs)


@pytest.mark.parametrize("sql", ["SELECT 1", "SELECT 'é' || (x) FROM t -- ß", "\x80;(", "/* 😀 */ [1, ('ü')]"])
def test_token_positions_are_character_indexes(sql):
    """Each token starts where the same text, tokenized alone from that character, starts: DuckDB's own offsets
    are bytes, which a non-ASCII character before a token would shift."""
    import duckdb
    tokens = sql_tokens(sql)
    assert [kind for _, kind in tokens] == [kind for _, kind in duckdb.tokenize(sql)]
    for start, kind in tokens:
        assert duckdb.tokenize(sql[start:])[0] == (0, kind), (sql, start)


def test_a_lone_surrogate_is_refused_by_name():
    with pytest.raises(UnsafeSQLError, match="the filter is not valid text: character 8 is a lone surrogate"):
        sql_tokens("SELECT \udc80", "the filter")
