"""Turn-level advantages in the trainer: the turn structure of stored episodes reaches the estimators of
train/algos/turns.py (gigpo, turn_reinforce, turn_gae), and a multi-turn iteration trains with each."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import small_cfg, varied_spec
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake
from trajlake.train.algos.turns import observation_key
from trajlake.train.batch import collate, load_episodes
from trajlake.train.config import ConfigError
from trajlake.train.loop import train

MULTI = dict(env="maze", difficulty=1, max_turns=3, template="action", system_prompt="Reach the goal.")


@pytest.fixture
def lake(tmp_path):
    lk = Lake.open(str(tmp_path / "lake"))
    yield lk
    lk.close()


def test_stored_episodes_carry_their_turns_into_the_batch(tiny, lake):
    collect(CollectConfig(policy="scripted:maze", tokenizer=str(tiny), tasks=3, samples=2, run_id="m",
                          progress=False, **MULTI), lake)
    seqs = load_episodes(lake, "run_id = 'm'", snapshot=lake.current_snapshot())
    batch = collate(seqs)
    turns = lake.query("SELECT e.episode_id, t.turn, t.observation FROM turns t JOIN episodes e USING (episode_id) "
                       "WHERE run_id = 'm' ORDER BY e.episode_id, t.turn")
    assert max(turns["turn"]) >= 1  # multi-turn episodes
    for b, s in enumerate(seqs):
        mine = turns.filter(turns["episode_id"] == s.episode_id)
        # each response token knows its turn; prompt and padding tokens are -1
        on = batch.loss_mask[b] > 0
        assert (batch.turn_index[b][~on] == -1).all()
        assert sorted(set(batch.turn_index[b][on].tolist())) == mine["turn"].to_list()
        keys = batch.step_keys[b, : mine.height].tolist()
        assert keys == [observation_key(o) for o in mine["observation"]]
    sub = batch.rows([2, 0])
    assert torch.equal(sub.turn_index, batch.turn_index[[2, 0], : sub.input_ids.shape[1]])
    assert torch.equal(sub.step_keys, batch.step_keys[[2, 0]])


@pytest.mark.parametrize("algo, advantage, extra", [
    ("grpo", "gigpo", {"gamma": 0.95, "step_advantage_weight": 0.5}),
    pytest.param("grpo", "turn_reinforce", {"turn_baseline": "turn"}, marks=pytest.mark.slow),
    pytest.param("ppo", "turn_gae", {"critic_lr": 1e-3}, marks=pytest.mark.slow),
])
def test_a_multi_turn_iteration_trains_with_each_turn_estimator(algo, advantage, extra, tiny, lake, tmp_path):
    cfg = small_cfg(tiny, algo=algo, advantage=advantage, run_id=advantage, tasks=2, samples=2, iterations=1,
                    minibatch_size=4, micro_batch=2, reward_spec=varied_spec(tmp_path), **MULTI, **extra)
    before = load_file(str(tiny / "model.safetensors"))
    res = train(cfg, lake)
    m = json.loads(lake.query("SELECT metrics FROM train_steps WHERE run_id = ?", [advantage])["metrics"][0])
    assert res.step == 1 and m["signal_rows"] > 0 and m["adv_abs_mean"] > 0
    ckpt = lake.query("SELECT checkpoint_uri FROM policies WHERE policy_id = ?", [res.policy_id])[0, 0]
    after = load_file(f"{ckpt}/model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before), "the update changed no parameter"


def test_turn_estimator_settings_are_checked(tiny, tmp_path):
    with pytest.raises(ConfigError, match="advantage turn_gae needs a critic: use algo ppo"):
        small_cfg(tiny, advantage="turn_gae")
    with pytest.raises(ConfigError, match="algo ppo trains a critic for advantage gae or turn_gae"):
        small_cfg(tiny, algo="ppo", advantage="gigpo")
    with pytest.raises(ConfigError, match="unknown turn_baseline 'mean'; valid: none, turn, episode"):
        small_cfg(tiny, advantage="turn_reinforce", turn_baseline="mean")
    with pytest.raises(ConfigError, match="gigpo compares the samples of a task: samples must be >= 2"):
        small_cfg(tiny, advantage="gigpo", samples=1)


def test_a_discounting_spec_is_refused_with_a_turn_estimator(tiny, lake, tmp_path):
    spec = tmp_path / "disc.toml"
    spec.write_text('name = "disc"\n[allocation]\nstrategy = "discounted"\ngamma = 0.9\n'
                    '[[components]]\nkind = "goal"\n')
    cfg = small_cfg(tiny, advantage="gigpo", run_id="d", tasks=2, samples=2, iterations=1, reward_spec=str(spec),
                    **MULTI)
    with pytest.raises(TrajlakeError, match="gigpo discounts across turns itself"):
        train(cfg, lake)
    assert lake.query("SELECT count(*) AS n FROM train_steps")["n"][0] == 0


def test_the_env_is_checked_when_the_config_is_made(tiny):
    with pytest.raises(ConfigError, match="train config: unknown env 'nope'; valid envs: "):
        small_cfg(tiny, env="nope")
    with pytest.raises(ConfigError, match=r"agentgym/textcraft plays an AgentGym server: give its URL \(--env-url"):
        small_cfg(tiny, env="agentgym/textcraft", difficulty=None)
    # SFT plays nothing (unless it evaluates), so its config needs no server
    small_cfg(tiny, algo="sft", env="agentgym/textcraft", difficulty=None, sft_filter="true")
    small_cfg(tiny, env="agentgym/textcraft", difficulty=None, env_url="http://127.0.0.1:36001")
