"""`make bench` (bench/suite.py): the headline rows' ratio and target, the joined table, a bench that cannot run
or fails, and a real bench run through the suite at a tiny size."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_bench
from tests.helpers import tiny_model_dir


@pytest.fixture(scope="module")
def suite():
    return load_bench("suite")


@pytest.fixture(scope="module")
def headline():
    return load_bench("headline")


def test_ratio_is_how_many_times_better_whatever_the_unit(headline):
    faster = headline.Headline("s", "t", "a", trajlake_value=2.0, alternative_value=3.0, unit="s", target=1.3)
    assert faster.ratio == pytest.approx(1.5) and faster.met
    slower = headline.Headline("r", "t", "a", trajlake_value=90.0, alternative_value=121.0, unit="tokens/s",
                               target=1.0)
    assert slower.ratio == pytest.approx(90 / 121) and not slower.met
    row = slower.as_dict()
    assert row["ratio"] == pytest.approx(0.744, abs=1e-3) and row["met"] is False


def test_rows_round_trip_through_json(headline, tmp_path):
    rows = [headline.Headline("store: ingest", "Lake.append", "pq.write_table", 1.0, 1.1, "s", 1.0, note="n")]
    headline.write_rows(tmp_path / "rows.json", rows)
    back = headline.read_rows(tmp_path / "rows.json")
    assert back[0]["stage"] == "store: ingest" and back[0]["ratio"] == pytest.approx(1.1)
    headline.write_rows(None, rows)  # run by hand: nothing written, no error


def test_table_shows_every_row_the_failures_and_the_machine(suite, headline):
    ok = headline.Headline("collect: 32 x 6", "batched", "sequential", 7.5, 0.7, "episodes/s", 10.0,
                           note="the lowest of 3 rounds").as_dict()
    runs = [{"bench": "collect", "args": ["--rounds", "3"], "load_before": "1.0 1.0 1.0", "load_after": "1.5 1.1 1.0",
             "seconds": 80.0},
            {"bench": "train", "args": ["--quick"], "load_before": "1.5 1.1 1.0", "error": "trl is not installed: x"}]
    text = suite.markdown([ok], runs, suite.machine())
    assert "| collect: 32 x 6 | batched | sequential |" in text and "**10.71x** | 10x | yes |" in text
    assert "| train | failed: trl is not installed: x |" in text
    assert "cores" in text and "torch" in text and "1.0 1.0 1.0 -> 1.5 1.1 1.0, 80.0 s" in text
    assert "the lowest of 3 rounds" in text


def test_a_bench_whose_package_is_missing_says_how_to_get_it(suite, tmp_path):
    bench = suite.Bench("train", ("--quick",), needs="no_such_module_here", how="pip install it")
    rows, info = suite.run_bench(bench, tmp_path, timeout=60)
    assert rows == [] and info["error"] == "no_such_module_here is not installed: pip install it"


def test_unknown_bench_names_the_valid_ones(suite, capsys):
    with pytest.raises(SystemExit) as stop:
        suite.main(["--only", "colect"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unknown bench colect" in err and "collect" in err and "viewer" in err


def test_list_prints_every_bench_and_runs_nothing(suite, capsys, tmp_path):
    assert suite.main(["--list", "--out", str(tmp_path / "out")]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"collect", "train", "rewards", "store", "viewer"} <= set(names)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a real collect bench through the suite, about 20 s on 2 cores
def test_a_real_bench_through_the_suite_gives_its_row(suite, tmp_path_factory, tmp_path):
    model = str(tiny_model_dir(tmp_path_factory))
    tiny = ("--episodes", "3", "--concurrency", "3", "--max-turns", "2", "--max-new-tokens", "4", "--model", model,
            "--sides", "batched,sequential")
    rows, info = suite.run_bench(suite.Bench("collect", tiny), tmp_path, timeout=300)
    assert "error" not in info, info
    assert len(rows) == 1 and rows[0]["unit"] == "episodes/s" and rows[0]["ratio"] > 0
    assert rows[0]["stage"].startswith("collect: 3 episodes x 2 turns, ")
    json.dumps(rows)  # the suite writes them as they are
