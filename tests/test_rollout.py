"""The batched rollout loop (collect.rollout): real envs, the real tiny model, real DuckLake lakes in tmp_path.

Covers what a collect run stores (episodes, turns, runs, policies, tasks), GRPO groups, format errors, the
turn cap and the context budget, chunked snapshots, config errors, the exact-token promise (ids, logprobs and
loss mask are exactly what the model saw) and task offsets; runs that stop and resume are in
tests/test_rollout_resume.py.

The model and query helpers are in tests/helpers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import (
    BUILTIN,
    EOT,
    TAUGHT_REPLY,
    assert_episodes_whole,
    cfg,
    episodes_of,
    exactness,
    taught_model_dir,
    tiny_model_dir,
    turns_by_episode,
    turns_of,
)
from trajlake.collect.chat import ChatRenderer, full_sequence
from trajlake.collect.config import CollectConfig
from trajlake.collect.envs import env_names, make_env
from trajlake.collect.policies.hf import HFPolicy
from trajlake.collect.rollout import collect, episode_id
from trajlake.collect.templates import get_template
from trajlake.core.errors import TrajlakeError
from trajlake.lm.load import load_tokenizer
from trajlake.store import Lake

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def taught(tmp_path_factory) -> Path:
    return taught_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def hf(tiny) -> HFPolicy:
    """The untrained tiny model (its replies are never well-formed), loaded once for the module."""
    return HFPolicy(tiny)


@pytest.fixture
def lake(tmp_path):
    """A fresh lake, for tests that look at the lake as a whole (opening one costs about a second)."""
    lk = Lake.open(str(tmp_path / "lake"))
    yield lk
    lk.close()


# ---- scripted experts: what a run stores ------------------------------------------------------------
@pytest.mark.parametrize("env", BUILTIN)
def test_scripted_experts_collect_every_env(env, tiny, shared):
    lake = shared
    config = cfg(env=env, policy=f"scripted:{env}", tokenizer=str(tiny), tasks=4, max_turns=60)
    run_id = collect(config, lake)

    eps = episodes_of(lake, run_id)
    assert eps.height == 4
    assert eps["status"].to_list() == ["ok"] * 4, eps["error"].to_list()
    assert eps["success"].all(), "the scripted expert solves every task"
    assert set(eps["env"]) == {env} and set(eps["policy_id"]) == {f"scripted:{env}"}
    tasks = make_env(env).tasks("train", n=4)
    assert sorted(eps["task_id"]) == sorted(t.task_id for t in tasks)
    for row in eps.iter_rows(named=True):
        assert row["episode_id"] == episode_id(run_id, row["task_id"], 0)
        assert row["num_turns"] >= 1 and row["error"] is None
        assert row["started_at"] <= row["finished_at"]

    turns = turns_of(lake, run_id)
    assert turns.height == eps["num_turns"].sum()
    assert_episodes_whole(lake, run_id)
    renderer = ChatRenderer(load_tokenizer(tiny))
    by_ep = turns_by_episode(lake, run_id)
    for row in eps.iter_rows(named=True):
        ts = by_ep[row["episode_id"]]
        assert all(t["format_ok"] for t in ts)
        assert [t["done"] for t in ts] == [False] * (len(ts) - 1) + [True]
        assert row["env_reward"] == pytest.approx(sum(t["step_reward"] for t in ts))
        assert row["num_agent_tokens"] == sum(len(t["response_token_ids"]) for t in ts)
        for t in ts:
            assert t["response_logprobs"] is None  # text policy: no behaviour logprobs
            # a text reply is stored as the template renders it, closed by the end-of-turn token
            assert renderer.decode(t["response_token_ids"]) == t["action_text"] + EOT
            assert get_template("think_action").parse(t["action_text"]) == t["action"]
        assert json.loads(ts[-1]["info"])["success"] is True

    run = lake.query("SELECT * FROM runs WHERE run_id = ?", [run_id])
    assert run["status"].to_list() == ["finished"] and run["kind"][0] == "collect"
    assert run["finished_at"][0] is not None
    conf = json.loads(run["config"][0])
    assert conf["env"] == env and conf["exact_tokens"] is False and conf["system_prompt"]
    pol = lake.query("SELECT * FROM policies WHERE policy_id = ?", [f"scripted:{env}"])
    assert pol.height == 1 and pol["checkpoint_uri"][0] is None  # recorded once, by the run that first played it
    assert lake.query("SELECT kind FROM runs WHERE run_id = ?", [pol["run_id"][0]])["kind"].to_list() == ["collect"]
    stored = lake.query("SELECT * FROM tasks WHERE env = ?", [env])
    assert {t.task_id for t in tasks} <= set(stored["task_id"])
    assert stored.filter(stored["task_id"] == tasks[0].task_id)["instruction"][0] == tasks[0].instruction


def test_group_sampling_gives_k_episodes_per_task(tiny, shared):
    lake = shared
    run_id = collect(cfg(env="doors", policy="scripted", tokenizer=str(tiny), tasks=3, samples=4, concurrency=5),
                     lake)
    eps = episodes_of(lake, run_id)
    assert eps.height == 12
    for task_id, group in eps.group_by("task_id"):
        assert group.height == 4
        assert group["group_id"].n_unique() == 1 and group["group_id"][0] == f"{run_id}:{task_id[0]}"
        assert sorted(group["sample_index"]) == [0, 1, 2, 3]
        assert group["episode_id"].n_unique() == 4
    assert eps["group_id"].n_unique() == 3


def test_hf_group_samples_differ_and_format_errors_continue(tiny, hf, shared):
    """Temperature 1: the K samples of a task start from the same prompt and sample different replies.

    The untrained model never writes <action>...</action>: each turn is stored with format_ok false and the
    raw reply goes to the env, which answers "Invalid action" and the episode goes on to the turn cap."""
    lake = shared
    config = cfg(env="doors", policy=f"hf:{tiny}", difficulty=2, tasks=2, samples=3, max_turns=3,
                 max_new_tokens=8, temperature=1.0)
    run_id = collect(config, lake, policy=hf)
    eps = episodes_of(lake, run_id)
    assert eps.height == 6
    by_ep = turns_by_episode(lake, run_id)
    for _, group in eps.group_by("task_id"):
        first = [by_ep[e][0] for e in group["episode_id"]]
        assert len({tuple(t["prompt_token_ids"]) for t in first}) == 1  # same task, same prompt
        replies = [tuple(t["response_token_ids"]) for t in first]
        assert len(set(replies)) == 3, "the K samples of a group must differ"

    # format errors: stored, answered by the env, never a crash; the episode continues
    assert set(eps["status"]) == {"truncated"} and set(eps["num_turns"]) == {3}
    assert set(eps["error"]) == {"max_turns (3) reached"}
    assert not eps["success"].any()
    for ts in by_ep.values():
        assert [t["format_ok"] for t in ts] == [False] * 3
        assert all(t["action"] is None for t in ts)
        assert all(len(t["response_token_ids"]) == 8 == len(t["response_logprobs"]) for t in ts)
        for prev, t in zip(ts, ts[1:], strict=False):
            assert t["observation"].startswith("Invalid action")
            assert json.loads(prev["info"])["valid"] is False
        assert not ts[-1]["done"]
        assert "final_observation" in json.loads(ts[-1]["info"])
    run = lake.query("SELECT status, config FROM runs WHERE run_id = ?", [run_id])
    assert run["status"][0] == "finished" and json.loads(run["config"][0])["exact_tokens"] is True


def test_on_format_error_empty_sends_empty_action(tiny, hf, shared):
    lake = shared
    run_id = collect(cfg(env="guess", policy=f"hf:{tiny}", tasks=1, max_turns=2, max_new_tokens=4,
                         on_format_error="empty"), lake, policy=hf)
    ts = turns_of(lake, run_id)
    assert ts["observation"][1].startswith("Invalid action. Empty action.")


def test_max_turns_reached_is_truncated(tiny, shared):
    lake = shared
    # maze difficulty 4 needs more than 3 moves: the expert is cut off by the turn cap
    run_id = collect(cfg(env="maze", policy="scripted:maze", tokenizer=str(tiny), tasks=2, difficulty=4,
                         max_turns=3), lake)
    eps = episodes_of(lake, run_id)
    assert eps["status"].to_list() == ["truncated"] * 2
    assert eps["num_turns"].to_list() == [3, 3] and not eps["success"].any()
    assert set(eps["error"]) == {"max_turns (3) reached"}
    assert_episodes_whole(lake, run_id)


def test_context_budget_truncates(tiny, hf, shared):
    lake = shared
    budget = 400
    run_id = collect(cfg(env="guess", policy=f"hf:{tiny}", tasks=3, difficulty=4, max_turns=9, max_new_tokens=16,
                         max_context_tokens=budget), lake, policy=hf)
    eps = episodes_of(lake, run_id)
    by_ep = turns_by_episode(lake, run_id)
    for row in eps.iter_rows(named=True):
        assert row["status"] == "truncated" and row["error"] == "context budget reached", row
        assert 1 <= row["num_turns"] < 9
        ids, _ = full_sequence(by_ep[row["episode_id"]])
        assert len(ids) <= budget  # nothing past the budget was ever shown to the model


def test_context_budget_smaller_than_first_prompt(tiny, shared):
    lake = shared
    run_id = collect(cfg(env="doors", policy="scripted", tokenizer=str(tiny), tasks=2, max_new_tokens=8,
                         max_context_tokens=20), lake)
    eps = episodes_of(lake, run_id)
    assert eps["status"].to_list() == ["truncated"] * 2 and eps["num_turns"].to_list() == [0, 0]
    assert turns_of(lake, run_id).height == 0


def test_chunked_writes_make_whole_snapshots(tiny, lake):
    run_id = collect(cfg(env="doors", policy="scripted", tokenizer=str(tiny), tasks=8, concurrency=2,
                         chunk_turns=3, chunk_seconds=3600), lake)
    snaps = lake.snapshots()
    chunks = snaps.filter(snaps["message"].str.starts_with("collect: ") & snaps["message"].str.contains("episodes"))
    assert chunks.height >= 3
    assert set(chunks["run_id"]) == {run_id}
    assert set(snaps.filter(snaps["stage"] == "collect")["run_id"]) == {run_id}  # start, chunks, finish
    n = sum(int(m.split()[1]) for m in chunks["message"])
    assert n == 8 == episodes_of(lake, run_id).height
    for snap in chunks["snapshot_id"]:  # every chunk snapshot holds whole episodes only
        assert_episodes_whole(lake, run_id, snapshot=snap)


def test_reproducible_with_a_seed(tiny, hf, shared):
    """Same seed, same config: the same sampled ids (a fresh policy over the same weights each time)."""
    ids = []
    for run in ("seed-a", "seed-b"):
        policy = HFPolicy(tiny, model=hf.model, tokenizer=hf.tokenizer)
        rid = collect(cfg(env="guess", policy=f"hf:{tiny}", tasks=2, samples=2, max_turns=2, max_new_tokens=6,
                          seed=7, run_id=run), shared, policy=policy)
        ids.append(turns_of(shared, rid).select("turn", "response_token_ids", "response_logprobs").rows())
    assert ids[0] == ids[1]


# ---- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, message", [
    ("bogus:x", r"unknown policy spec 'bogus:x': use one of hf:\.\.\., vllm:\.\.\., openai:\.\.\., scripted"),
    ("hf:", "needs a model folder"),
    ("hf:/nonexistent/model", "no model at /nonexistent/model"),
    ("openai:http://127.0.0.1:9", "openai:URL#MODEL"),
    ("scripted:maze", "expert of env 'maze', but the env played is 'doors'"),
    ("policy:nope", "no policy 'nope' in the store"),
])
def test_bad_policy_spec_names_the_valid_ones(spec, message, tiny, untouched):
    config = cfg(env="doors", policy=spec, tokenizer=str(tiny))
    with pytest.raises(TrajlakeError, match=message):
        collect(config, untouched)  # and nothing is written (the fixture checks)


def test_unknown_env_names_the_valid_ones(tiny, untouched):
    with pytest.raises(TrajlakeError, match="collect config: unknown env 'nope'; valid envs: ") as err:
        collect(cfg(env="nope", policy="scripted", tokenizer=str(tiny)), untouched)
    assert set(BUILTIN) <= set(str(err.value).split("valid envs: ")[1].split(", "))
    assert set(BUILTIN) <= set(env_names())


def test_cli_collect(tiny, tmp_path, capsys):
    from trajlake.cli import main

    uri = str(tmp_path / "cli-lake")
    assert main(["--lake", uri, "collect", "--env", "guess", "--policy", "scripted:guess", "--tokenizer", str(tiny),
                 "--tasks", "3", "--samples", "2", "--run-id", "cli-run"]) == 0
    out = capsys.readouterr().out
    assert "success_rate" in out and "guess" in out
    with Lake.open(uri) as lk:
        assert episodes_of(lk, "cli-run").height == 6
    assert main(["--lake", uri, "collect", "--env", "guess", "--policy", "nope:x"]) == 1
    assert "unknown policy spec" in capsys.readouterr().err


# ---- exact tokens: the core promise -----------------------------------------------------------------


def test_exact_tokens_untrained_model(tiny, hf, shared):
    """Replies cut off at max_new_tokens (no end-of-turn token): the template's closing starts the next prompt."""
    lake = shared
    run_id = collect(cfg(env="guess", policy=f"hf:{tiny}", tasks=3, samples=2, max_turns=3, max_new_tokens=12,
                         concurrency=4, temperature=0.8), lake, policy=hf)
    endings = exactness(lake, run_id, hf.model, hf.tokenizer, 0.8)
    assert endings.get("cut") == 6


def test_exact_tokens_replies_closed_by_end_of_turn(taught, shared):
    """Replies that end with <|im_end|>, at temperature 0.7, on prompts of different lengths in one batch."""
    lake = shared
    policy = HFPolicy(taught)
    run_id = collect(cfg(env="guess", policy=f"hf:{taught}", template="plain", tasks=4, samples=2, max_turns=3,
                         max_new_tokens=10, temperature=0.7), lake, policy=policy)
    endings = exactness(lake, run_id, policy.model, policy.tokenizer, 0.7)
    assert endings.get("eot", 0) >= 6
    acts = turns_of(lake, run_id)
    assert (acts["action"] == TAUGHT_REPLY).sum() >= acts.height - 2  # a rare other sample is allowed


def test_task_offset_skips_tasks_and_run_policy_needs_a_checkpoint(tmp_path, tmp_path_factory):
    from trajlake.collect.policies import resolve_policy_spec

    model = str(tiny_model_dir(tmp_path_factory))
    base = dict(env="doors", policy="scripted:doors", tokenizer=model, tasks=3, difficulty=1, progress=False)
    with Lake.open(str(tmp_path / "lake")) as lake:
        ids = {}
        for name, offset in (("a", 0), ("b", 2)):
            collect(CollectConfig(**base, task_offset=offset, run_id=name), lake)
            ids[name] = lake.query("SELECT task_id FROM episodes WHERE run_id = ? ORDER BY task_id",
                                   [name])["task_id"].to_list()
        assert ids["b"][0] == ids["a"][2] and len(ids["b"]) == 3  # doors/train/1/2, /3, /4
        with pytest.raises(TrajlakeError, match="train run 'r' has no checkpoint"):
            resolve_policy_spec(lake, "run:r")
        assert resolve_policy_spec(lake, "hf:x") == "hf:x"
    with pytest.raises(TrajlakeError, match="task_offset must be >= 0"):
        CollectConfig(**base, task_offset=-1)
    with pytest.raises(TrajlakeError, match="unknown run_kind"):
        CollectConfig(**base, run_kind="train")
