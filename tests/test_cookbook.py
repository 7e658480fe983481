"""The SQL cookbook (docs/queries/*.sql): every file runs unchanged against a small real lake.

The lake (`demo_lake_uri`, tests/helpers.py; tests/test_report.py reads it too) holds real episodes on doors:
the scripted expert (always succeeds) and the untrained tiny model (never writes a valid action: format errors), as
collect runs and as eval runs (one of them a train run's child), scored under two reward specs, plus a GRPO
and an SFT run's train_steps and a lineage of trained policies, all written through the store's own API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import EXPERT, TRAIN_RUN, demo_lake_uri
from trajlake.store import Lake

QUERIES = Path(__file__).resolve().parents[1] / "docs" / "queries"
#: file -> the columns it returns, in order
COLUMNS = {
    "success_by_env_policy": ["env", "split", "policy_id", "episodes", "success_rate", "mean_env_reward",
                              "mean_turns", "not_ok", "env_errors"],
    "longest_failing_episodes": ["episode_id", "env", "task_id", "policy_id", "run_id", "status", "num_turns",
                                 "num_agent_tokens", "env_reward", "last_reply", "error"],
    "format_errors_by_turn": ["env", "policy_id", "turn", "replies", "format_errors", "error_rate"],
    "reward_spec_diff": ["spec_a", "spec_b", "episode_id", "env", "policy_id", "success", "total_a", "total_b",
                         "delta"],
    "token_counts": ["env", "policy_id", "episodes", "turns", "prompt_tokens", "response_tokens",
                     "prompt_per_episode", "response_per_episode", "response_per_turn", "longest_episode_tokens"],
    "train_curve": ["run_id", "step", "iteration", "success", "reward_mean", "eval_success", "kl", "entropy",
                    "grad_norm", "loss", "policy_id", "snapshot_read"],
    "policy_lineage": ["root_policy_id", "depth", "policy_id", "path", "episodes", "success_rate",
                       "mean_env_reward"],
    "rollouts_of_policy": ["policy_id", "train_run", "spec_id", "step_rows", "episodes", "episode_uses", "rollout_runs",
                           "played_by", "success_rate"],
    "contamination": ["eval_run", "policy_id", "env", "split", "tasks", "contaminated_tasks", "episodes",
                      "success_rate", "clean_tasks", "clean_episodes", "clean_success_rate"],
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    lake = Lake.open(demo_lake_uri(tmp_path_factory))
    yield lake
    lake.close()


def run_file(lake: Lake, name: str, edit=None):
    sql = (QUERIES / f"{name}.sql").read_text()
    return lake.query(edit(sql) if edit else sql)


# ---- every file ----------------------------------------------------------------------------------------
def test_every_file_is_listed_and_documented():
    files = sorted(p.stem for p in QUERIES.glob("*.sql"))
    assert files == sorted(COLUMNS), "a new cookbook query needs its expected columns here"
    readme = (QUERIES / "README.md").read_text()
    for name in files:
        text = (QUERIES / f"{name}.sql").read_text()
        assert text.startswith("-- "), f"{name}.sql must open with a comment saying what it answers"
        assert f"({name}.sql)" in readme, f"{name}.sql is missing from docs/queries/README.md"


@pytest.mark.parametrize("name", sorted(COLUMNS))
def test_query_runs_unchanged(demo, name):
    df = run_file(demo, name)
    assert df.columns == COLUMNS[name]
    assert df.height > 0


# ---- what they say -------------------------------------------------------------------------------------
def test_success_by_env_policy(demo):
    df = run_file(demo, "success_by_env_policy")
    expert = df.filter(df["policy_id"] == EXPERT)
    assert sorted(expert["split"]) == ["test", "train"] and sorted(expert["episodes"]) == [3, 4]
    assert expert["success_rate"].to_list() == [1.0, 1.0], "the scripted expert solves every task"
    tiny = df.filter(df["policy_id"] != EXPERT)
    assert tiny["success_rate"].to_list() == [0.0, 0.0]


def test_format_errors_and_longest_failures(demo):
    df = run_file(demo, "format_errors_by_turn")
    by_policy = {p: g for (p,), g in df.group_by("policy_id")}
    assert by_policy[EXPERT]["format_errors"].sum() == 0
    tiny = by_policy[next(p for p in by_policy if p != EXPERT)]
    assert tiny["error_rate"].to_list() == [1.0] * tiny.height, "the untrained model never writes an action"
    assert tiny["turn"].min() == 0 and tiny.filter(tiny["turn"] == 0)["replies"][0] == 4

    longest = run_file(demo, "longest_failing_episodes")
    assert EXPERT not in set(longest["policy_id"])
    assert longest["num_turns"].to_list() == sorted(longest["num_turns"], reverse=True)


def test_reward_spec_diff_and_its_placeholders(demo):
    df = run_file(demo, "reward_spec_diff")
    assert set(df["spec_a"]) == {"default"} and set(df["spec_b"]) == {"goal-and-turns"}  # the two latest
    assert df.height == min(20, demo.count("episodes"))
    for r in df.iter_rows(named=True):
        assert r["delta"] == pytest.approx(r["total_b"] - r["total_a"], abs=1e-3)
    assert [abs(d) for d in df["delta"]] == sorted((abs(d) for d in df["delta"]), reverse=True)

    swapped = run_file(demo, "reward_spec_diff", lambda s: s.replace(
        "NULL::VARCHAR AS name_a, NULL::VARCHAR AS name_b", "'goal-and-turns' AS name_a, 'default' AS name_b"))
    assert set(swapped["spec_a"]) == {"goal-and-turns"} and set(swapped["spec_b"]) == {"default"}
    assert sorted(swapped["delta"]) == sorted(-d for d in df["delta"])


def test_token_counts_add_up(demo):
    df = run_file(demo, "token_counts")
    agent = demo.query("SELECT policy_id, sum(num_agent_tokens) AS n, count(*) AS eps FROM episodes GROUP BY ALL")
    expected = dict(zip(agent["policy_id"], agent["n"], strict=True))
    assert dict(zip(df["policy_id"], df["response_tokens"], strict=True)) == expected
    assert df["episodes"].sum() == agent["eps"].sum()
    assert (df["prompt_tokens"] > 0).all() and (df["longest_episode_tokens"] > df["response_per_episode"]).all()


def test_train_curve_and_lineage(demo):
    df = run_file(demo, "train_curve")
    grpo = df.filter(df["run_id"] == TRAIN_RUN)
    assert grpo["step"].to_list() == [1, 2, 3] and grpo["iteration"].to_list() == [1, 2, 3]
    assert grpo["success"].to_list() == [0.25, 0.5, 0.75]
    assert grpo["eval_success"].to_list() == [None, 0.5, None]
    sft = df.filter(df["run_id"] == "sft-demo")
    assert sft["loss"].to_list() == [1.0, 0.5] and sft["success"].to_list() == [None, None]

    lineage = run_file(demo, "policy_lineage")
    last = lineage.filter(lineage["policy_id"] == f"{TRAIN_RUN}/step-2").to_dicts()[0]
    assert last["depth"] == 3 and last["root_policy_id"].startswith("hf:")
    assert last["path"].endswith(f"sft-demo/step-2 > {TRAIN_RUN}/step-1 > {TRAIN_RUN}/step-2")
    expert = lineage.filter(lineage["policy_id"] == EXPERT).to_dicts()[0]
    assert expert["depth"] == 0 and expert["episodes"] == 7 and expert["success_rate"] == 1.0


def test_rollouts_of_policy_follow_the_lineage_through_runs(demo):
    df = run_file(demo, "rollouts_of_policy")
    made = {(r["policy_id"], r["train_run"]): r for r in df.to_dicts()}
    tiny = demo.query("SELECT DISTINCT policy_id FROM episodes WHERE run_id = 'collect-tiny'").item()
    # train-demo/step-2: its run's steps 1 and 2 (the tiny model's 2 episodes, one of them twice) and, through
    # its start, sft-demo's 2 steps (the expert's first 4 episodes: the union of 2, then 4)
    grpo, sft = made[(f"{TRAIN_RUN}/step-2", TRAIN_RUN)], made[(f"{TRAIN_RUN}/step-2", "sft-demo")]
    assert (grpo["step_rows"], grpo["episodes"], grpo["episode_uses"]) == (2, 2, 3)
    assert grpo["played_by"] == tiny and grpo["rollout_runs"] == "collect-tiny" and grpo["spec_id"]
    assert (sft["step_rows"], sft["episodes"], sft["episode_uses"]) == (2, 4, 6)
    assert sft["played_by"] == EXPERT and sft["success_rate"] == 1.0 and sft["spec_id"] is None
    # step-1 went through step 1 of its run only; the SFT policy has no train run of GRPO before it
    assert made[(f"{TRAIN_RUN}/step-1", TRAIN_RUN)]["episodes"] == 1
    assert {k[1] for k in made if k[0] == "sft-demo/step-2"} == {"sft-demo"}
