"""bench/scale.py at two small sizes: every operation measured at each, in a process of its own, on a lake that
holds what was asked (its episodes, the train run's lineage, the eval run that the contamination view reads); the
slope is the log-log exponent; the curves and the rows are written."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_bench


def test_the_slope_is_the_exponent_of_a_power_law():
    bench = load_bench("scale")
    sizes = [100_000, 1_000_000, 10_000_000]
    assert bench.slope(sizes, [2.0 * (n / 1e5) for n in sizes]) == pytest.approx(1.0)
    assert bench.slope(sizes, [0.3 * (n / 1e5) ** 2 for n in sizes]) == pytest.approx(2.0)
    assert bench.slope(sizes, [0.5, 0.5, 0.5]) == pytest.approx(0.0, abs=1e-9)


def test_the_lake_holds_a_real_projects_shape(tmp_path):
    bench = load_bench("scale")
    from trajlake.store import Lake

    with Lake.open(str(tmp_path / "lake")) as lake:
        seconds = bench.build(lake, 4_000, seed=0)
        assert seconds > 0
        assert lake.count("turns") == 4_000 and lake.count("episodes") == 400
        kinds = lake.query("SELECT kind, count(*) AS n FROM runs GROUP BY kind ORDER BY kind").rows()
        assert kinds == [("collect", 4), ("eval", 1), ("train", 1)]
        trained = lake.query("SELECT count(DISTINCT u.e) FROM train_steps, unnest(episode_ids) AS u(e)").item()
        assert trained == lake.query("SELECT count(*) FROM episodes WHERE run_id LIKE 'collect-%'").item()
        evals = lake.query("SELECT count(*) FROM episodes JOIN tasks USING (task_id) WHERE run_id = 'eval-0'").item()
        assert evals == 4  # EVAL_SHARE of 400, each on a stored task


@pytest.mark.slow  # fourteen processes, a minute on 2 cores
def test_two_sizes_give_every_operation_and_the_curves(tmp_path):
    bench = load_bench("scale")
    rows = tmp_path / "rows.json"
    assert bench.main(["--turns", "4000,8000", "--out", str(tmp_path / "out"), "--json", str(rows)]) == 0
    results = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert results["sizes"] == [4000, 8000]
    for op in bench.OPS:
        assert len(results["ops"][op]) == 2 and all(r["seconds"] > 0 and r["peak_mb"] >= 0
                                                    for r in results["ops"][op]), op
    assert (tmp_path / "out" / "scale.svg").read_text().lstrip().startswith("<?xml")
    headlines = json.loads(rows.read_text())
    assert [h["stage"] for h in headlines] == [f"scale: {op}, 8,000 turns" for op in bench.OPS]
    for h, op in zip(headlines, bench.OPS, strict=True):
        first = results["ops"][op][0]["seconds"]
        assert h["alternative_value"] == pytest.approx(first * 2)
        assert h["trajlake_value"] == results["ops"][op][1]["seconds"]


def test_bad_sizes_are_refused_in_one_line(capsys):
    bench = load_bench("scale")
    for turns, says in (("10,x", "whole numbers"), ("4005", "multiple of 10"), ("30", "at least")):
        with pytest.raises(SystemExit):
            bench.main(["--turns", turns])
        assert says in capsys.readouterr().err
