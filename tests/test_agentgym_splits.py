"""Splits that cannot leak and share one distribution.

Every AgentGym preset with a data size deals its data indices to test, val and train by a seeded permutation
stratified by difficulty (`stratified-v1`): the splits are disjoint, exactly as large as before, the same for a
seed, and TextCraft's (whose server sorts its goals by crafting depth) hold each depth in proportion, where the
old contiguous ranges gave test the easiest goals and train the hardest. The old ranges stay loadable: an old
lake's task (no scheme in its meta) is checked against them, and `split_scheme="contiguous"` plays them. A task
index outside its split (or the server's data) is refused before anything reaches the server; a train run's
task rotation cycles inside its split. Why the refusal matters, shown on AgentGym's real TextCraft server: it
wraps the index.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import re
import subprocess
import sys
from collections import Counter

import pytest
import requests

from trajlake.collect.envs import make_env
from trajlake.collect.envs.agentgym_client import EnvServerError
from trajlake.collect.envs.agentgym_launch import server_missing_reason, textcraft_source
from trajlake.collect.envs.agentgym_presets import PRESETS, TEXTCRAFT_DEPTHS
from trajlake.collect.envs.agentgym_protocol import (
    CONTIGUOUS,
    STRATIFIED,
    Preset,
    bounded_splits,
    deal_splits,
    expand_profile,
    win_reward_at_least_one,
)
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Task
from trajlake.train.sources.fresh import rotation_offset

#: a URL nothing listens on: a check that let a request through would fail with a connection error instead
DEAD_URL = "http://127.0.0.1:9"
SIZED = sorted(name for name, p in PRESETS.items() if p.size is not None)
TC = "agentgym/textcraft"


def _preset(**over) -> Preset:
    return Preset("x", "X", "do it", "act", win_reward_at_least_one, **over)


def _split_sets(preset: Preset, scheme: str) -> dict[str, list[int]]:
    return {s: preset.task_indices(s, None, scheme) for s in preset.splits}


def _task(split: str, idx: int, scheme: str | None = None) -> Task:
    meta = {"data_idx": idx, **({"split_scheme": scheme} if scheme else {})}
    return Task(f"{TC}/{split}/{idx}", TC, split=split, meta=meta)


def _off_proportion(hist: dict[str, dict[int, int]]) -> float:
    """The furthest any split's count of one difficulty is from its proportional share of that difficulty."""
    total = Counter()
    for h in hist.values():
        total.update(h)
    n = sum(total.values())
    sizes = {s: sum(h.values()) for s, h in hist.items()}
    return max(abs(hist[s].get(d, 0) - total[d] * sizes[s] / n) for s in hist for d in total)


# ---- the splits of every preset with a size ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_contiguous_splits_are_disjoint_and_bounded_where_the_server_has_a_size(name):
    preset = PRESETS[name]
    if preset.send_task:  # trajlake's own server lists each split's tasks itself
        return
    ranges = sorted(preset.splits.values())
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end is not None and end <= start
    if preset.size is not None:
        assert all(end is not None and end <= preset.size for _, end in preset.splits.values())


@pytest.mark.parametrize("name", SIZED)
def test_stratified_splits_are_disjoint_cover_the_data_and_keep_their_sizes(name):
    preset = PRESETS[name]
    assert preset.scheme(None) == STRATIFIED
    sets = _split_sets(preset, STRATIFIED)
    assert sorted(i for idx in sets.values() for i in idx) == list(range(preset.size))  # disjoint, covering
    assert {s: len(idx) for s, idx in sets.items()} == {s: preset.split_size(s) for s in preset.splits}
    # the same for a fresh preset of the same data: nothing depends on the process or a cache
    assert _split_sets(dataclasses.replace(preset), STRATIFIED) == sets
    for split, idx in sets.items():  # each index is in its own split and refused in every other
        preset.check_index(idx[0], split, STRATIFIED)
        for other in set(sets) - {split}:
            with pytest.raises(ValueError, match=rf"split '{other}' \({STRATIFIED}\) does not hold data index"):
                preset.check_index(idx[0], other, STRATIFIED)


@pytest.mark.parametrize("name", [n for n in SIZED if len(PRESETS[n].splits) > 1 and not PRESETS[n].difficulty_profile])
def test_without_a_known_difficulty_each_split_holds_its_share_of_every_decile(name):
    """Whatever the server's order means, no split is one end of it: each decile of the data is spread."""
    preset = PRESETS[name]
    deciles = {s: Counter(i * 10 // preset.size for i in idx) for s, idx in _split_sets(preset, STRATIFIED).items()}
    assert _off_proportion(deciles) <= 2
    old = {s: Counter(i * 10 // preset.size for i in idx) for s, idx in _split_sets(preset, CONTIGUOUS).items()}
    assert _off_proportion(old) > 2  # the contiguous ranges are not: test is one end of the data


def test_dealing_is_exact_stratified_and_deterministic_for_a_seed():
    rng = random.Random(7)
    for _ in range(30):
        n = rng.randint(5, 600)
        strata = sorted(rng.randint(0, rng.randint(0, 6)) for _ in range(n))
        cut = sorted(rng.sample(range(1, n), 2))
        sizes = {"test": cut[0], "val": cut[1] - cut[0], "train": n - cut[1]}
        labels = deal_splits(strata, sizes, seed=3)
        assert Counter(labels) == Counter({s: k for s, k in sizes.items() if k})  # exact sizes
        hist = {s: Counter(d for d, lab in zip(strata, labels, strict=True) if lab == s) for s in sizes}
        assert _off_proportion(hist) < 2  # every stratum within about one task of proportional, per split
        assert deal_splits(strata, sizes, seed=3) == labels
    strata, sizes = [0] * 50 + [1] * 50, {"test": 20, "train": 80}
    assert deal_splits(strata, sizes, seed=1) != deal_splits(strata, sizes, seed=2)  # the seed chooses
    with pytest.raises(ValueError, match="add up to 99, not the 100 tasks"):
        deal_splits(strata, {"test": 20, "train": 79}, seed=1)


# ---- TextCraft: crafting depth ------------------------------------------------------------------------------


def test_textcraft_depth_histograms_of_test_val_and_train_match():
    """Each split holds each crafting depth in proportion (within a few goals); the old ranges did not (test was
    all depth 1, train had every depth 3 and 4 goal)."""
    depth = expand_profile(TEXTCRAFT_DEPTHS)
    env = make_env(TC, url=DEAD_URL)  # the tasks a user gets by default
    hist = {s: Counter(depth[t.meta["data_idx"]] for t in env.tasks(s)) for s in ("test", "val", "train")}
    assert {s: sum(h.values()) for s, h in hist.items()} == {"test": 100, "val": 100, "train": 344}
    assert _off_proportion(hist) <= 2
    assert hist == {"test": {1: 23, 2: 54, 3: 21, 4: 2}, "val": {1: 23, 2: 53, 3: 22, 4: 2},
                    "train": {1: 79, 2: 184, 3: 74, 4: 7}}  # as docs/agentgym.md and `trajlake envs` give them
    assert PRESETS["textcraft"].split_difficulty(STRATIFIED) == hist
    old = PRESETS["textcraft"].split_difficulty(CONTIGUOUS)
    assert old["test"] == {1: 100} and _off_proportion(old) > 50


def test_textcraft_depth_profile_is_the_real_servers_crafting_tree():
    """The profile recorded in the preset is what AgentGym's TextCraft server sorts its goals by: the crafting
    min-depth of each goal, in the server's order (computed by the installed package, in a process of its own:
    it reads its recipes from the relative folder agentenv_textcraft/recipes)."""
    why = server_missing_reason()
    if why or importlib.util.find_spec("agentenv_textcraft") is None:
        pytest.skip(why or "agentenv_textcraft is not installed (make setup installs it)")
    script = ("import json; from agentenv_textcraft.crafting_tree import CraftingTree; "
              "tree = CraftingTree(minecraft_dir='agentenv_textcraft/'); "
              "goals = sorted(tree.item_recipes_min_depth(1), key=lambda x: x[1]); "
              "print(json.dumps([depth for _, depth in goals]))")
    out = subprocess.run([sys.executable, "-c", script], cwd=textcraft_source(), capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == list(expand_profile(TEXTCRAFT_DEPTHS))


# ---- tasks, and the checks before a reset -------------------------------------------------------------------


def test_textcraft_tasks_are_a_seeded_sample_of_their_split():
    env = make_env(TC, url=DEAD_URL)
    train = env.tasks("train")
    idx = [t.meta["data_idx"] for t in train]
    assert sorted(idx) == sorted(PRESETS["textcraft"].task_indices("train", None, STRATIFIED))
    assert idx != sorted(idx) and env.split_size("train") == 344  # a seeded order, not the server's
    assert all(t.task_id == f"{TC}/train/{t.meta['data_idx']}" for t in train)
    depth = expand_profile(TEXTCRAFT_DEPTHS)
    assert all(t.meta == {"data_idx": t.meta["data_idx"], "split_scheme": STRATIFIED,
                          "difficulty": depth[t.meta["data_idx"]]} for t in train)
    assert {t.meta["difficulty"] for t in train} == {1, 2, 3, 4}  # each task says its crafting depth
    assert env.tasks("train", n=5) == train[:5]  # the first n tasks are the same whatever n is
    with pytest.raises(ValueError, match=rf"split 'train' has 344 tasks \({STRATIFIED}\); asked for 345"):
        env.tasks("train", n=345)
    with pytest.raises(ValueError, match="unknown split 'dev' for agentgym/textcraft; valid: test, val, train"):
        env.tasks("dev")


def test_the_old_contiguous_split_can_be_asked_for():
    """`split_scheme="contiguous"` (an env kwarg, e.g. a collect config's env_kwargs) plays the old ranges:
    AgentGym's published evaluation sets are the low indices."""
    env = make_env(TC, url=DEAD_URL, split_scheme=CONTIGUOUS)
    assert [t.meta["data_idx"] for t in env.tasks("test")] == list(range(100))
    assert [t.meta for t in env.tasks("train", n=2)] == [{"data_idx": 200, "split_scheme": CONTIGUOUS, "difficulty": 2},
                                                        {"data_idx": 201, "split_scheme": CONTIGUOUS, "difficulty": 2}]
    assert env.split_size("train") == 344 and env.split_scheme == CONTIGUOUS
    with pytest.raises(ValueError, match=r"split 'train' has 344 tasks \(contiguous\); asked for 345"):
        env.tasks("train", n=345)
    with pytest.raises(ValueError, match="unknown split scheme 'random' for agentgym/textcraft; valid: "
                                         "stratified-v1, contiguous"):
        make_env(TC, url=DEAD_URL, split_scheme="random")


def test_servers_without_a_size_keep_their_contiguous_seeds():
    env = make_env("agentgym/babyai", url=DEAD_URL)
    assert [t.meta for t in env.tasks("train", n=2)] == [{"data_idx": 200}, {"data_idx": 201}]
    assert env.split_size("train") is None and env.split_scheme == CONTIGUOUS
    with pytest.raises(ValueError, match="agentgym/babyai has no known data size, so split scheme 'stratified-v1' "
                                         "cannot deal it; valid: contiguous"):
        make_env("agentgym/babyai", url=DEAD_URL, split_scheme=STRATIFIED)
    with pytest.raises(ValueError, match="lists its tasks itself"):
        make_env("agentgym/trajlake", url=DEAD_URL, split_scheme=CONTIGUOUS)


@pytest.mark.parametrize("task", [
    _task("train", 250),  # an old lake's task: no scheme, checked against the contiguous ranges
    _task("test", 3, CONTIGUOUS),
    _task("train", PRESETS["textcraft"].task_indices("train", 1, STRATIFIED)[0], STRATIFIED),
])
def test_a_task_inside_its_split_goes_to_the_server(task):
    """Past the checks, the dead server is asked: a connection error, not a refusal."""
    env = make_env(TC, url=DEAD_URL, retries=0)
    with pytest.raises(EnvServerError, match="cannot connect"):
        env.reset(task)


_STRAT_TEST = set(PRESETS["textcraft"].task_indices("test", None, STRATIFIED))
_NOT_TEST = min(set(range(544)) - _STRAT_TEST)


@pytest.mark.parametrize(("task", "message"), [
    (_task("train", 544, STRATIFIED), r"has 544 tasks \(data indices 0..543\); data index 544 is past its end"),
    (_task("train", 544), r"has 544 tasks \(data indices 0..543\); data index 544 is past its end"),
    (_task("test", 150), r"split 'test' \(contiguous\) is data indices 0..99; data index 150 is outside it"),
    (_task("train", 3), r"split 'train' \(contiguous\) is data indices 200..543; data index 3 is outside it"),
    (_task("test", _NOT_TEST, STRATIFIED),
     rf"split 'test' \(stratified-v1\) does not hold data index {_NOT_TEST}; that scheme puts it in '(val|train)'"),
    (_task("test", 0, "stratified-v9"), r"unknown split scheme 'stratified-v9' for agentgym/textcraft; valid: "),
])
def test_an_index_outside_its_split_is_refused_before_the_server_is_asked(task, message):
    env = make_env(TC, url=DEAD_URL)
    with pytest.raises(ValueError, match=message) as e:
        env.reset(task)
    assert "\n" not in str(e.value)


def test_a_preset_whose_splits_overlap_run_past_or_leave_out_its_data_is_refused():
    with pytest.raises(ValueError, match="splits test and train overlap"):
        _preset(splits={"test": (0, 100), "train": (50, None)})
    with pytest.raises(ValueError, match="split train ends past the server's 300 tasks"):
        _preset(size=300, splits={"test": (0, 100), "train": (100, None)})
    with pytest.raises(ValueError, match="the splits leave some of the server's 300 tasks out"):
        _preset(size=300, splits={"test": (0, 100), "train": (100, 299)})
    with pytest.raises(ValueError, match="difficulty_profile counts 299 tasks"):
        _preset(size=300, difficulty_profile=((1, 100), (2, 199)))
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


def test_envs_shows_each_splits_size_scheme_and_textcraft_depths(capsys):
    from trajlake.cli import main

    assert main(["envs", "--env", TC]) == 0
    out = capsys.readouterr().out
    assert "stratified-v1" in out and "1: 23, 2: 54, 3: 21, 4: 2" in out and "1: 79, 2: 184, 3: 74, 4: 7" in out
    assert main(["envs"]) == 0
    assert "stratified-v1: test 100, val 100, train 344" in capsys.readouterr().out


# ---- AgentGym's real TextCraft server ----------------------------------------------------------------------


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
    env = make_env(TC, url=textcraft_url)
    with pytest.raises(ValueError, match="data index 544 is past its end"):
        env.reset(Task("t", TC, split="train", meta={"data_idx": 544}))


def test_the_real_server_plays_an_old_lakes_task_and_a_stratified_one(textcraft_url):
    env = make_env(TC, url=textcraft_url)
    old = env.reset(_task("train", 250))  # no scheme: the contiguous train split, which holds 250
    assert "Goal: craft " in old
    first = env.tasks("test", n=1)[0]
    assert f"Goal: craft {_goal(textcraft_url, first.meta['data_idx'])}." in env.reset(first)
    env.close()
