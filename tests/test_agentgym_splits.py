"""Splits that cannot leak: every AgentGym preset with a data size has bounded, disjoint splits; a task index past
its split (or the server's data) is refused before anything reaches the server; a train run's task rotation
cycles inside its split. The reason, shown on AgentGym's real TextCraft server: it wraps the index."""

from __future__ import annotations

import re

import pytest
import requests

from trajlake.collect.envs import make_env
from trajlake.collect.envs.agentgym_presets import PRESETS
from trajlake.collect.envs.agentgym_protocol import Preset, bounded_splits, win_reward_at_least_one
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Task
from trajlake.train.rollouts import rotation_offset

#: a URL nothing listens on: a check that let a request through would fail with a connection error instead
DEAD_URL = "http://127.0.0.1:9"


def _preset(**over) -> Preset:
    return Preset("x", "X", "do it", "act", win_reward_at_least_one, **over)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_split_is_disjoint_and_bounded_where_the_server_has_a_size(name):
    preset = PRESETS[name]
    if preset.send_task:  # trajlake's own server lists each split's tasks itself
        return
    ranges = sorted(preset.splits.values())
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end is not None and end <= start
    if preset.size is not None:
        assert all(end is not None and end <= preset.size for _, end in preset.splits.values())


def test_textcraft_is_544_goals_split_test_val_train():
    tc = PRESETS["textcraft"]
    assert tc.size == 544 and tc.splits == {"test": (0, 100), "val": (100, 200), "train": (200, 544)}
    env = make_env("agentgym/textcraft", url=DEAD_URL)
    train = env.tasks("train")
    assert [t.meta["data_idx"] for t in train] == list(range(200, 544)) and env.split_size("train") == 344
    with pytest.raises(ValueError, match=r"has 344 tasks \(data indices 200..543\); asked for 345"):
        env.tasks("train", n=345)


@pytest.mark.parametrize(("task", "message"), [
    (Task("agentgym/textcraft/train/544", "agentgym/textcraft", split="train", meta={"data_idx": 544}),
     r"has 544 tasks \(data indices 0..543\); data index 544 is past its end"),
    (Task("agentgym/textcraft/test/150", "agentgym/textcraft", split="test", meta={"data_idx": 150}),
     r"split 'test' is data indices 0..99; data index 150 is outside it"),
    (Task("agentgym/textcraft/train/3", "agentgym/textcraft", split="train", meta={"data_idx": 3}),
     r"split 'train' is data indices 200..543; data index 3 is outside it"),
])
def test_an_index_past_its_split_is_refused_before_the_server_is_asked(task, message):
    env = make_env("agentgym/textcraft", url=DEAD_URL)
    with pytest.raises(ValueError, match=message):
        env.reset(task)


def test_a_preset_whose_splits_overlap_or_run_past_its_data_is_refused():
    with pytest.raises(ValueError, match="splits test and train overlap"):
        _preset(splits={"test": (0, 100), "train": (50, None)})
    with pytest.raises(ValueError, match="split train ends past the server's 300 tasks"):
        _preset(size=300, splits={"test": (0, 100), "train": (100, None)})
    with pytest.raises(ValueError, match="too small"):
        bounded_splits(150)
    assert _preset(size=300).splits == {"test": (0, 100), "val": (100, 200), "train": (200, 300)}
    assert _preset().splits["train"] == (200, None)  # a server whose data size is unknown


def test_rotation_cycles_through_whole_blocks_of_a_bounded_split():
    assert [rotation_offset(i, 8, None) for i in (0, 1, 50)] == [0, 8, 400]
    # 344 train goals in blocks of 8: 43 blocks, then around again
    assert [rotation_offset(i, 8, 344) for i in (0, 1, 42, 43, 44)] == [0, 8, 336, 0, 8]
    # 10 tasks a block: 34 whole blocks (340 goals), the last 4 left out of the rotation
    assert max(rotation_offset(i, 10, 344) + 10 for i in range(200)) == 340
    with pytest.raises(TrajlakeError, match=r"tasks per iteration \(400\) exceed the split's 344 tasks"):
        rotation_offset(0, 400, 344)


def _goal(url: str, data_idx: int) -> str:
    created = requests.post(f"{url}/create", json={}, timeout=30).json()
    env_id = created["id"] if isinstance(created, dict) else created
    obs = requests.post(f"{url}/reset", json={"id": env_id, "data_idx": data_idx}, timeout=30).json()["observation"]
    requests.post(f"{url}/close", json={"id": env_id}, timeout=30)
    return re.search(r"Goal: craft ([^.]+)\.", obs).group(1)


def test_the_real_server_wraps_its_index_so_the_client_refuses_it(textcraft_url):
    """Asked directly, AgentGym's TextCraft server answers index 544 with goal 0 (a test goal); the client refuses
    to ask it."""
    assert _goal(textcraft_url, 544) == _goal(textcraft_url, 0) != _goal(textcraft_url, 543)
    env = make_env("agentgym/textcraft", url=textcraft_url)
    with pytest.raises(ValueError, match="data index 544 is past its end"):
        env.reset(Task("t", "agentgym/textcraft", split="train", meta={"data_idx": 544}))
