"""Tables and lines for people (core/display.py) off a terminal: nothing folded or wrapped, whatever the
output's width; the global --format (table, plain, markdown, csv) of `trajlake` and the recipes."""

from __future__ import annotations

import io

import polars as pl
import pytest
from rich.console import Console

from trajlake.cli import main
from trajlake.core import display
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Episode
from trajlake.store import Lake

LONG = {
    "stage": ["start", "SFT plateau (step 500)", "GRPO"],
    "policy": ["tiny", "demo-sft/step-500", "demo-grpo/step-20"],
    "success": ["0.00 [0.00, 0.04]", "0.22 [0.15, 0.31]", "0.99 [0.95, 1.00]"],
    "note": ["n/a: imported without outcome", "a value of fifty-odd characters, which never folds", None],
    "reward": [-1.0, -0.46, 1.08],
    "format_errors": [1.0, 0.0, 0.0],
    "tokens_per_episode": [48.0, 11.5, 20.8],
}


@pytest.fixture(autouse=True)
def _default_format():
    yield
    display.set_table_format("table")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("│").split("│")]


def _body_rows(text: str) -> list[list[str]]:
    return [_cells(line) for line in text.splitlines() if line.startswith("│")]


def test_a_table_off_a_terminal_is_as_wide_as_its_values(capsys):
    """rich folds a table to 80 columns in a file or a pipe (`float6 4`, `demo-sf t/step- 500`): off a
    terminal it is printed at its full width, one line per row, every value whole."""
    df = pl.DataFrame(LONG)
    display.emit(df, display.Format.table, None)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) > 80
    rows = _body_rows(out)
    assert rows == [[str(v) if v is not None else "NULL" for v in r] for r in df.iter_rows()]
    header = [line for line in out.splitlines() if line.startswith("┃")]
    assert _cells(header[0].replace("┃", "│")) == list(LONG)  # names whole, then their types
    assert "float64" in header[1] and out.rstrip().endswith("3 rows")


def test_a_table_to_a_file_and_on_a_narrow_console_keeps_every_value_whole(tmp_path):
    df = pl.DataFrame({"a_rather_long_column_name": ["x" * 59] * 2, "b": ["y" * 50] * 2})
    out = tmp_path / "t.txt"
    display.emit(df, display.Format.table, out)
    assert _body_rows(out.read_text()) == [["x" * 59, "y" * 50]] * 2
    narrow = Console(file=io.StringIO(), width=40)  # a file whose console claims 40 columns
    display.print_table(display.render_table(df), narrow)
    assert _body_rows(narrow.file.getvalue()) == [["x" * 59, "y" * 50]] * 2
    # a caption wider than the table goes on a line of its own, not folded into the table's width
    display.print_table(display.render_table(pl.DataFrame({"a": list(range(60))})), narrow)
    assert "60 rows, first 50 shown (use --format csv or --out for all)" in narrow.file.getvalue().splitlines()


def test_on_a_terminal_a_table_still_fits_the_terminal():
    term = Console(file=io.StringIO(), width=40, force_terminal=True, color_system=None)
    display.print_table(display.render_table(pl.DataFrame(LONG)), term)
    assert max(len(line) for line in term.file.getvalue().splitlines()) <= 40


def test_lines_and_rules_off_a_terminal_are_not_wrapped(capsys):
    text = "held-out greedy success on doors (test split, difficulty 3, 100 tasks), 95% Wilson intervals; " * 2
    display.console.print(text.strip())
    title = "5. SFT on the successful demonstrations, a checkpoint every 100 steps, each on val"
    display.console.rule(title)
    display.console.rule("short")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == text.strip()
    assert lines[1].startswith("──") and f" {title} " in lines[1] and lines[1].endswith("──")
    assert len(lines[2]) == 80 and " short " in lines[2]


@pytest.mark.parametrize("fmt", ["table", "plain", "markdown", "csv"])
def test_each_global_format(fmt, capsys):
    df = pl.DataFrame(LONG)
    display.set_table_format(fmt)
    display.show(df)
    out = capsys.readouterr().out
    lines = out.splitlines()
    expected = [[("NULL" if v is None else str(v)) for v in r] for r in df.iter_rows()]
    if fmt == "table":
        assert _body_rows(out) == expected
    elif fmt == "plain":  # columns aligned with spaces: each value starts where its header does
        starts = [lines[0].index(name) for name in LONG]
        for line, row in zip(lines[1:4], expected, strict=True):
            assert [line[s:].split("  ")[0] for s in starts] == row
        assert lines[4] == "3 rows" and "│" not in out
    elif fmt == "markdown":
        assert [c.strip() for c in lines[0].strip("|").split("|")] == list(LONG)
        assert all(set(c.strip()) == {"-"} for c in lines[1].strip("|").split("|"))
        assert [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:5]] == expected
        assert lines[5:] == ["", "3 rows"]
    else:
        back = pl.read_csv(io.StringIO(out))
        assert back.columns == list(LONG) and back["policy"].to_list() == LONG["policy"]
        assert back["reward"].to_list() == LONG["reward"]


def test_plain_and_markdown_keep_a_row_on_one_line(capsys):
    df = pl.DataFrame({"reply": ["open red\nread sign", "a | b"]})
    display.emit(df, display.Format.markdown, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| open red\\nread sign |" and lines[3].startswith("| a \\| b ")
    display.emit(df, display.Format.plain, None)
    assert capsys.readouterr().out.splitlines()[1] == "open red\\nread sign"


def test_a_bad_format_names_the_valid_ones(capsys, tmp_path):
    with pytest.raises(TrajlakeError, match="unknown format 'xml'; valid: table, plain, markdown, csv"):
        display.set_table_format("xml")
    assert main(["--format", "xml", "tables"]) == 2
    err = capsys.readouterr().err
    assert "'xml' is not one of" in err and all(f"'{f}'" in err for f in ("table", "plain", "markdown", "csv"))
    from trajlake.recipes.demo import main as demo

    with pytest.raises(SystemExit) as e:
        demo(["--lake", str(tmp_path / "lake"), "--format", "xml"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'xml'" in err and "'markdown'" in err


@pytest.fixture
def filled(tmp_path):
    uri = str(tmp_path / "lake")
    with Lake.open(uri) as lake:
        lake.append({"episodes": [Episode("e1", env="maze", success=True), Episode("e2", env="maze")]},
                    stage="test", run_id="r1")
    return uri


def test_the_cli_global_format_applies_to_every_table_and_sql_format_overrides_it(filled, capsys):
    assert main(["--lake", filled, "--format", "markdown", "tables"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| table_name ") and "| episodes " in out
    assert main(["--lake", filled, "--format", "csv", "sql", "SELECT episode_id FROM episodes ORDER BY 1"]) == 0
    assert capsys.readouterr().out.split() == ["episode_id", "e1", "e2"]
    assert main(["--lake", filled, "--format", "csv", "sql", "-f", "plain", "SELECT 1 AS one"]) == 0
    assert capsys.readouterr().out.splitlines() == ["one", "1", "1 row"]
    assert main(["--lake", filled, "sql", "-f", "markdown", "SELECT 1 AS one"]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == ["| one |", "| --- |", "| 1   |"]
    # the choice holds for that command only: the next one prints the default table
    assert main(["--lake", filled, "tables"]) == 0
    assert "┏" in capsys.readouterr().out
