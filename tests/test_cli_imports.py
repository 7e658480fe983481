"""The light commands start without the heavy libraries (issue 37: `trajlake sql` paid 1.4 s, `--help` 3 s, for
imports its work never used). Each command runs in a fresh interpreter, which then lists what it imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trajlake.store import Lake

#: what no light command may import: the model stack, the dataframe libraries and what they pull in, and pydantic
#: (typer 0.29 and later import it to coerce every option: a tenth of a second per command)
HEAVY = ("torch", "transformers", "deepspeed", "ray", "polars", "pyarrow", "pandas", "numpy", "pydantic")

RUN = """
import json, sys
from trajlake.cli.app import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(%r))}))
""" % (HEAVY,)


def imported(argv: list[str], cwd) -> tuple[int, list[str]]:
    out = subprocess.run([sys.executable, "-c", RUN, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)
    last = json.loads(out.stdout.strip().splitlines()[-1])
    return last["code"], last["heavy"]


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("light")
    Lake.open(str(root / "lake")).close()
    return root


@pytest.mark.parametrize("argv, allowed", [
    (["--help"], ()),
    (["collect", "--help"], ()),
    (["trian"], ()),  # a typo: "did you mean 'train'" without making train's options
    (["--lake", "lake", "sql", "SELECT count(*) AS n FROM episodes"], ()),
    (["--lake", "lake", "--format", "plain", "sql", "SELECT * FROM runs"], ()),
    (["--lake", "lake", "sql", "SELECT 1 AS a", "-f", "markdown"], ()),
    (["--lake", "lake", "snapshots"], ()),
    (["--lake", "lake", "sql", "SELECT 1 AS a", "-f", "json"], ("polars", "pyarrow", "numpy")),  # a frame's output
    (["--lake", "lake", "tables"], ()),  # the table list is the catalog's
    (["train", "--help"], ("pyarrow", "numpy")),  # TrainConfig's fields, not the trainer (the run ledger's schemas)
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_light_command_imports_nothing_heavy(argv, allowed, lake_dir):
    code, heavy = imported(argv, lake_dir)
    assert code in (0, 2), code  # 2: the typo
    assert set(heavy) <= set(allowed), f"trajlake {' '.join(argv)} imported {heavy}"


def test_train_is_made_when_run_and_its_help_is_whole(lake_dir):
    """The stand-in `trajlake --help` lists carries train's help text; `train --help` shows its real options."""
    listing = subprocess.run([sys.executable, "-m", "trajlake", "--help"], cwd=lake_dir, capture_output=True,
                             text=True, timeout=120, env={"COLUMNS": "200", "PATH": ""}).stdout
    assert "Train from the store: SFT warm start" in listing
    own = subprocess.run([sys.executable, "-m", "trajlake", "train", "--help"], cwd=lake_dir, capture_output=True,
                         text=True, timeout=120, env={"COLUMNS": "200", "PATH": ""}).stdout
    assert "--iterations" in own and "Config overrides" in own


@pytest.mark.parametrize("command, header", [("tables", "table_name,rows"),
                                             ("snapshots", "snapshot_id,snapshot_time,stage,message,run_id")])
def test_people_s_tables_print_in_every_global_format(command, header, lake_dir):
    """`tables` and `snapshots` read DuckDB's rows for a table, a frame for CSV (the global --format): each format
    prints, CSV with its header and every row."""
    for fmt in ("table", "plain", "markdown", "csv"):
        out = subprocess.run([sys.executable, "-m", "trajlake", "--lake", "lake", "--format", fmt, command],
                             cwd=lake_dir, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and not out.stderr.strip(), (fmt, out.stderr)
        if fmt == "csv":
            assert out.stdout.splitlines()[0] == header, out.stdout


def test_rows_print_as_the_frame_of_the_same_query_prints(lake_dir):
    """A table printed from DuckDB's rows (`output="rows"`) reads as the one printed from the polars frame of the
    same query: names, type names, values, caption; cut at the same row."""
    from trajlake.core import display

    sql = ("SELECT i AS n, i * 0.5 AS half, 'x' || i AS s, i % 2 = 0 AS even, [i, i + 1] AS l, {'a': i} AS st, "
           "DATE '2026-01-01' + i::INT AS d, NULL::VARCHAR AS nothing FROM range(60) t(i)")
    with Lake.open(str(lake_dir / "lake"), read_only=True) as lake:
        frame = lake.query(sql)
        rows = lake.query(sql, output="rows", max_rows=display.MAX_ROWS)
    assert rows.height == frame.height == 60 and len(rows.rows) == display.MAX_ROWS
    assert display.plain_text(rows) == display.plain_text(frame)
    assert display.markdown_text(rows) == display.markdown_text(frame)
    assert rows.types == tuple(display._type_name(t) for t in frame.dtypes)  # the table's header line


def test_a_train_refused_by_its_runs_lease_imports_neither_torch_nor_deepspeed(lake_dir):
    """A second `trajlake train` on a run id a live process holds is refused before the trainer loads: here the
    holder is this test's own process."""
    from trajlake.store import lease

    config = lake_dir / "held.toml"
    config.write_text('algo = "grpo"\nmodel = "m"\nrun_id = "held"\n')
    with Lake.open(str(lake_dir / "lake")) as lake:
        lease.acquire(lake, "held", "train")
    try:
        code, heavy = imported(["--lake", "lake", "train", "--config", str(config)], lake_dir)
    finally:
        with Lake.open(str(lake_dir / "lake")) as lake:
            lease.release_any(lake, "held")
    assert code == 1 and not {"torch", "deepspeed", "transformers"} & set(heavy), heavy
