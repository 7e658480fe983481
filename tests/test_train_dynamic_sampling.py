"""DAPO's dynamic sampling: an iteration whose groups hold too few outcome differences plays further rounds of other
tasks, at most sampling_rounds, and its update learns from every round's groups; what it played is in the store."""

from __future__ import annotations

import json

import pytest

from tests.helpers import small_cfg, tiny_model_dir
from trajlake.collect.envs import make_env
from trajlake.store import runs
from trajlake.train.config import ConfigError
from trajlake.train.sources.fresh import outcome_group_count, round_run_id
from trajlake.train.task_select import TaskSelectorError, select_positions, selector_query


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def _rounds(lake, run_id: str, it: int) -> list[str]:
    """The collect runs of iteration `it` (from 1) that the store holds, round by round."""
    ids = [round_run_id(run_id, it - 1, k) for k in range(8)]
    return [x for x in ids if runs.stored(lake, x) is not None]


def _differing_groups(lake, run_ids: list[str]) -> int:
    return lake.query("SELECT count(*) FROM (SELECT group_id FROM episodes WHERE list_contains(?, run_id) "
                      "AND status IS DISTINCT FROM 'error' GROUP BY group_id "
                      "HAVING bool_or(success) AND NOT bool_and(success))", [run_ids]).item()


def _check_rounds_stop_where_they_should(lake, run_id: str, it: int, need: int, most: int) -> list[str]:
    """The iteration played rounds until the groups so far held `need` outcome differences, or `most` rounds."""
    played = _rounds(lake, run_id, it)
    for k in range(1, len(played)):  # every round but the last was played because too few groups differed
        assert _differing_groups(lake, played[:k]) < need
    assert len(played) == most or _differing_groups(lake, played) >= need
    return played


@pytest.mark.parametrize("selector", ["rotation", "learnable"])
def test_rounds_play_other_tasks_until_enough_groups_differ(model, lake, selector):
    # the untrained tiny model rarely wins a doors task: min_outcome_groups 4 of 2-task rounds needs every round
    cfg = small_cfg(model, run_id=f"dyn-{selector}", tasks=2, samples=2, iterations=2, min_outcome_groups=4,
                    sampling_rounds=3, task_selector=selector, task_pool=12, temperature=2.0)
    from trajlake.train.loop import train

    train(cfg, lake)
    steps = lake.query("SELECT metrics, episode_ids FROM train_steps WHERE run_id = ? AND step > 0 "
                       "ORDER BY step", [cfg.run.id])
    assert steps.height == 2
    for it, (metrics, episode_ids) in enumerate(steps.iter_rows(), start=1):
        played = _check_rounds_stop_where_they_should(lake, cfg.run.id, it, need=4, most=3)
        assert json.loads(metrics)["sampling_rounds"] == len(played)
        tasks = lake.query("SELECT run_id, task_id FROM episodes WHERE list_contains(?, run_id)", [played])
        per_round = {r: set(tasks.filter(tasks["run_id"] == r)["task_id"]) for r in played}
        assert all(len(t) == 2 for t in per_round.values())
        assert len(set().union(*per_round.values())) == 2 * len(played), "each round plays other tasks"
        stored = set(lake.query("SELECT episode_id FROM episodes WHERE list_contains(?, run_id)",
                                [played])["episode_id"])
        assert set(episode_ids) == stored, "the update's lineage holds every round's episodes"


def test_a_resumed_run_keeps_its_iterations_rounds(model, lake):

    from trajlake.train.loop import train

    cfg = small_cfg(model, run_id="dyn-resume", tasks=2, samples=2, iterations=1, min_outcome_groups=4,
                    sampling_rounds=2, task_selector="learnable", task_pool=8, temperature=2.0)
    train(cfg, lake)
    played = _rounds(lake, cfg.run.id, 1)

    def episodes_of_iteration_1() -> int:
        return lake.query("SELECT count(*) FROM episodes WHERE list_contains(?, run_id)", [played]).item()

    n = episodes_of_iteration_1()
    train(cfg.replace(iterations=2), lake)  # continues with iteration 2
    assert _rounds(lake, cfg.run.id, 1) == played and episodes_of_iteration_1() == n
    _check_rounds_stop_where_they_should(lake, cfg.run.id, 2, need=4, most=2)


def test_the_count_is_the_updates_own(model):
    from tests.helpers import synthetic

    seqs = synthetic(8, group_size=2, scores=[1, 0, 0, 0, 1, 1, 0, 1])
    assert outcome_group_count(seqs) == 2 and outcome_group_count([]) == 0


def test_a_selector_passes_over_the_tasks_the_iteration_played(lake):
    tasks = make_env("doors").tasks("train", n=5, difficulty=1)
    sql = selector_query("learnable")

    def pick(n, exclude=frozenset()):
        return select_positions(lake, sql, "learnable", tasks, run_id="x", iteration=1, n=n, samples=2,
                                start_policy=None, exclude=exclude)

    first = pick(2)
    second = pick(2, frozenset(first))
    assert not set(first) & set(second) and len(set(second)) == 2
    with pytest.raises(TaskSelectorError, match=r"returned 1 distinct candidates besides the 4 this iteration "
                                                 r"played already; iteration 1 plays 2 tasks"):
        pick(2, frozenset(first + second))


@pytest.mark.parametrize(("kw", "message"), [
    (dict(sampling_rounds=2), r"sampling_rounds 2 plays further rounds only to reach min_outcome_groups"),
    (dict(sampling_rounds=0), r"sampling_rounds must be >= 1, got 0"),
    (dict(min_outcome_groups=-1), r"min_outcome_groups must be >= 0, got -1"),
    (dict(min_outcome_groups=5, sampling_rounds=2, tasks=2),
     r"min_outcome_groups 5 exceeds the groups 2 rounds of 2 tasks can hold"),
    (dict(min_outcome_groups=1, samples=1, advantage="reinforce++", group_filter="all"),
     r"samples must be >= 2, got 1"),
    (dict(min_outcome_groups=1, train_filter="success", old_logprobs="behaviour"),
     r"a train_filter run trains on stored ones"),
])
def test_dynamic_sampling_settings_are_checked(model, kw, message):
    with pytest.raises(ConfigError, match=message):
        small_cfg(model, **kw)
