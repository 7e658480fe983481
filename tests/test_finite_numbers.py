"""Finite numbers at every door: no reward, advantage or report input is stored as NaN or inf. Imports refuse them
naming the file, row and field (tests/test_import_limits.py); an env server's reply is refused like any malformed
reply; reward components are refused naming the episode (and the turn, for process rewards; episode totals in
tests/test_rewards_replay.py); a train step's metrics store such a value as null, named under `non_finite`;
and the store refuses one in a reward column whatever the writer (the last line)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from trajlake.core.errors import SchemaError
from trajlake.schemas import Episode, EpisodeReward, TurnReward
from trajlake.store import Lake


@pytest.fixture
def lake(tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        lake.append({"episodes": [Episode("ok", env="t", env_reward=1.0)]}, stage="test")
        yield lake


@pytest.mark.parametrize("rows, message", [
    ({"episodes": [Episode("e1", env="t", env_reward=math.nan)]}, r"episodes\.env_reward: row 0 holds nan"),
    ({"episodes": [Episode("e1", env="t"), Episode("e2", env="t", env_reward=-math.inf)]},
     r"episodes\.env_reward: row 1 holds -inf"),
    ({"episode_rewards": [EpisodeReward("s", "ok", total=math.inf)]}, r"episode_rewards\.total: row 0 holds inf"),
    ({"episode_rewards": [EpisodeReward("s", "ok", total=1.0, components={"a": 1.0}),
                          EpisodeReward("s", "e9", total=1.0, components={"a": 1.0, "b": math.nan})]},
     r"episode_rewards\.components: row 1 holds nan"),
    ({"turn_rewards": [TurnReward("s", "ok", 0, reward=math.nan)]}, r"turn_rewards\.reward: row 0 holds nan"),
])
def test_the_store_refuses_a_non_finite_reward_from_any_writer(lake, rows, message):
    before = (lake.current_snapshot(), lake.count("episodes"))
    with pytest.raises(SchemaError, match=message + ", not a finite number"):
        lake.append(rows, stage="test")
    assert (lake.current_snapshot(), lake.count("episodes")) == before


def test_finite_and_null_rewards_are_stored(lake):
    lake.append({"episodes": [Episode("e1", env="t", env_reward=None), Episode("e2", env="t", env_reward=-1e300)],
                 "episode_rewards": [EpisodeReward("s", "e1", total=0.5, components={"a": None})]}, stage="test")
    assert lake.count("episodes") == 3 and lake.count("episode_rewards") == 1


def test_a_non_finite_process_reward_names_its_episode_turn_and_components():
    from trajlake.rewards import parse_spec
    from trajlake.rewards.score import RewardValueError, check_turns_finite

    spec = parse_spec('name = "p"\n[[components]]\nkind = "process"\nname = "steps"\nsignal = "format_ok"\n'
                      '[[components]]\nkind = "goal"\n')
    turns = pa.table({"spec_id": ["s"] * 3, "episode_id": ["a", "b", "b"], "turn": pa.array([0, 0, 1], pa.int32()),
                      "reward": [1.0, 0.0, math.inf]})
    with pytest.raises(RewardValueError, match=r"episode b turn 1: the process reward of spec p is inf \(not "
                                               r"finite\), from its per-turn component\(s\) steps"):
        check_turns_finite(turns, spec)
    check_turns_finite(turns.slice(0, 2), spec)  # finite: nothing to say
    check_turns_finite(turns.slice(0, 0), spec)


def test_metrics_store_a_non_finite_value_as_null_and_name_it():
    import torch

    from trajlake.train.checkpoint import clean_metrics

    got = clean_metrics({"loss": 0.1234567, "kl": math.nan, "ratio": np.float32(np.inf), "n": np.int64(3),
                         "entropy": torch.tensor(math.nan), "lr": torch.tensor(1e-6), "note": "x", "ok": True,
                         "groups": {"a": [1.0, -math.inf]}})
    assert got == {"loss": 0.123457, "kl": None, "ratio": None, "n": 3, "entropy": None, "lr": 1e-6, "note": "x",
                   "ok": True, "groups": {"a": [1.0, None]}, "non_finite": ["kl", "ratio", "entropy", "groups.a[1]"]}
    assert "non_finite" not in clean_metrics({"loss": 1.0})


@pytest.mark.parametrize("value, message", [
    (math.nan, "reward is nan, not a finite number"),
    (math.inf, "reward is inf, not a finite number"),
    ("1e999", "reward is inf, not a finite number"),
    (10**400, "reward is not a number"),
    ("much", "reward is not a number"),
])
def test_an_env_server_reward_that_is_not_finite_is_a_malformed_reply(value, message):
    from trajlake.collect.envs.agentgym_client import EnvServerError, _number

    with pytest.raises(EnvServerError, match=message):
        _number(value, "reward", "http://127.0.0.1:1/step")
    assert _number(None, "reward", "u") == 0.0 and _number("0.5", "reward", "u") == 0.5
