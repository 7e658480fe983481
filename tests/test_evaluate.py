"""Evaluate: pass@k and intervals against brute force and known values; eval runs in the store, reused when
asked again; the CLI; and the errors a user can make."""

from __future__ import annotations

import itertools
import math

import polars as pl
import pytest

from tests.helpers import tiny_model_dir
from trajlake.cli import main
from trajlake.core.errors import TrajlakeError
from trajlake.evaluate.config import EvalConfig
from trajlake.evaluate.metrics import format_summary, mean_interval, pass_at_k, summarize, wilson_interval
from trajlake.evaluate.run import eval_run_id, evaluate
from trajlake.store import Lake

# ---- statistics -------------------------------------------------------------------------------------


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of k-subsets of the samples holding at least one success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_pass_at_k_equals_brute_force(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_golden_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="successes"):
        pass_at_k(3, 4, 1)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = wilson_interval(10, 10)
    assert lo == pytest.approx(0.7225, abs=1e-4) and hi == 1.0
    assert wilson_interval(30, 100, 0.99)[1] - wilson_interval(30, 100, 0.99)[0] > \
        wilson_interval(30, 100, 0.9)[1] - wilson_interval(30, 100, 0.9)[0]
    with pytest.raises(ValueError):
        wilson_interval(1, 0)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.5)


def test_mean_interval():
    m, lo, hi = mean_interval([1.0, 2.0, 3.0, 4.0])
    half = 1.959964 * math.sqrt(5 / 3) / 2
    assert m == 2.5 and lo == pytest.approx(2.5 - half, abs=1e-5) and hi == pytest.approx(2.5 + half, abs=1e-5)
    assert mean_interval([0.7]) == (0.7, 0.7, 0.7)


def test_summarize_groups_and_pass_at_k():
    eps = pl.DataFrame({
        "policy": ["a"] * 6 + ["b"] * 2,
        "task_id": ["t1", "t1", "t1", "t2", "t2", "t2", "t1", "t2"],
        "success": [True, False, False, False, False, False, True, True],
        "reward": [1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0],
        "num_turns": [1, 2, 3, 1, 1, 1, 2, 2],
        "format_errors": [0, 1, 0, 0, 0, 1, 0, 0],
        "turns_played": [1, 2, 3, 1, 1, 1, 2, 2],
        "agent_tokens": [10, 20, 30, 10, 10, 10, 5, 5],
    })
    s = summarize(eps, ["policy"], [1, 3])
    a = s.filter(pl.col("policy") == "a").row(0, named=True)
    assert a["episodes"] == 6 and a["tasks"] == 2 and a["success_rate"] == pytest.approx(1 / 6)
    assert a["pass@1"] == pytest.approx((1 / 3 + 0) / 2) and a["pass@3"] == pytest.approx(0.5)
    assert a["format_error_rate"] == pytest.approx(2 / 9) and a["tokens_per_episode"] == pytest.approx(15)
    b = s.filter(pl.col("policy") == "b").row(0, named=True)
    assert b["pass@1"] == 1.0 and b.get("pass@3") is None  # b has one sample per task: no pass@3
    text = format_summary(s)
    assert text["success"][0].startswith("0.17 [") and "reward" in text.columns


# ---- evaluate in the store ---------------------------------------------------------------------------


@pytest.fixture
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def small(model, **kw) -> EvalConfig:
    base = dict(policies=("scripted:doors", f"hf:{model}"), env="doors", tasks=4, samples=2, difficulty=1,
                max_turns=2, max_new_tokens=8, template="action", tokenizer=str(model), ks=(1, 2),
                progress=False)
    base.update(kw)
    return EvalConfig(**base)


def test_evaluate_compares_policies_and_reuses_stored_runs(tmp_path, model):
    cfg = small(model)
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = evaluate(cfg, lake)
        assert set(res.runs) == {"scripted:doors", f"hf:{model}"}
        s = {r["policy"]: r for r in res.summary.iter_rows(named=True)}
        expert, tiny = s["scripted:doors"], s[f"hf:{model}"]
        assert expert["success_rate"] == 1.0 and expert["pass@2"] == 1.0 and expert["format_error_rate"] == 0
        assert expert["episodes"] == 8 and expert["tasks"] == 4 and expert["reward_mean"] >= 1.0
        assert tiny["format_error_rate"] > 0.5 and tiny["reward_mean"] < expert["reward_mean"]  # random weights
        kinds = lake.query("SELECT DISTINCT kind FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                           [list(res.runs.values())])["kind"].to_list()
        assert kinds == ["eval"]
        n = lake.count("episodes")
        again = evaluate(cfg, lake)  # same settings: the same runs, read back, nothing played again
        assert again.runs == res.runs and lake.count("episodes") == n
        assert again.summary.equals(res.summary)
        other = evaluate(small(model, policies=("scripted:doors",), seed=1), lake)
        assert other.runs["scripted:doors"] != res.runs["scripted:doors"]


def test_eval_run_id_depends_on_settings_not_on_reporting(model):
    a = small(model)
    assert eval_run_id(a, "scripted:doors") == eval_run_id(small(model, ks=(1,), confidence=0.9), "scripted:doors")
    assert eval_run_id(a, "scripted:doors") != eval_run_id(small(model, tasks=5), "scripted:doors")
    assert eval_run_id(a, "scripted:doors") != eval_run_id(a, f"hf:{model}")


def test_eval_config_errors(model):
    with pytest.raises(TrajlakeError, match="greedy decoding with samples = 2"):
        small(model, greedy=True)
    with pytest.raises(TrajlakeError, match="at least one policy"):
        small(model, policies=())
    with pytest.raises(TrajlakeError, match="given twice"):
        small(model, policies=("scripted:doors", "scripted:doors"))
    with pytest.raises(TrajlakeError, match="confidence"):
        small(model, confidence=1.0)


def test_evaluate_unknown_run_policy_is_an_error_and_stores_nothing(tmp_path, model):
    with Lake.open(str(tmp_path / "lake")) as lake:
        before = lake.current_snapshot()
        with pytest.raises(TrajlakeError, match="train run 'nope' has no checkpoint"):
            evaluate(small(model, policies=("run:nope",)), lake)
        assert lake.current_snapshot() == before


def lake_state(lake: Lake) -> tuple:
    """Every snapshot and the row counts of the tables an evaluation writes: a refused one leaves them as they were."""
    return lake.snapshots().to_dicts(), {t: lake.count(t) for t in ("runs", "episodes", "turns", "policies")}


@pytest.mark.parametrize("bad, words", [
    ("hf:/nonexistent", ["policy hf:/nonexistent: no model at /nonexistent"]),
    ("vllm:/nonexistent", ["policy vllm:/nonexistent: no model at /nonexistent"]),
    ("policy:nope", ["no policy 'nope' in the store"]),
    ("scripted:maze", ["scripted:maze is the expert of env 'maze', but the env played is 'doors'"]),
    ("scripted:doors?noise=2", ["noise must be a probability"]),
    ("openai:http://127.0.0.1:9", ["openai:URL#MODEL"]),
    ("gpt:4", ["unknown policy spec 'gpt:4'"]),
])
def test_a_bad_later_policy_is_refused_before_the_first_is_played(tmp_path, model, capsys, bad, words):
    """Every policy is checked before any is played: a bad second one used to leave the first one's episodes."""
    uri = str(tmp_path / "lake")
    with Lake.open(uri) as lake:
        evaluate(small(model, policies=("scripted:doors",), tasks=1), lake)  # something to leave untouched
        before = lake_state(lake)
        with pytest.raises(TrajlakeError) as e:
            evaluate(small(model, policies=("scripted:doors", bad), seed=7), lake)
        assert all(w in str(e.value) for w in words), str(e.value)
        assert lake_state(lake) == before
    assert main(["--lake", uri, "evaluate", "--policy", "scripted:doors", "--policy", bad, "--env", "doors",
                 "--tasks", "2", "--difficulty", "1", "--tokenizer", str(model), "--template", "action"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and all(w in err[0] for w in words), err
    with Lake.open(uri) as lake:
        assert lake_state(lake) == before


def test_a_stored_eval_run_played_otherwise_is_refused_before_anything_is_played(tmp_path, model):
    """An eval run id is a hash of its settings, so only a run stored under that id by other means can differ;
    collect's RUN_FIELDS check refuses it, for the second policy before the first is played."""
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect

    cfg = small(model)
    rid = eval_run_id(cfg, f"hf:{model}")
    with Lake.open(str(tmp_path / "lake")) as lake:
        collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=1, difficulty=1,
                              template="action", run_id=rid, run_kind="eval", progress=False), lake)
        before = lake_state(lake)
        with pytest.raises(TrajlakeError, match=f"^run {rid} already exists with .*policy 'scripted:doors'"):
            evaluate(cfg, lake)
        assert lake_state(lake) == before


def test_a_missing_tokenizer_is_refused_before_anything_is_played(tmp_path, model):
    with Lake.open(str(tmp_path / "lake")) as lake:
        before = lake_state(lake)
        with pytest.raises(TrajlakeError, match="tokenizer path /nonexistent: no such folder"):
            evaluate(small(model, policies=(f"hf:{model}", "scripted:doors"), tokenizer="/nonexistent"), lake)
        assert lake_state(lake) == before


def test_cli_k_above_samples_is_refused_naming_both(tmp_path, model, capsys):
    """pass@5 of 2 samples is not defined: it used to be dropped without a word."""
    uri = str(tmp_path / "lake")
    with Lake.open(uri) as lake:
        before = lake_state(lake)
    args = ["--lake", uri, "evaluate", "--policy", "scripted:doors", "--env", "doors", "--tasks", "2",
            "--difficulty", "1", "--tokenizer", str(model), "--template", "action", "--samples", "2"]
    assert main([*args, "--k", "5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: evaluate: k = 5 of pass@k exceeds samples = 2: pass@5 needs 5 samples per task; raise "
                   "--samples to 5 or drop --k 5"]
    assert main([*args, "--k", "2", "--k", "3", "--k", "4"]) == 1
    assert capsys.readouterr().err.strip().endswith("raise --samples to 4 or drop --k 3, 4")
    with Lake.open(uri) as lake:
        assert lake_state(lake) == before


def test_eval_config_field_types_are_checked(model):
    with pytest.raises(TrajlakeError, match=r"^evaluate: tasks must be an integer, got '3' \(str\)$"):
        small(model, tasks="3")
    with pytest.raises(TrajlakeError, match=r"^evaluate: ks must be a list of integers, got \(1, 'two'\)"):
        small(model, ks=(1, "two"))
    assert small(model, policies=["scripted:doors"], temperature=1).policies == ("scripted:doors",)
    assert isinstance(small(model, temperature=1).temperature, float)


def test_cli_evaluate(tmp_path, model, capsys):
    uri = str(tmp_path / "lake")
    args = ["--lake", uri, "evaluate", "--policy", "scripted:doors", "--env", "doors", "--tasks", "3",
            "--difficulty", "1", "--tokenizer", str(model), "--template", "action", "--samples", "2", "--k", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "eval run eval-doors-test-" in out and "1.00 [" in out and "pass@2" in out
    assert main(["--lake", uri, "evaluate", "--policy", "scripted:doors", "--env", "doors", "--greedy",
                 "--samples", "3", "--tokenizer", str(model)]) != 0
    assert "greedy decoding with samples = 3" in capsys.readouterr().err


def test_summarize_leaves_env_errors_out():
    eps = pl.DataFrame({"policy": ["a"] * 4, "task_id": ["t1", "t1", "t2", "t2"],
                        "status": ["ok", "error", "ok", "truncated"], "success": [True, False, True, False],
                        "reward": [1.0, 0.0, 1.0, -1.0], "num_turns": [1, 0, 2, 3], "format_errors": [0, 0, 0, 1],
                        "turns_played": [1, 0, 2, 3], "agent_tokens": [5, 0, 5, 9]})
    s = summarize(eps, ["policy"], [1]).row(0, named=True)
    assert s["episodes"] == 3 and s["success_rate"] == pytest.approx(2 / 3) and s["pass@1"] == pytest.approx(0.75)
    assert s == summarize(eps.filter(pl.col("status") != "error"), ["policy"], [1]).row(0, named=True)


def test_evaluate_leaves_env_errors_out_retries_them_and_fails_when_all_error(tmp_path, model, flaky_env, capsys):
    from trajlake.view.report import POLICIES_SQL

    flaky_env.failing = {flaky_env().tasks("test", n=1, difficulty=1)[0].task_id}
    cfg = EvalConfig(policies=("scripted",), env="test-flaky", tasks=4, samples=2, difficulty=1, tokenizer=str(model),
                     ks=(1, 2), progress=False)
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = evaluate(cfg, lake)
        row = res.summary.row(0, named=True)
        assert (row["episodes"], row["tasks"], row["success_rate"], row["pass@2"]) == (6, 3, 1.0, 1.0)
        assert res.errors == 2
        assert res.notes == ["2 episode(s) ended with an env error and are left out: run the same evaluate again "
                             "to retry them"]
        table = lake.query(POLICIES_SQL.replace("{runs}", "")).row(0, named=True)
        assert (table["episodes"], table["success_rate"], table["env_errors"]) == (6, 1.0, 2)

        flaky_env.failing = set()  # the env is back: the same evaluation retries the errored episodes only
        again = evaluate(cfg, lake)
        assert again.runs == res.runs and again.errors == 0 and again.notes == []
        row = again.summary.row(0, named=True)
        assert (row["episodes"], row["tasks"], row["success_rate"]) == (8, 4, 1.0)
        assert lake.query("SELECT count(*) FROM episodes").item() == 10  # the 2 failed attempts stay as history

    flaky_env.down = True
    args = ["--lake", str(tmp_path / "cli"), "evaluate", "--policy", "scripted", "--env", "test-flaky", "--tasks", "2",
            "--difficulty", "1", "--tokenizer", str(model)]
    assert main(args) == 1
    # stderr: the progress bar's last state, then the one error line
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("collect eval-")]
    assert len(err) == 1 and "failed: all 2 episodes ended with an env error" in err[0], err
    assert err[0].startswith("error: evaluate: eval run eval-test-flaky-test-")
    assert err[0].endswith("; run the same evaluate again once the env works")
