"""RL on stored rollouts (train/sources/stored.py): a train config's train_filter trains GRPO on episodes already in
the store, with the ratio against their behaviour log-probs, without collecting; the refusals leave the lake as
it was."""

from __future__ import annotations

import json

import pytest

from tests.helpers import flat_params, small_cfg, tiny_model_dir, varied_spec
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.core.errors import TrajlakeError
from trajlake.rewards import load_spec
from trajlake.store import Lake
from trajlake.train.config import ConfigError, config_from_dict
from trajlake.train.loop import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TABLES = ("runs", "episodes", "train_steps", "policies", "episode_rewards")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def stored(tmp_path_factory, model):
    """A lake holding one GRPO iteration's rollouts of the tiny model (run g0/it-1: 3 tasks x 2 samples, with
    behaviour log-probs) and 2 scripted-expert episodes (text: none)."""
    folder = tmp_path_factory.mktemp("replay")
    spec = varied_spec(folder)
    lake = Lake.open(str(folder / "lake"))
    train(small_cfg(model, run_id="g0", tasks=3, samples=2, iterations=1, minibatch_size=6, micro_batch=3,
                    reward_spec=spec, checkpoint_dir=str(folder / "ckpt")), lake)
    collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=2, difficulty=1,
                          template="action", run_id="expert", progress=False), lake)
    yield lake, spec, folder
    lake.close()


def state(lake: Lake) -> tuple:
    return lake.snapshots().to_dicts(), {t: lake.count(t) for t in TABLES}


def test_grpo_trains_on_stored_rollouts_without_collecting(stored, model):
    lake, spec, folder = stored
    from trajlake.lm.load import load_model

    cfg = small_cfg(model, run_id="r1", train_filter="run_id = 'g0/it-1'", old_logprobs="behaviour", tasks=2,
                    samples=2, iterations=2, minibatch_size=4, micro_batch=2, reward_spec=spec,
                    checkpoint_dir=str(folder / "ckpt"))
    episodes = lake.count("episodes")
    res = train(cfg, lake)
    assert res.step == 2 and lake.count("episodes") == episodes, "a replay run plays no episode"
    assert lake.query("SELECT count(*) FROM runs WHERE parent_run_id = 'r1'")[0, 0] == 0
    for m in res.history:  # 2 groups of 2 an iteration: groups 1-2, then 3 and (wrapping) 1
        assert m["episodes"] == 4 and m["replayed"] == 1.0 and m["groups_left_out"] == 0
        assert "behaviour_kl" in m
    # lineage: each step names the episodes it trained on (a filter at its snapshot) and the spec
    row = lake.query("SELECT snapshot_read, metrics->>'episodes_where' AS w, spec_id, episode_ids "
                     "FROM train_steps WHERE run_id = 'r1' AND step = 2").row(0, named=True)
    made = lake.query(f"SELECT episode_id FROM episodes WHERE {row['w']} ORDER BY episode_id",
                      snapshot=row["snapshot_read"])
    assert made["episode_id"].to_list() == list(row["episode_ids"]) and len(row["episode_ids"]) == 4
    assert row["spec_id"] == load_spec(spec).spec_id
    config = lake.query("SELECT config FROM runs WHERE run_id = 'r1'")[0, 0]
    config = json.loads(config) if isinstance(config, str) else config
    assert config["train_snapshot_read"] == lake.query(
        "SELECT snapshot_read FROM train_steps WHERE run_id = 'r1' AND step = 1")[0, 0]
    before = flat_params(load_model(model))
    after = flat_params(load_model(lake.query(
        "SELECT checkpoint_uri FROM policies WHERE policy_id = ?", [res.policy_id])[0, 0]))
    assert not bool((before == after).all()), "training on stored rollouts changed no weight"
    # a restart reads the snapshot the run pinned, though the lake has moved on since
    assert train(cfg.replace(iterations=3), lake).step == 3
    reads = lake.query("SELECT step, snapshot_read FROM train_steps WHERE run_id = 'r1' ORDER BY step")
    assert set(reads["snapshot_read"]) == {config["train_snapshot_read"]} and reads.height == 3
    assert lake.current_snapshot() > config["train_snapshot_read"]


@pytest.mark.parametrize("kw, words", [
    (dict(train_filter="run_id = 'nope'"), "train_filter \"run_id = 'nope'\" matches no episodes"),
    (dict(train_filter="run_id = 'expert'"), "played by text-only policies"),
    (dict(train_filter="true); DELETE FROM episodes; SELECT (1"), "is not a SQL filter over episodes columns"),
    (dict(train_filter="run_id = 'g0/it-1' AND sample_index = 0"), "has no group of 2 or more episodes"),
    (dict(replay_ratio=0.5, replay_filter="nosuch > 1"), "replay_filter 'nosuch > 1' is not a SQL filter"),
])
def test_bad_stored_data_is_refused_and_writes_nothing(stored, model, kw, words):
    lake, spec, folder = stored
    cfg = small_cfg(model, run_id="bad", old_logprobs="behaviour", tasks=2, samples=2, iterations=1,
                    minibatch_size=4, micro_batch=2, reward_spec=spec, checkpoint_dir=str(folder / "ckpt"), **kw)
    before = state(lake)
    with pytest.raises(TrajlakeError) as e:
        train(cfg, lake)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert state(lake) == before


def test_fresh_rollouts_with_a_replayed_share(stored, model):
    """replay_ratio 0.5: from the second iteration on, as many groups of the last iteration's rollouts (those
    replay_filter keeps) as fresh ones; the first has none to replay."""
    lake, spec, folder = stored
    cfg = small_cfg(model, run_id="mix", replay_ratio=0.5, replay_filter="sample_index >= 0", old_logprobs="behaviour",
                    tasks=2, samples=2, iterations=2, minibatch_size=8, micro_batch=4, reward_spec=spec,
                    checkpoint_dir=str(folder / "ckpt"))
    res = train(cfg, lake)
    assert [m["replayed"] for m in res.history] == [0.0, 0.5]
    assert [m["episodes"] for m in res.history] == [4, 8]
    assert "mix/it-1" in res.history[1]["episodes_where"] and "behaviour_kl" in res.history[1]


@pytest.mark.parametrize("kw, words", [
    (dict(replay_ratio=0.5), "replay_ratio trains on earlier policies' rollouts"),
    (dict(replay_ratio=1.0, is_cap=2.0), "replay_ratio must be in [0, 1)"),
    (dict(replay_filter="success"), "replay_filter narrows what is replayed: set replay_ratio > 0 too"),
    (dict(replay_ratio=0.5, is_cap=2.0, train_filter="success"), "not with train_filter"),
    (dict(train_snapshot=3), "train_snapshot pins the episodes of train_filter"),
    (dict(train_filter="success"), "old_logprobs = \"behaviour\", or truncated importance weights with is_cap"),
    (dict(train_filter="success", algo="sft"), "algo sft has no [data] section; leave out train_filter"),
    (dict(train_filter=" ", is_cap=2.0), "train_filter is empty"),
])
def test_config_rules(kw, words):
    with pytest.raises(ConfigError, match="^train config: ") as e:
        config_from_dict(dict(model="m", **kw))
    assert words in str(e.value)


def test_cli_train_filter_option(tmp_path, model, capsys):
    from trajlake.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'model = "{model}"\nold_logprobs = "behaviour"\nprogress = false\n')
    code = main(["--lake", str(tmp_path / "lake"), "train", "--config", str(cfg), "--train-filter",
                 "run_id = 'nope'"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: train config: train_filter \"run_id = 'nope'\" matches no episodes"), err
