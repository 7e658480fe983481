"""bench/collect.py at a tiny size: every side plays the same tasks, each round prints its ratio, several rounds
print the median; bad options stop it before any work."""

from __future__ import annotations

import re

import pytest

from tests.conftest import load_bench
from tests.helpers import tiny_model_dir

TINY = ["--episodes", "3", "--concurrency", "3", "--max-turns", "2", "--max-new-tokens", "4", "--threads", "0"]


@pytest.fixture(scope="module")
def bench():
    return load_bench("collect")


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_two_rounds_print_each_ratio_and_the_median(bench, tmp_path_factory, capsys):
    model = str(tiny_model_dir(tmp_path_factory))
    assert bench.main([*TINY, "--model", model, "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+[12] (batched|sequential|seq\+cache)", line)]
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        (str(i), side) for i in (1, 2) for side in ("batched", "sequential", "seq+cache"))
    assert {r[3] for r in rows} == {"3"}  # episodes: every side played all of them, every round
    ratios = [float(x) for x in re.findall(r"round \d: speed-up of batched .*?: ([\d.]+)x episodes/s", out)]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    median = re.search(r"speed-up over 2 rounds: median ([\d.]+)x, min ([\d.]+)x, max ([\d.]+)x", out)
    assert median, out
    assert float(median[2]) <= float(median[1]) <= float(median[3])


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_one_side_prints_no_ratio(bench, tmp_path_factory, capsys):
    model = str(tiny_model_dir(tmp_path_factory))
    assert bench.main([*TINY, "--model", model, "--sides", "batched"]) == 0
    out = capsys.readouterr().out
    assert "batched" in out and "speed-up" not in out


@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--episodes", "0"], ["--max-new-tokens", "-1"]])
def test_bad_options_stop_before_any_work(bench, bad, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(bad)
    assert stop.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
