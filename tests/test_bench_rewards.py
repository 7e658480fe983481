"""bench/rewards.py at a tiny size: the bare query (the spec by hand over the lake's parquet files) gives what
trajlake computes and stores, the checks catch a difference, and --json writes the headline rows."""

from __future__ import annotations

import argparse
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import load_bench
from trajlake.rewards import parse_spec
from trajlake.store import Lake


@pytest.fixture(scope="module")
def bench():
    return load_bench("rewards")


@pytest.fixture
def scored(bench, tmp_path):
    """A 300-turn synthetic lake, scored by trajlake (spans=True) in a copy, and the bare query's result."""
    lake = Lake.open(str(tmp_path / "lake"))
    bench.build_lake(lake, argparse.Namespace(seed=1, turns=300, turns_per_episode=10, batches=2))
    files = {"turns": bench.data_files(lake, "turns"), "episodes": bench.data_files(lake, "episodes")}
    lake.close()
    spec = parse_spec(bench.SPEC)
    fused = bench.trajlake_side(Lake, str(tmp_path / "lake"), spec, 1)
    lake = Lake.open(str(tmp_path / "lake"))
    stored = lake.query("SELECT episode_id, total, components FROM episode_rewards", output="arrow")
    view = lake.query(bench.SPANS_SQL, [spec.spec_id], output="arrow")
    lake.close()
    return fused, view, bench.bare_side(files, 1)["table"], stored


def test_the_bare_query_equals_trajlake(bench, scored):
    fused, view, bare, stored = scored
    assert stored.num_rows == bare.num_rows == 30 and fused["spans"].num_rows > 0
    eq = bench.check_equal(fused, view, bare, stored)
    assert eq["episodes"] == 30 and eq["spans"] == fused["spans"].num_rows
    assert eq["total_diff"] <= 1e-9 and eq["span_diff"] <= 1e-9


@pytest.mark.parametrize("column", ["total", "spans"])
def test_a_different_bare_result_is_caught(bench, scored, column):
    fused, view, bare, stored = scored
    if column == "total":
        changed = bare.set_column(bare.schema.get_field_index("total"), "total", pc.add(bare["total"], 1e-6))
    else:  # one episode loses its spans
        spans = bare["spans"].to_pylist()
        spans[next(i for i, s in enumerate(spans) if s)] = []
        changed = bare.set_column(bare.schema.get_field_index("spans"), "spans", pa.array(spans, bare["spans"].type))
    with pytest.raises(SystemExit, match="MISMATCH"):
        bench.check_equal(fused, view, changed, stored)


def test_a_tiny_run_writes_its_headline_rows(bench, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["--turns", "2000", "--repeats", "2", "--threads", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "equal: trajlake's" in printed and "Python per-trajectory loop (all turns)" in printed
    rows = json.loads(out.read_text())
    assert [r["stage"] for r in rows] == ["rewards: recompute + allocation, 2,000 turns",
                                          "rewards: recompute + allocation vs a Python loop, 2,000 turns"]
    assert [r["target"] for r in rows] == [pytest.approx(1 / 1.3), 4.0]
    for r in rows:
        assert r["unit"] == "s" and r["trajlake_value"] > 0 and r["alternative_value"] > 0
        # a row keeps its ratio to 3 decimals: a small one (a loaded machine) is within 0.0005 of the quotient
        assert r["ratio"] == pytest.approx(r["alternative_value"] / r["trajlake_value"], rel=1e-2, abs=5e-4)
        assert r["met"] == (r["ratio"] >= r["target"])
    assert len(rows[0]["extra"]["trajlake_runs"]) == len(rows[0]["extra"]["bare_runs"]) == 2


def test_bad_sizes_stop_it(bench):
    with pytest.raises(SystemExit):
        bench.main(["--turns", "5", "--turns-per-episode", "10"])
