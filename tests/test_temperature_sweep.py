"""The rollout-temperature sweep (evaluate/temperature.py): the choice rule on golden tables, a real sweep of the
tiny model on doors whose every point is a stored eval run read back the second time, and the CLI's
`evaluate --temperatures` with its one-line refusals."""

from __future__ import annotations

import dataclasses

import pytest

from trajlake.cli import main
from trajlake.core.errors import TrajlakeError
from trajlake.evaluate.config import EvalConfig
from trajlake.evaluate.run import evaluate
from trajlake.evaluate.temperature import (
    MAX_SWEEP,
    SweepPoint,
    SweepResult,
    check_temperatures,
    choose_temperature,
    kept_temperatures,
    parse_temperatures,
    sweep_configs,
    sweep_temperatures,
)
from trajlake.store import Lake

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def table(greedy: int, sampled: dict[float, int], n: int = 30) -> list[SweepPoint]:
    """A sweep's points from success counts out of `n` episodes each."""
    return [SweepPoint(temperature=None, episodes=n, successes=greedy),
            *(SweepPoint(temperature=t, episodes=n, successes=s) for t, s in sampled.items())]


# ---- the choice rule on golden tables --------------------------------------------------------------------

#: SmolLM2-135M after SFT on 30 TextCraft test goals, one sample each: greedy 13/30, T0.5 12/30, T0.7 9/30, T1.0 2/30
TEXTCRAFT = table(13, {0.5: 12, 0.7: 9, 1.0: 2})


def test_textcraft_table_at_95_percent():
    """Greedy's 13/30 has a Wilson 95% lower bound of 0.274: T=1.0 (2/30 = 0.07) is far below it and left out;
    T=0.7's 9/30 = 0.30 is just above it, so the 95% rule keeps it (30 goals cannot tell 0.30 from 0.43 at 95%)
    and chooses 0.7, not 0.5."""
    assert TEXTCRAFT[0].low == pytest.approx(0.2738, abs=1e-4)
    assert kept_temperatures(TEXTCRAFT) == [0.5, 0.7]
    assert choose_temperature(TEXTCRAFT) == 0.7


def test_textcraft_table_at_a_tighter_level_chooses_05():
    """At 80% greedy's lower bound is 0.324, above T=0.7's 0.30: the rule keeps only 0.5."""
    assert kept_temperatures(TEXTCRAFT, confidence=0.8) == [0.5]
    assert choose_temperature(TEXTCRAFT, confidence=0.8) == 0.5


def test_all_zero_table_chooses_the_highest():
    """Greedy 0/30 has a lower bound of exactly 0, so every sampled 0/30 is not below it."""
    points = table(0, {0.3: 0, 0.5: 0, 0.7: 0, 1.0: 0})
    assert points[0].low == 0.0
    assert choose_temperature(points) == 1.0


def test_none_kept_chooses_the_lowest_swept():
    points = table(30, {1.0: 5, 0.3: 20, 0.7: 10})
    assert kept_temperatures(points) == []
    assert choose_temperature(points) == 0.3


def test_better_than_greedy_is_kept_and_a_middle_dip_does_not_stop_a_higher_one():
    assert choose_temperature(table(10, {0.5: 25, 1.0: 28})) == 1.0  # above greedy's upper bound: still kept
    assert choose_temperature(table(13, {0.3: 5, 0.5: 12, 0.7: 3, 1.0: 10})) == 1.0  # 0.3 and 0.7 dip, 1.0 holds


def test_order_and_episode_counts_do_not_matter():
    shuffled = [TEXTCRAFT[3], TEXTCRAFT[1], TEXTCRAFT[0], TEXTCRAFT[2]]
    assert choose_temperature(shuffled) == choose_temperature(TEXTCRAFT)
    # 4 samples per task at the sampled points: compared by rate (48/120 = 0.40)
    mixed = [TEXTCRAFT[0], SweepPoint(temperature=0.5, episodes=120, successes=48),
             SweepPoint(temperature=1.0, episodes=120, successes=8)]
    assert choose_temperature(mixed) == 0.5
    assert choose_temperature(iter(TEXTCRAFT)) == 0.7  # any iterable


@pytest.mark.parametrize("points, words", [
    (table(13, {})[:1], "at least one sampled"),
    (table(13, {0.5: 1})[1:], "exactly one greedy point, got 0"),
    (table(13, {0.5: 1}) + table(13, {})[:1], "exactly one greedy point, got 2"),
    (table(13, {0.5: 1}) + [SweepPoint(temperature=0.5, episodes=30, successes=2)], "given twice"),
])
def test_the_rule_refuses_a_sweep_it_cannot_read(points, words):
    with pytest.raises(TrajlakeError, match=words):
        choose_temperature(points)


def test_a_point_needs_episodes_and_a_sensible_count():
    with pytest.raises(TrajlakeError, match="episodes >= 1"):
        SweepPoint(temperature=None, episodes=0, successes=0)
    with pytest.raises(TrajlakeError, match="0 <= successes <= episodes"):
        SweepPoint(temperature=0.5, episodes=3, successes=4)


def test_result_table_marks_kept_and_chosen():
    res = SweepResult(points=tuple(TEXTCRAFT), chosen=choose_temperature(TEXTCRAFT))
    rows = res.table.to_dicts()
    assert [r["temperature"] for r in rows] == ["greedy", "0.5", "0.7", "1.0"]
    assert [r["kept"] for r in rows] == [None, True, True, False]
    assert [r["chosen"] for r in rows] == [False, False, True, False]
    assert rows[0]["success"] == "0.43 [0.27, 0.61]" and res.greedy.successes == 13


# ---- temperatures given ----------------------------------------------------------------------------------

def test_parse_temperatures():
    assert parse_temperatures("0.3,0.5, 0.7 ,1") == (0.3, 0.5, 0.7, 1.0)
    assert check_temperatures([1, 0.5]) == (1.0, 0.5)


@pytest.mark.parametrize("text, words", [
    ("abc", "'abc' is not a number"), ("0.5,,1", "an empty value is not a number"), ("", "at least one"),
    ("0", r"must be in \(0, 100\]"), ("-0.5", r"must be in \(0, 100\]"), ("101", r"must be in \(0, 100\]"),
    ("nan", "finite"), ("1e400", "finite"), ("0.5,0.50", "0.5 is given twice"),
    (",".join(str(0.1 * i) for i in range(1, MAX_SWEEP + 2)), f"at most {MAX_SWEEP}"),
])
def test_bad_temperatures_are_refused_in_one_line(text, words):
    with pytest.raises(TrajlakeError, match=f"^--temperatures: .*{words}") as e:
        parse_temperatures(text)
    assert "\n" not in str(e.value)


def test_check_temperatures_refuses_non_numbers():
    with pytest.raises(TrajlakeError, match="True is not a number"):
        check_temperatures([True])


# ---- a real sweep ---------------------------------------------------------------------------------------

def base(tiny, **kw) -> EvalConfig:
    """Three doors tasks, two short turns: the tiny model's episodes play in about a second each point."""
    settings = dict(policies=("unused",), env="doors", tasks=3, difficulty=1, max_turns=2, max_new_tokens=8,
                    template="action", tokenizer=str(tiny), progress=False)
    return EvalConfig(**{**settings, **kw})


def runs_of(lake: Lake, ids: list[str]) -> dict[str, dict]:
    rows = lake.query("SELECT run_id, kind, status, CAST(json_extract(config, '$.temperature') AS DOUBLE) AS t, "
                      "json_extract_string(config, '$.split') AS split FROM runs "
                      "WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [ids]).to_dicts()
    return {r["run_id"]: r for r in rows}


def test_sweep_configs_are_checked_and_greedy_is_a_plain_greedy_evaluate(tiny):
    b = base(tiny, samples=2, ks=(1, 2), split="test")
    configs = sweep_configs(b, "hf:x", (1.0, 0.5), top_p=0.9)
    assert [t for t, _ in configs] == [None, 0.5, 1.0]  # greedy first, then ascending
    greedy = configs[0][1]
    assert greedy == dataclasses.replace(b, policies=("hf:x",), split="val", greedy=True, samples=1, ks=(1,))
    assert all(c.split == "val" and c.samples == 2 and c.top_p == 0.9 and not c.greedy for _, c in configs[1:])
    assert [c.temperature for _, c in configs[1:]] == [0.5, 1.0]
    with pytest.raises(TrajlakeError, match="temperature sweep: temperature 0.5 is given twice"):
        sweep_configs(b, "hf:x", (0.5, 0.5))


def test_a_sweep_stores_every_point_as_an_eval_run_and_reads_them_back(tiny, tmp_path, capsys):
    policy = f"hf:{tiny}"
    b = base(tiny)
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = sweep_temperatures(lake, b, policy, (1.0, 0.5))
        assert [p.temperature for p in res.points] == [None, 0.5, 1.0]
        ids = [p.run_id for p in res.points]
        assert len(set(ids)) == 3
        stored = runs_of(lake, ids)
        assert {r["kind"] for r in stored.values()} == {"eval"} and {r["status"] for r in stored.values()} == {
            "finished"}
        assert [stored[i]["t"] for i in ids] == [0.0, 0.5, 1.0] and {r["split"] for r in stored.values()} == {"val"}
        for p in res.points:  # each point's numbers are its run's episodes
            n, s = lake.query("SELECT count(*) AS n, count(*) FILTER (WHERE success) AS s FROM episodes "
                              "WHERE run_id = ?", [p.run_id]).row(0)
            assert (p.episodes, p.successes) == (n, s) == (3, s)
        assert res.chosen == choose_temperature(res.points)

        # the greedy point is the run a plain greedy evaluate of the same settings makes (and reads back)
        n = lake.count("episodes")
        plain = evaluate(dataclasses.replace(b, policies=(policy,), split="val", greedy=True), lake)
        assert plain.runs[policy] == res.points[0].run_id and lake.count("episodes") == n
        row = plain.summary.row(0, named=True)
        assert (row["episodes"], row["success_rate"]) == (res.greedy.episodes, res.greedy.success)

        # a second sweep replays nothing: the same runs, the same numbers
        again = sweep_temperatures(lake, b, policy, (0.5, 1.0))
        assert again == res and lake.count("episodes") == n
    capsys.readouterr()

    # the CLI's sweep of the same settings reads the same runs back and prints the table and the choice
    args = ["--lake", str(tmp_path / "lake"), "evaluate", "--env", "doors", "--policy", policy, "--tasks", "3",
            "--difficulty", "1", "--max-turns", "2", "--max-new-tokens", "8", "--template", "action",
            "--tokenizer", str(tiny), "--temperatures", "0.5,1.0"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert all(i in out for i in ids) and "error" not in err and "warning" not in err
    assert out.rstrip().splitlines()[-1].startswith(f"chosen temperature: {res.chosen} (")
    with Lake.open(str(tmp_path / "lake")) as lake:
        assert lake.count("episodes") == n


# ---- the CLI ---------------------------------------------------------------------------------------------

EVALUATE = ["evaluate", "--env", "doors", "--policy", "scripted:doors", "--tasks", "2"]


@pytest.mark.parametrize("extra, words", [
    (["--temperatures", "warm"], "evaluate: --temperatures: 'warm' is not a number"),
    (["--temperatures", "0.5,0"], "evaluate: --temperatures: a temperature must be in (0, 100]"),
    (["--temperatures", "-1"], "evaluate: --temperatures: a temperature must be in (0, 100]"),
    (["--temperatures", ",".join(f"0.{i}" for i in range(1, 10))], "evaluate: --temperatures: at most 8"),
    (["--temperatures", "0.5,0.7,0.5"], "evaluate: --temperatures: temperature 0.5 is given twice"),
    (["--temperatures", "0.5", "--greedy"], "evaluate: --temperatures does not go with --greedy"),
    (["--temperatures", "0.5", "--temperature", "1.0"], "evaluate: --temperatures does not go with --temperature"),
    (["--temperatures", "0.5", "--policy", "scripted:doors?noise=0.1"], "does not go with 2 policies"),
    (["--temperatures", "nan"], "evaluate: --temperatures: a temperature must be a finite number"),
])
def test_cli_refuses_bad_sweeps_in_one_line(extra, words, tmp_path, capsys):
    lake = tmp_path / "lake"
    assert main(["--lake", str(lake), *EVALUATE, *extra]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], err
    assert "Traceback" not in err + out and "internal error" not in err
    assert not lake.exists()  # refused before the lake is opened


def test_cli_help_documents_the_sweep():
    from typer.testing import CliRunner

    from trajlake.cli import app

    r = CliRunner().invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert r.exit_code == 0
    assert "--temperatures" in r.output and "95% Wilson lower bound" in r.output and "--split (val unless given)" in \
        r.output
