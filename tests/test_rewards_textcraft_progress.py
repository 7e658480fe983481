"""rewards/specs/textcraft-progress.toml: TextCraft's own progress signals as per-turn rewards.

What a turn's action got back (the next turn's observation, or the last turn's info.final_observation) earns
+0.02 when it starts "Got " or "Crafted " and -0.01 when it starts "Could not" or "Wrong item format"
(signal result_matches). Scored by hand on made-up turns on every catalog backend, on an env whose
observations never say so (0, not an error) and on turns without a result (an imported last turn: 0), then
on episodes the scripted expert played against AgentGym's real TextCraft server.
"""

from __future__ import annotations

import json
import re

import pytest

from trajlake.core.errors import TrajlakeError
from trajlake.rewards import SPECS_DIR, load_spec, parse_spec
from trajlake.rewards.score import score
from trajlake.schemas import Episode, Turn

SPEC = SPECS_DIR / "textcraft-progress.toml"
GOAL_TEXT = "Crafting commands:\ncraft 4 stick using 2 oak planks\n\nGoal: craft stick."


def episode(eid: str, env: str, status: str, success: bool, observations: list[str | None],
            final: str | None) -> tuple[Episode, list[Turn]]:
    """An episode whose turn i saw observations[i]; its last turn's info keeps `final` (None: no result kept)."""
    n = len(observations)
    turns = [Turn(eid, i, observation=o, action_text=f"a{i}", format_ok=True, response_token_ids=[10 + i],
                  info={"final_observation": final} if i == n - 1 and final is not None else {})
             for i, o in enumerate(observations)]
    return Episode(eid, env=env, status=status, success=success, num_turns=n), turns


EPISODES = [
    # get -> "Got"; a craft without the items -> "Could not"; inventory -> neither; the winning craft, whose
    # result only the last turn's info keeps
    episode("tc", "agentgym/textcraft", "ok", True,
            [GOAL_TEXT, "Got 2 oak planks", "Could not find enough items to craft minecraft:stick",
             "Inventory: [oak planks] (2)"], "Crafted 4 minecraft:stick"),
    # a malformed recipe, then a get as the turn cap ends the episode (a truncated failure)
    episode("wf", "agentgym/textcraft", "truncated", False, [GOAL_TEXT, "Wrong item format: planks"],
            "Got 1 oak log"),
    # imported: the last turn's result is not stored, so that turn's signal is unknown (neither)
    episode("imp", "agentgym/textcraft", "ok", True, [GOAL_TEXT, "Got 1 oak log"], None),
    # another env: its observations never start so, and the spec gives only the goal
    episode("door", "doors", "ok", True, ["A red door and a blue door.", "The red door is locked."],
            "The blue door opens."),
]
#: golden per-turn process rewards (weighted; turn_rewards keeps the non-zero ones) and totals
TURN_REWARDS = {("tc", 0): 0.02, ("tc", 1): -0.01, ("tc", 3): 0.02, ("wf", 0): -0.01, ("wf", 1): 0.02,
                ("imp", 0): 0.02}
TOTALS = {"tc": 1.03, "wf": -0.99, "imp": 1.02, "door": 1.0}


@pytest.fixture
def made(lake):
    lake.append({"episodes": [e for e, _ in EPISODES], "turns": [t for _, ts in EPISODES for t in ts]},
                stage="test")
    return lake


def test_per_turn_rewards_by_hand(made):
    spec = load_spec(SPEC)
    assert spec.allocation.strategy == "per_turn"
    score(made, spec)
    rows = made.query("SELECT episode_id, turn, reward FROM turn_rewards WHERE spec_id = ?", [spec.spec_id]).rows()
    got = {(e, t): r for e, t, r in rows}
    assert got.keys() == TURN_REWARDS.keys()
    assert [got[k] for k in TURN_REWARDS] == pytest.approx(list(TURN_REWARDS.values()))
    rows = made.query("SELECT episode_id, total, components FROM episode_rewards WHERE spec_id = ?",
                      [spec.spec_id], output="arrow").to_pylist()
    totals = {r["episode_id"]: r["total"] for r in rows}
    assert totals == pytest.approx(TOTALS)
    parts = {r["episode_id"]: dict(r["components"]) for r in rows}
    assert parts["tc"] == pytest.approx({"goal": 1.0, "progress": 0.04, "wasted": -0.01})
    assert parts["door"] == pytest.approx({"goal": 1.0, "progress": 0.0, "wasted": 0.0})
    # per_turn: each turn's reward on its last agent token, the goal on the last turn's
    spans = made.query("SELECT turn, reward FROM reward_spans WHERE spec_id = ? AND episode_id = 'tc' "
                       "ORDER BY turn", [spec.spec_id]).rows()
    assert [t for t, _ in spans] == [0, 1, 3]
    assert [r for _, r in spans] == pytest.approx([0.02, -0.01, 1.02])


def test_an_unknown_result_counts_as_false_when_asked(made):
    # unknown = "false": the imported last turn (no result stored) gets the penalty like a turn that got nothing
    spec = parse_spec('name = "u"\n[allocation]\nstrategy = "per_turn"\n[[components]]\nkind = "process"\n'
                      'signal = "result_matches"\npattern = "^Got "\nreward = 1.0\npenalty = -0.5\nunknown = "false"\n')
    score(made, spec)
    got = dict(made.query("SELECT episode_id, total FROM episode_rewards WHERE spec_id = ?", [spec.spec_id]).rows())
    assert got == pytest.approx({"tc": 1 - 0.5 * 3, "wf": -0.5 + 1, "imp": 1 - 0.5, "door": -0.5 * 2})


@pytest.mark.parametrize("component, message", [
    ('signal = "result_matches"\n', r"signal result_matches needs a pattern"),
    ('signal = "positive_step"\npattern = "^Got"\n', r"pattern goes only with that signal"),
    ('expr = "1"\npattern = "^Got"\n', r"pattern goes only with that signal"),
    ('signal = "result_matches"\npattern = "(Got"\n', r"bad regex '\(Got'"),
])
def test_pattern_mistakes_are_refused(component, message):
    with pytest.raises(TrajlakeError, match=message):
        parse_spec(f'name = "bad"\n[[components]]\nkind = "process"\n{component}')


def test_specs_without_a_pattern_keep_their_ids():
    # `pattern` was added after specs were stored: left out of the content an id hashes when unset
    process = load_spec(SPECS_DIR / "process.toml")
    assert all("pattern" not in c for c in process.to_json()["components"])
    with_it = load_spec(SPEC).to_json()["components"]
    assert [c.get("pattern") for c in with_it] == [None, "^(Got|Crafted) ", "^(Could not|Wrong item format)"]


def test_expert_episodes_on_the_real_server(textcraft_url, tiny, tmp_path):
    """Every turn of the scripted expert's wins is scored by what the real server answered it."""
    from tests.helpers import cfg
    from trajlake.collect.rollout import collect
    from trajlake.store import Lake

    with Lake.open(str(tmp_path / "tc-lake")) as lake:
        collect(cfg(env="agentgym/textcraft", env_url=textcraft_url, policy="scripted", tokenizer=str(tiny),
                    tasks=2, split="val", max_turns=30, run_id="expert"), lake)
        spec = load_spec(SPEC)
        score(lake, spec)
        turns = lake.query("SELECT episode_id, turn, observation, info FROM turns ORDER BY episode_id, turn")
        results = {}  # what each action got back, read in Python from the stored turns
        rows = turns.to_dicts()
        for row, nxt in zip(rows, rows[1:] + [None], strict=True):
            same = nxt is not None and nxt["episode_id"] == row["episode_id"]
            info = row["info"] if isinstance(row["info"], dict) else json.loads(row["info"] or "{}")
            results[(row["episode_id"], row["turn"])] = nxt["observation"] if same else info["final_observation"]
        assert any(v.startswith("Got ") for v in results.values())
        want = {k: 0.02 if re.match(r"(Got|Crafted) ", v) else -0.01 if re.match("Could not|Wrong item format", v)
                else 0.0 for k, v in results.items()}
        got = {(e, t): r for e, t, r in lake.query("SELECT episode_id, turn, reward FROM turn_rewards "
                                                   "WHERE spec_id = ?", [spec.spec_id]).rows()}
        assert got == pytest.approx({k: v for k, v in want.items() if v})
        last = {e: max(t for x, t in results if x == e) for e, _ in results}
        assert all(results[(e, t)].startswith("Crafted ") and got[(e, t)] == pytest.approx(0.02)
                   for e, t in last.items())  # the winning craft, read from info.final_observation
        totals = dict(lake.query("SELECT episode_id, total FROM episode_rewards WHERE spec_id = ?",
                                 [spec.spec_id]).rows())
        assert totals == pytest.approx({e: 1.0 + sum(v for (x, _), v in want.items() if x == e) for e in last})
