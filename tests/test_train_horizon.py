"""The horizon curriculum (AgentGym-RL's ScalingInter-RL): rollouts capped at horizon_start turns, one turn more
every horizon_every iterations up to max_turns. The schedule by hand, the config's refusals, how a restart
compares it, and a real GRPO run on `doors` whose collect runs played the scheduled caps."""

from __future__ import annotations

import json

import pytest

from tests.helpers import small_cfg, tiny_model_dir, varied_spec
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake
from trajlake.train.config import ADDED_FIELDS, RUN_FIELDS, ConfigError, config_from_dict, horizon
from trajlake.train.loop import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("start, every, max_turns, caps", [
    (0, 1, 5, [5, 5, 5, 5]),  # off: max_turns from the first iteration
    (0, 4, 3, [3, 3, 3, 3]),  # (a config refuses horizon_every without horizon_start: see below)
    (1, 1, 3, [1, 2, 3, 3, 3]),
    (2, 3, 4, [2, 2, 2, 3, 3, 3, 4, 4, 4, 4]),
    (4, 2, 4, [4, 4, 4]),  # starting at the cap: the cap throughout
    (3, 1, 30, [3, 4, 5, 6]),
])
def test_schedule_golden_values(start, every, max_turns, caps):
    assert [horizon(it, start, every, max_turns) for it in range(len(caps))] == caps
    if start or every == 1:
        c = config_from_dict(dict(model="m", max_turns=max_turns, horizon_start=start, horizon_every=every))
        assert [c.turns_at(it) for it in range(len(caps))] == caps


def test_defaults_are_off():
    c = config_from_dict(dict(model="m", max_turns=7))
    assert (c.rollout.horizon_start, c.rollout.horizon_every) == (0, 1) and c.turns_at(0) == c.turns_at(100) == 7


@pytest.mark.parametrize("kw, message", [
    (dict(horizon_start=5, max_turns=3), "train config: horizon_start (5) must be at most max_turns (3), the cap "
                                         "it grows to; lower horizon_start or raise max_turns"),
    (dict(horizon_start=-1), "train config: horizon_start must be >= 0, got -1"),
    (dict(horizon_start=1, horizon_every=0), "train config: horizon_every must be >= 1, got 0"),
    (dict(horizon_start=1, horizon_every=-2), "train config: horizon_every must be >= 1, got -2"),
    (dict(horizon_every=2), "train config: horizon_every paces the horizon curriculum: set horizon_start too "
                            "(the first iteration's turn cap), or leave horizon_every out"),
    (dict(horizon_start=1, algo="sft"), "train config: horizon_start caps the turns of the rollouts grpo and ppo "
                                        "collect: not with algo sft or train_filter"),
    (dict(horizon_start=1, train_filter="success", old_logprobs="behaviour"),
     "train config: horizon_start caps the turns of the rollouts grpo and ppo collect"),
    (dict(horizon_start="2"), "train config: horizon_start must be an integer, got '2' (str)"),
])
def test_config_refusals_say_what_to_fix(kw, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict(dict(model="m", **{"max_turns": 4, **kw}))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_restart_compares_the_schedule():
    assert {"horizon_start", "horizon_every"} <= set(RUN_FIELDS) and set(ADDED_FIELDS) <= set(RUN_FIELDS)
    c = config_from_dict(dict(model="m", max_turns=4))
    stored = json.loads(json.dumps(c.to_dict()))
    # a run stored before the fields existed played every iteration at max_turns: the defaults resume it
    old = {k: v for k, v in stored.items() if k not in ADDED_FIELDS}
    # (except the group filter, whose default is not the old behaviour: such a run kept every group)
    assert c.differences(old) == [("group_filter", "all", "outcome_differs")]
    c = c.replace(group_filter="all")
    assert c.differences(old) == []
    assert c.replace(horizon_start=2).differences(old) == [("horizon_start", 0, 2)]
    assert c.replace(horizon_start=1, horizon_every=3).differences(old) == [("horizon_start", 0, 1),
                                                                           ("horizon_every", 1, 3)]
    # a run that has the fields is held to them
    scheduled = c.replace(horizon_start=1, horizon_every=2)
    stored = json.loads(json.dumps(scheduled.to_dict()))
    assert scheduled.differences(stored) == [] and scheduled.replace(iterations=20).differences(stored) == []
    assert scheduled.replace(horizon_every=1).differences(stored) == [("horizon_every", 2, 1)]


def run_config(lake: Lake, run_id: str) -> dict:
    config = lake.query("SELECT config FROM runs WHERE run_id = ?", [run_id])["config"][0]
    return json.loads(config) if isinstance(config, str) else config


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.mark.slow
def test_grpo_rollouts_play_the_scheduled_caps(model, tmp_path):
    kw = dict(run_id="hz", tasks=2, samples=2, iterations=3, minibatch_size=4, micro_batch=4, max_turns=3,
              horizon_start=1, horizon_every=1, eval_every=1, eval_tasks=2, reward_spec=varied_spec(tmp_path))
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = train(small_cfg(model, **kw), lake)
        # each iteration trained (on shaping alone: the untrained model wins nothing, and the run says so)
        assert res.step == 3 and all(h["signal_rows"] > 0 for h in res.history if "signal_rows" in h)
        for n, cap in {1: 1, 2: 2, 3: 3}.items():
            assert run_config(lake, f"hz/it-{n}")["max_turns"] == cap
            eps = lake.query("SELECT episode_id, num_turns, status, error FROM episodes WHERE run_id = ?",
                             [f"hz/it-{n}"]).to_dicts()
            assert len(eps) == 4 and all(1 <= e["num_turns"] <= cap for e in eps), (n, eps)
            assert max(e["num_turns"] for e in eps) == cap  # the untrained model plays on until a cap stops it
            # an episode that did not end itself was cut at this iteration's cap
            assert {e["error"] for e in eps if e["status"] == "truncated"} <= {f"max_turns ({cap}) reached"}
            most = lake.query("SELECT max(t.turn) AS m FROM turns t JOIN episodes e USING (episode_id) "
                              "WHERE e.run_id = ?", [f"hz/it-{n}"])["m"][0]
            assert most < cap
        # the held-out evals play the full max_turns whatever the iteration
        evals = lake.query("SELECT run_id FROM runs WHERE run_id LIKE 'hz/eval-%'")["run_id"].to_list()
        assert len(evals) == 4 and all(run_config(lake, e)["max_turns"] == 3 for e in evals)
        # a restart with another schedule is another run: refused, naming the field
        with pytest.raises(TrajlakeError, match=r"^run hz already exists with horizon_start 1; given 2 "
                                                r"\(use a new --run-id\)$"):
            train(small_cfg(model, **{**kw, "horizon_start": 2}), lake)
