"""bench/store.py at a tiny size: both sides write and scan every generated row (the bench checks the scans
against what it generated, and one snapshot per append), the ratios are printed; bad options stop it first."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("store")


def test_a_tiny_run_prints_every_ratio(bench, tmp_path, capsys):
    assert bench.main(["--turns", "2000", "--batch", "500", "--lake", str(tmp_path / "lake")]) == 0
    out = capsys.readouterr().out
    assert "both scans found every row written: 2,000 turns" in out and "4 snapshots, one per append" in out
    for name in ("ingest", "scan", "size"):
        assert re.search(rf"{name} ratio, .*: [\d.]+x", out), name


@pytest.mark.parametrize("argv, message", [
    (["--turns", "0"], "--turns must be at least 1, got 0"),
    (["--order", "random"], "--order must be plain-first or store-first, got 'random'"),
    (["--threads", "-1"], "--threads must be 0 (DuckDB's default) or more, got -1"),
])
def test_bad_options_are_one_line(bench, argv, message, capsys):
    assert bench.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {message}"]


def test_json_rows_and_rounds(bench, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["--turns", "1000", "--batch", "500", "--rounds", "2", "--json", str(out)]) == 0
    assert "medians of 2 rounds" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["stage"] for r in rows] == ["store: ingest 1,000 turns in appends of 500",
                                          "store: scan 1,000 turns (counts and token list lengths)"]
    for r in rows:
        assert r["unit"] == "s" and r["target"] == 1.0 and r["trajlake_value"] > 0 and r["alternative_value"] > 0
        assert r["met"] == (r["ratio"] >= 1.0)


def test_rounds_need_the_temp_lake(bench, tmp_path, capsys):
    assert bench.main(["--rounds", "2", "--lake", str(tmp_path / "lake")]) == 1
    assert capsys.readouterr().err.strip() == "error: --rounds above 1 writes a new lake each round: leave --lake out"
