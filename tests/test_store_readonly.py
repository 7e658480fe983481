"""Read commands never change or create a lake: `sql` and `export` run one read statement on a read-only
attach, on every catalog backend; a moved or copied folder lake still opens, on its own data."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import make_uri
from trajlake.cli import main
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake
from trajlake.store.attach import check_read_only


#: the DuckDB-file lake in the fast suite; the multi-process catalogs (several seconds each) in the slow one,
#: which CI runs too
@pytest.fixture(params=["duckdb", pytest.param("sqlite", marks=pytest.mark.slow),
                        pytest.param("postgres", marks=pytest.mark.slow)])
def lake_uri(request, tmp_path) -> str:
    return make_uri(request.param, tmp_path, request)


#: statement -> what the one-line error names
WRITES = {
    "DROP TABLE episodes": "DROP statements are refused",
    "DELETE FROM episodes WHERE success": "DELETE statements are refused",
    "UPDATE episodes SET success = true": "UPDATE statements are refused",
    "INSERT INTO runs (run_id) VALUES ('x')": "INSERT statements are refused",
    "CREATE TABLE junk AS SELECT 1 AS x": "CREATE statements are refused",
    "CREATE TEMP TABLE junk AS SELECT 1 AS x": "CREATE statements are refused",
    "ALTER TABLE episodes ADD COLUMN junk INT": "ALTER statements are refused",
    "SELECT 1; DELETE FROM turns": "one statement at a time, got 2 (SELECT, DELETE)",
    "SELECT 1; SELECT 2": "one statement at a time, got 2 (SELECT, SELECT)",
    "COPY episodes TO 'out.csv'": "COPY statements are refused",
    "ATTACH 'other.db' AS other": "ATTACH statements are refused",
    "DETACH lake": "DETACH statements are refused",
    "SET threads = 1": "SET statements are refused",
    "CALL lake.set_option('parquet_version', '1')": "CALL statements are refused",
    "CHECKPOINT": "CALL statements are refused",
    "EXPLAIN ANALYZE DELETE FROM episodes": "DELETE statements are refused",
    "EXPORT DATABASE 'dump'": "EXPORT statements are refused",
    "INSTALL httpfs": "LOAD statements are refused",
    "VACUUM": "VACUUM statements are refused",
    "   ": "no SQL statement given",
    # a read statement whose table function would write: refused before it runs (tests/test_sql_guard.py has all)
    "SELECT * FROM ducklake_expire_snapshots('lake', older_than => now())": "refused: ducklake_expire_snapshots()",
}


def fill(uri: str) -> None:
    with Lake.open(uri) as lake:
        lake.append({"episodes": [Episode("e1", run_id="r1", env="maze", success=True),
                                  Episode("e2", run_id="r1", env="maze", success=False)],
                     "turns": [Turn("e1", 0, observation="start", action_text="move north",
                                    response_token_ids=[1, 2, 3])]}, stage="test", run_id="r1")


def state(uri: str) -> tuple:
    with Lake.open(uri) as lake:
        snaps = tuple(lake.snapshots()["snapshot_id"].to_list())
        return snaps, tuple(lake.count(t) for t in ("episodes", "turns", "runs"))


def one_line_error(capsys, rc: int, expected: str) -> str:
    captured = capsys.readouterr()
    assert rc == 1, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert expected in lines[0], lines[0]
    return lines[0]


@pytest.mark.slow  # 9 s per catalog: every write statement tried
def test_sql_and_export_refuse_every_write_on_every_backend(lake_uri, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fill(lake_uri)
    before = state(lake_uri)
    for statement, expected in WRITES.items():
        one_line_error(capsys, main(["--lake", lake_uri, "sql", statement]), expected)
        one_line_error(capsys, main(["--lake", lake_uri, "export", str(tmp_path / "x.parquet"), "--query",
                                     statement]), expected)
    assert state(lake_uri) == before
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.parquet").exists()
    assert not (tmp_path / "other.db").exists() and not (tmp_path / "dump").exists()
    # reads still work, time travel included
    assert main(["--lake", lake_uri, "sql", "SELECT count(*) AS n FROM episodes", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]
    for snap in before[0][1:]:  # snapshot 0 is the empty catalog, before the tables
        assert main(["--lake", lake_uri, "sql", "SELECT count(*) AS n FROM episodes", "-s", str(snap)]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("sql", ["SELECT 1", "WITH a AS (SELECT 1 AS x) SELECT * FROM a", "FROM episodes",
                                 "DESCRIBE episodes", "SHOW TABLES", "SUMMARIZE episodes", "VALUES (1), (2)",
                                 "EXPLAIN SELECT * FROM episodes", "-- a comment\nSELECT 1;"])
def test_read_statements_pass(sql):
    check_read_only(sql)


def test_a_syntax_error_is_one_line():
    with pytest.raises(TrajlakeError, match="query failed: Parser Error: syntax error at or near \"SELEC\""):
        check_read_only("SELEC 1")


@pytest.mark.parametrize("backend_uri", ["{tmp}/nonexist/deeper/lake", "sqlite:{tmp}/nodir/cat.sqlite"])
@pytest.mark.parametrize("command", [["sql", "SELECT 1"], ["snapshots"], ["tables"],
                                     ["export", "x.parquet", "--query", "SELECT 1"], ["report", "--out", "rep"]])
def test_read_commands_never_create_a_lake(backend_uri, command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = backend_uri.format(tmp=tmp_path)
    line = one_line_error(capsys, main(["--lake", uri, *command]), "no lake at")
    assert "a write command such as collect or import creates one" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_read_commands_never_create_a_postgres_lake(pg_schema, tmp_path, capsys):
    import psycopg

    from tests.conftest import pg_conninfo

    uri = f"postgres:{pg_conninfo()} metadata_schema={pg_schema} data_path={tmp_path / 'd'}"
    one_line_error(capsys, main(["--lake", uri, "tables"]), "no lake there")
    with psycopg.connect(pg_conninfo()) as con:
        assert con.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [pg_schema]).fetchone()[0] == 0
    assert not (tmp_path / "d").exists()


def test_a_sqlite_uri_naming_a_folder_is_one_line(tmp_path, tiny, capsys):
    one_line_error(capsys, main(["--lake", f"sqlite:{tmp_path}", "snapshots"]),
                   f"sqlite: URI names the folder {tmp_path}; give the catalog file in it")
    one_line_error(capsys, main(["--lake", f"sqlite:{tmp_path}", "collect", "--env", "doors", "--policy",
                                 "scripted:doors", "--tokenizer", str(tiny), "--tasks", "1"]),
                   "sqlite: URI names the folder")
    assert list(tmp_path.iterdir()) == []


def test_a_moved_or_copied_folder_lake_opens_on_its_own_data(tmp_path):
    fill(str(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    shutil.move(tmp_path / "a", tmp_path / "moved")
    assert state(str(tmp_path / "moved"))[1] == (2, 1, 0)
    with Lake.open(str(tmp_path / "copy")) as lake:  # a write to the copy lands in the copy's data folder
        lake.append({"episodes": [Episode("e3", run_id="r2", env="maze")]}, stage="test", run_id="r2")
    assert state(str(tmp_path / "copy"))[1] == (3, 1, 0)
    assert state(str(tmp_path / "moved"))[1] == (2, 1, 0)
    assert not (tmp_path / "a").exists()


def test_a_moved_sqlite_lake_opens(tmp_path):
    fill(f"sqlite:{tmp_path / 'cat.sqlite'}")
    (tmp_path / "new").mkdir()
    shutil.move(tmp_path / "cat.sqlite", tmp_path / "new" / "cat.sqlite")
    shutil.move(tmp_path / "cat.sqlite.data", tmp_path / "new" / "cat.sqlite.data")
    assert state(f"sqlite:{tmp_path / 'new' / 'cat.sqlite'}")[1] == (2, 1, 0)


def test_nested_columns_are_json_in_csv_and_json(tmp_path, capsys):
    fill(str(tmp_path / "lake"))
    sql = ("SELECT map(['a', 'b'], [1.5, 2.0]) AS m, response_token_ids AS ids, {'x': 1} AS s, NULL::INT[] AS n "
           "FROM turns")
    assert main(["--lake", str(tmp_path / "lake"), "sql", sql, "-f", "csv"]) == 0
    out = capsys.readouterr().out
    assert out == 'm,ids,s,n\n"{""a"": 1.5, ""b"": 2.0}","[1, 2, 3]","{""x"": 1}",\n'
    assert main(["--lake", str(tmp_path / "lake"), "sql", sql, "-f", "json"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and json.loads(out) == [{"m": {"a": 1.5, "b": 2.0}, "ids": [1, 2, 3], "s": {"x": 1},
                                                       "n": None}]
