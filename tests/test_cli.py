"""The CLI contract: commands, output formats, one-line errors with a non-zero exit."""

import json

import polars as pl
import pytest

from trajlake.cli import main
from trajlake.schemas import Episode
from trajlake.store import Lake


@pytest.fixture
def filled(tmp_path):
    uri = str(tmp_path / "lake")
    with Lake.open(uri) as lake:
        lake.append({"episodes": [Episode("e1", env="maze", success=True), Episode("e2", env="maze")]},
                    stage="test", run_id="r1")
    return uri


def test_sql_formats(filled, capsys, tmp_path):
    assert main(["--lake", filled, "sql", "SELECT count(*) AS n FROM episodes", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]
    assert main(["--lake", filled, "sql", "SELECT episode_id FROM episodes ORDER BY 1", "-f", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["episode_id", "e1", "e2"]
    out = tmp_path / "x.parquet"
    assert main(["--lake", filled, "sql", "SELECT * FROM episodes", "-f", "parquet", "--out", str(out)]) == 0
    assert pl.read_parquet(out).height == 2
    assert main(["--lake", filled, "sql", "SELECT env FROM episodes LIMIT 1"]) == 0
    assert "maze" in capsys.readouterr().out


def test_sql_snapshot_pin(filled, capsys):
    assert main(["--lake", filled, "sql", "SELECT count(*) AS n FROM episodes", "-s", "1", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 0}]


def test_export_and_snapshots(filled, capsys, tmp_path):
    out = tmp_path / "e.parquet"
    assert main(["--lake", filled, "export", str(out), "--query", "SELECT * FROM episodes WHERE success"]) == 0
    assert pl.read_parquet(out)["episode_id"].to_list() == ["e1"]
    assert main(["--lake", filled, "snapshots"]) == 0
    assert "test" in capsys.readouterr().out


def test_shell_reads_statements_from_stdin(filled, capsys, monkeypatch):
    import io

    script = "SELECT 40 + 2 AS answer;\n.snapshot 1\nSELECT count(*) FROM episodes;\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    assert main(["--lake", filled, "sql"]) == 0
    out = capsys.readouterr().out
    assert "42" in out and "0" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["sql", "SELECT * FROM nope"], "nope"),
        (["sql", "SELECT 1", "--snapshot", "999"], "snapshot 999 does not exist"),
        (["sql", "SELECT 1", "-f", "parquet"], "needs --out"),
        (["--lake", "ftp:x", "sql", "SELECT 1"], "unknown lake URI scheme"),
        (["maintain", "--grace", "soon"], "bad duration"),
    ],
)
def test_errors_are_one_line(args, message, capsys):
    with Lake.open("lake"):  # read commands refuse a missing lake: make one (each test runs in its own folder)
        pass
    assert main(args) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_debug_shows_traceback():
    from trajlake.core.errors import TrajlakeError

    with pytest.raises(TrajlakeError):
        main(["--debug", "sql", "SELECT * FROM nope"])


def test_usage_error_exit_code(capsys):
    assert main(["no-such-command"]) == 2


def test_sql_from_file_and_leading_comment(filled, capsys, tmp_path):
    q = tmp_path / "q.sql"
    q.write_text("-- how many episodes\nSELECT count(*) AS n FROM episodes\n")
    assert main(["--lake", filled, "sql", "--file", str(q), "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]
    assert main(["--lake", filled, "sql", q.read_text(), "-f", "json"]) == 0  # a `-- comment` is not an option
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]
    assert main(["--lake", filled, "sql", "--file", str(tmp_path / "missing.sql")]) == 1
    assert "cannot read SQL file" in capsys.readouterr().err
    assert main(["--lake", filled, "sql", "SELECT 1", "--file", str(q)]) == 1
    assert "either as an argument or with --file" in capsys.readouterr().err


# ---- collect: env errors, exit status, the last line, a resumed run's settings ---------------------------------
def test_collect_exits_1_when_every_episode_errors_and_says_what_to_retry(tiny, flaky_env, tmp_path, capsys):
    uri = str(tmp_path / "lake")
    args = ["--lake", uri, "collect", "--env", "test-flaky", "--policy", "scripted", "--tokenizer", str(tiny),
            "--tasks", "3", "--run-id", "flaky"]
    flaky_env.down = True  # the env server is unreachable: every reset fails
    assert main(args) == 1
    captured = capsys.readouterr()
    # stderr: the progress bar's last state, then the error line
    err = [line for line in captured.err.strip().splitlines() if not line.startswith("collect flaky ")]
    assert len(err) == 1 and "Traceback" not in captured.err
    assert err[0].startswith("error: collect run flaky failed: all 3 episodes ended with an env error (e.g. reset "
                             "failed: ConnectionError: cannot connect")
    assert err[0].endswith("re-run with --run-id flaky once the env works")
    with Lake.open(uri) as lake:
        assert lake.query("SELECT status FROM runs WHERE run_id = 'flaky'").item() == "failed"
        assert lake.query("SELECT count(*) FILTER (WHERE status = 'error') AS e, count(*) AS n FROM episodes").row(0) \
            == (3, 3)

    # back up except for one task: the run finishes (exit 0) and its last line counts what is left to retry
    flaky_env.down = False
    flaky_env.failing = {flaky_env().tasks("train", n=1)[0].task_id}
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("1 of 3 episodes ended with an env error (e.g. reset failed: ConnectionError: ")
    assert last.endswith("and are not counted: re-run with --run-id flaky to retry them")

    flaky_env.failing = set()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "env error" not in out and "success_rate" in out
    with Lake.open(uri) as lake:
        assert lake.query("SELECT status FROM runs WHERE run_id = 'flaky'").item() == "finished"
        counts = dict(lake.query("SELECT status, count(*) FROM episodes GROUP BY status").iter_rows())
        assert counts == {"error": 4, "ok": 3}  # 3 + 1 failed attempts kept as history, 3 played


def test_collect_refuses_a_resume_with_another_policy_in_one_line(tiny, tmp_path, capsys):
    uri = str(tmp_path / "lake")
    args = ["--lake", uri, "collect", "--env", "doors", "--tokenizer", str(tiny), "--tasks", "2", "--run-id", "expert"]
    assert main(args + ["--policy", "scripted:doors"]) == 0
    capsys.readouterr()
    with Lake.open(uri) as lake:
        before = lake.snapshots().height
    assert main(args + ["--policy", f"hf:{tiny}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: run expert already exists with policy 'scripted:doors'; given 'hf:{tiny}' "
                   "(use a new --run-id)")
    assert main(args + ["--policy", "scripted:doors", "--samples", "3", "--max-turns", "4"]) == 1
    assert capsys.readouterr().err.strip() == ("error: run expert already exists with samples 1, max_turns 10; "
                                               "given samples 3, max_turns 4 (use a new --run-id)")
    with Lake.open(uri) as lake:
        assert lake.snapshots().height == before, "a refused resume wrote to the lake"
    assert main(args + ["--policy", "scripted:doors", "--concurrency", "1"]) == 0  # operational: resumes


def test_table_cells_show_brackets_as_stored():
    """Values such as textarena's "[A C]" or WebShop's "click[buy now]" are text, not rich markup."""
    import polars as pl
    from rich.console import Console

    from trajlake.core.display import render_table

    console = Console(width=200, record=True)
    console.print(render_table(pl.DataFrame({"actions": ["search[KEYWORDS] | click[VALUE]", "[A C]", "[bold]x"]})))
    out = console.export_text()
    assert "search[KEYWORDS] | click[VALUE]" in out and "[A C]" in out and "[bold]x" in out
