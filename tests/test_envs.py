"""The env protocol, checked on every registered env (trajlake.collect.envs)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from trajlake.collect.envs import DEFAULT_N, SPLITS, Env, env_info, env_names, make_env, register_env
from trajlake.schemas.records import Task

BUILTINS = {"doors", "maze", "crafting", "guess"}
NAMES = [n for n in env_names() if n in BUILTINS]  # third-party envs have their own tests
# Well-formed in some env: random play mixes them in so that transcripts hit valid and invalid branches.
ACTION_POOL = ["move north", "move east", "move south", "move west", "open red", "open blue", "read sign",
               "guess 3", "guess 12", "inventory", "get wood", "craft stick", "xyzzy", ""]
# An action with a known verb but an argument out of range, per env.
OUT_OF_RANGE = {"doors": ["open chartreuse", "read book"], "maze": ["move up", "move"],
                "crafting": ["get diamond", "craft diamond", "get"], "guess": ["guess 1000", "guess abc", "guess"]}
INVALID = ["", "   ", None, "asdf qwer zxcv", "fly north", "dance", "<action>open</action>" * 20]


def run_expert(env: Env, task: Task) -> tuple[list, dict]:
    """Play `task` with the env's expert; the transcript and the last info."""
    expert = env.expert()
    obs = env.reset(task)
    expert.reset(task)
    transcript, done = [obs], False
    while not done:
        action = expert.act(obs)
        obs, reward, done, info = env.step(action)
        transcript.append((action, obs, reward, done, info))
    return transcript, info


def play(env: Env, task: Task, actions: list) -> list:
    """Play `actions` (stopping at done) and return the transcript."""
    transcript = [env.reset(task)]
    for action in actions:
        transcript.append(env.step(action))
        if transcript[-1][2]:
            break
    return transcript


@pytest.fixture(params=NAMES)
def name(request) -> str:
    return request.param


def test_registry_lists_the_builtins():
    assert BUILTINS <= set(NAMES)
    info = {row["name"]: row for row in env_info()}
    assert set(info) == set(env_names())
    for row in info.values():
        assert row["description"] and row["actions"] and row["splits"]
        if row["remote"]:  # AgentGym's servers: their own splits of data indices, no difficulty levels
            assert row["name"].startswith("agentgym/") and set(row["splits"]) <= set(SPLITS) and not row["difficulties"]
            assert set(row["split_sizes"]) == (set() if row["name"] == "agentgym/trajlake" else set(row["splits"]))
        else:
            assert row["splits"] == list(SPLITS) and row["difficulties"] and row["split_sizes"] == {}
    textcraft = info["agentgym/textcraft"]
    assert textcraft["split_sizes"] == {"test": 100, "val": 100, "train": 344}
    assert textcraft["split_scheme"] == "stratified-v1"
    assert set(textcraft["split_difficulty"]) == {"test", "val", "train"}  # crafting depth: tests/test_agentgym_splits


def test_unknown_env_lists_the_valid_ones():
    with pytest.raises(KeyError) as e:
        make_env("no-such-env")
    assert all(n in str(e.value) for n in NAMES)


def test_register_env_refuses_a_taken_name():
    with pytest.raises(ValueError, match="taken"):
        register_env(type("OtherMaze", (make_env("maze").__class__,), {"name": "maze"}))
    with pytest.raises(ValueError, match="no `name`"):
        register_env(type("Nameless", (Env,), {"name": ""}))


def test_class_attributes(name):
    env = make_env(name)
    assert env.name == name and env.description and env.action_help
    assert env.difficulties == tuple(sorted(env.max_steps)) and env.difficulties[0] == 1


def test_tasks_are_deterministic_and_well_formed(name):
    env = make_env(name)
    for split in SPLITS:
        tasks = env.tasks(split, n=16)
        assert tasks == make_env(name).tasks(split, n=16)
        assert len({t.task_id for t in tasks}) == 16
        for i, t in enumerate(tasks):
            d = env.difficulties[i % len(env.difficulties)]
            assert t.task_id == f"{name}/{split}/{d}/{i // len(env.difficulties)}"
            assert (t.env, t.split, t.meta["difficulty"]) == (name, split, d)
            assert isinstance(t.seed, int) and t.instruction
            assert t == env.tasks(split, n=i // len(env.difficulties) + 1, difficulty=d)[-1]
    assert len(env.tasks("val", difficulty=1)) == DEFAULT_N["val"]


def test_splits_are_disjoint(name):
    env = make_env(name)
    seeds, contents = {}, {}
    for split in SPLITS:
        tasks = [t for d in env.difficulties for t in env.tasks(split, n=60, difficulty=d)]
        seeds[split] = {(t.meta["difficulty"], t.seed) for t in tasks}
        contents[split] = {json.dumps([t.instruction, t.ground_truth], sort_keys=True) for t in tasks}
    for a, b in [("train", "val"), ("train", "test"), ("val", "test")]:
        assert not seeds[a] & seeds[b] and not contents[a] & contents[b]


def test_unknown_split_and_difficulty_list_the_valid_ones(name):
    env = make_env(name)
    with pytest.raises(ValueError, match="train, val, test"):
        env.tasks("dev")
    with pytest.raises(ValueError, match="valid"):
        env.tasks("train", n=1, difficulty=99)


@pytest.mark.parametrize("split", SPLITS)
def test_expert_solves_every_task(name, split):
    env = make_env(name)
    for d in env.difficulties:
        for task in env.tasks(split, n=30, difficulty=d):
            transcript, info = run_expert(env, task)
            steps = transcript[1:]
            assert info["success"] and info["score"] == 1.0, task
            assert len(steps) == task.meta["optimal_steps"] <= env.max_steps[d]
            assert all(s[4]["valid"] for s in steps) and sum(s[2] for s in steps) == 1.0


def test_a_task_survives_a_json_round_trip(name):
    # Tasks are stored in the lake as JSON columns: a task read back must play the same game.
    env = make_env(name)
    for task in env.tasks("test", n=8):
        back = Task(**json.loads(json.dumps(dataclasses.asdict(task))))
        assert run_expert(env, back) == run_expert(make_env(name), task)


def test_same_actions_give_the_same_transcript(name):
    for task in make_env(name).tasks("train", n=12):
        rng = random.Random(task.seed)
        actions = [rng.choice(ACTION_POOL) for _ in range(60)]
        assert play(make_env(name), task, actions) == play(make_env(name), task, actions)


def test_invalid_actions_are_answered_and_the_episode_goes_on(name):
    env = make_env(name)
    task = env.tasks("train", n=1, difficulty=1)[0]
    for bad in INVALID + OUT_OF_RANGE[name]:
        env.reset(task)
        obs, reward, done, info = env.step(bad)
        assert (info["valid"], done, reward) == (False, False, 0.0), bad
        assert env.action_help in obs and len(obs) < 200
        # The bad action cost a turn but nothing else: the expert still wins from here.
        expert = env.expert()
        expert.reset(task)
        while not done:
            obs, reward, done, info = env.step(expert.act(obs))
        assert info["success"], bad


def test_invalid_penalty_is_the_reward_of_an_invalid_action(name):
    env = make_env(name, invalid_penalty=-0.1)
    env.reset(env.tasks("train", n=1)[0])
    assert env.step("xyzzy")[1] == -0.1


def test_stepping_outside_an_episode_raises(name):
    env = make_env(name)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("xyzzy")
    task = env.tasks("train", n=1)[0]
    run_expert(env, task)
    with pytest.raises(RuntimeError, match="over"):
        env.step("xyzzy")
    env.reset(task)
    env.close()
    with pytest.raises(RuntimeError):
        env.step("xyzzy")


def test_reset_refuses_another_envs_task(name):
    other = next(n for n in BUILTINS if n != name)
    with pytest.raises(ValueError, match="not"):
        make_env(name).reset(make_env(other).tasks("train", n=1)[0])


def test_the_step_limit_ends_the_episode_unsuccessfully(name):
    env = make_env(name)
    for d in env.difficulties:
        transcript = play(env, env.tasks("val", n=1, difficulty=d)[0], ["xyzzy"] * 100)
        assert len(transcript) - 1 == env.max_steps[d]
        obs, reward, done, info = transcript[-1]
        assert done and not info["success"] and info["score"] == 0.0 and "Out of steps" in obs


def test_instances_do_not_interfere(name):
    tasks = make_env(name).tasks("test", n=8)
    alone = [run_expert(make_env(name), t)[0] for t in tasks[:2]]
    # Two instances stepped in turns, each with its own expert, must play exactly what they play alone.
    envs, experts = [make_env(name), make_env(name)], [make_env(name).expert(), make_env(name).expert()]
    obs, transcripts, done = [], [], [False, False]
    for env, expert, task in zip(envs, experts, tasks[:2], strict=True):
        obs.append(env.reset(task))
        expert.reset(task)
        transcripts.append([obs[-1]])
    while not all(done):
        for i in (0, 1):
            if not done[i]:
                action = experts[i].act(obs[i])
                obs[i], reward, done[i], info = envs[i].step(action)
                transcripts[i].append((action, obs[i], reward, done[i], info))
    assert transcripts == alone
