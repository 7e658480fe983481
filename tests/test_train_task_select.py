"""Train where the policy can learn: a task selector is a read-only query over the lake's own history; `learnable`
plays first the tasks this run's policies sometimes win; what an iteration chose is recorded with its collect run."""

from __future__ import annotations

import pytest

from trajlake.collect.envs import make_env
from trajlake.schemas.records import Episode
from trajlake.train.task_select import TaskSelectorError, select_positions, selector_query

RUN = "sel"


def _episodes(lake, outcomes: dict[str, list[bool]], run_id: str = f"{RUN}/it-1") -> None:
    rows = [Episode(f"{run_id}/{task}/{k}", run_id=run_id, policy_id=f"{RUN}/step-0", task_id=task, env="doors",
                    group_id=f"{run_id}/{task}", sample_index=k, status="done", success=won, num_turns=1)
            for task, wins in outcomes.items() for k, won in enumerate(wins)]
    lake.append({"episodes": rows}, stage="collect", message="test episodes")


def test_learnable_orders_sometimes_won_then_unplayed_then_solved_then_never_won(lake):
    tasks = make_env("doors").tasks("train", n=6, difficulty=1)
    ids = [t.task_id for t in tasks]
    _episodes(lake, {ids[0]: [False, False], ids[1]: [True, False], ids[2]: [True, True], ids[3]: [False, True]})
    _episodes(lake, {ids[4]: [True, False]}, run_id="another/it-1")  # another run's history is not this run's
    sql = selector_query("learnable")
    got = select_positions(lake, sql, "learnable", tasks, run_id=RUN, iteration=2, n=6, samples=2, start_policy=None)
    assert set(got[:2]) == {1, 3}  # won and lost: an outcome difference to learn from
    assert set(got[2:4]) == {4, 5}  # never played by this run
    assert got[4:] == (2, 0)  # always won, then never won
    # the first n only, and the same order for the same iteration
    assert select_positions(lake, sql, "learnable", tasks, run_id=RUN, iteration=2, n=3, samples=2,
                            start_policy=None) == got[:3]


def test_curriculum_plays_the_lowest_difficulty_not_mastered_first(lake):
    env = make_env("doors")
    tasks = [t for d in (1, 2, 3) for t in env.tasks("train", n=3, difficulty=d)]
    ids = [t.task_id for t in tasks]
    sql = selector_query("curriculum")

    def first(n: int, iteration: int = 2) -> tuple[int, ...]:
        return select_positions(lake, sql, "curriculum", tasks, run_id=RUN, iteration=iteration, n=n, samples=2,
                                start_policy=None)

    assert set(first(3)) == {0, 1, 2}  # nothing played: the easiest level first
    _episodes(lake, {ids[0]: [True, True], ids[1]: [True, False], ids[2]: [False, False]})
    got = first(9)
    assert got[:3] == (1, 0, 2)  # level 1 won 50%: still the current level, in learnable's order
    assert set(got[3:6]) == {3, 4, 5} and set(got[6:]) == {6, 7, 8}  # then the harder levels in order
    _episodes(lake, {ids[1]: [True] * 4, ids[2]: [True] * 6}, run_id=f"{RUN}/it-2")
    got = first(9, iteration=3)  # level 1 now won 1, 5/6 and 6/8 of its tasks' samples (86%): level 2 first
    assert set(got[:3]) == {3, 4, 5} and set(got[3:6]) == {6, 7, 8} and set(got[6:]) == {0, 1, 2}


def test_frontier_plays_every_uncertain_task_of_a_level_before_replaying_one(lake):
    env = make_env("doors")
    tasks = [t for d in (1, 2) for t in env.tasks("train", n=4, difficulty=d)]
    ids = [t.task_id for t in tasks]
    sql = selector_query("frontier")

    def first(n: int, iteration: int) -> tuple[int, ...]:
        return select_positions(lake, sql, "frontier", tasks, run_id=RUN, iteration=iteration, n=n, samples=2,
                                start_policy=None)

    _episodes(lake, {ids[0]: [True, False], ids[1]: [False, True]})
    # curriculum replays the two tasks won and lost; frontier plays the two level-1 tasks never played first
    assert set(select_positions(lake, selector_query("curriculum"), "curriculum", tasks, run_id=RUN, iteration=2,
                                n=2, samples=2, start_policy=None)) == {0, 1}
    assert set(first(2, iteration=2)) == {2, 3}
    _episodes(lake, {ids[2]: [True, True], ids[3]: [False, False]}, run_id=f"{RUN}/it-2")
    got = first(8, iteration=3)  # level 1 won 4 of 8: still current; uncertain, then always won, then never won
    assert set(got[:2]) == {0, 1} and got[2:4] == (2, 3) and set(got[4:]) == {4, 5, 6, 7}
    _episodes(lake, {ids[0]: [True, True, False], ids[2]: [True] * 4}, run_id=f"{RUN}/it-3")
    assert first(1, iteration=4) == (1,)  # of the uncertain ones, the least played


def test_the_starting_policys_episodes_count_as_history(lake):
    tasks = make_env("doors").tasks("train", n=3, difficulty=1)
    _episodes(lake, {tasks[2].task_id: [True, False]}, run_id="probe")
    got = select_positions(lake, selector_query("learnable"), "learnable", tasks, run_id="fresh", iteration=1, n=1,
                           samples=2, start_policy=f"{RUN}/step-0")
    assert got == (2,)


def test_a_users_query_file(lake, tmp_path):
    tasks = make_env("doors").tasks("train", n=5, difficulty=1)
    hardest = tmp_path / "reverse.sql"
    hardest.write_text("-- the last candidates first\nSELECT task_id FROM candidates ORDER BY position DESC;\n")
    assert select_positions(lake, selector_query(str(hardest)), str(hardest), tasks, run_id=RUN, iteration=1, n=2,
                            samples=2, start_policy=None) == (4, 3)


@pytest.mark.parametrize(("sql", "message"), [
    ("DELETE FROM episodes", r"DELETE statements are refused"),
    ("SELECT task_id FROM candidates; DROP TABLE episodes", r"one statement at a time"),
    ("SELECT table_name AS task_id FROM duckdb_tables()", r"may not call table function"),
    ("SELECT task_id FROM information_schema.tables", r"may read the lake's tables only"),
    ("SELECT task_id FROM read_csv('/etc/passwd')", r"may not call table function"),
])
def test_a_query_that_could_write_or_read_outside_the_lake_is_refused(tmp_path, sql, message):
    path = tmp_path / "bad.sql"
    path.write_text(sql)
    with pytest.raises(TaskSelectorError, match=message):
        selector_query(str(path))


def test_selector_names_and_files_are_checked(tmp_path, lake):
    with pytest.raises(TaskSelectorError,
                       match=r"unknown task_selector 'best'; valid: curriculum, frontier, learnable, rotation"):
        selector_query("best")
    with pytest.raises(TaskSelectorError, match=r"no such file"):
        selector_query(str(tmp_path / "missing.sql"))
    big = tmp_path / "big.sql"
    big.write_text("SELECT task_id FROM candidates -- " + "x" * 70_000)
    with pytest.raises(TaskSelectorError, match=r"larger than 64 KiB"):
        selector_query(str(big))
    assert selector_query("rotation") is None
    tasks = make_env("doors").tasks("train", n=3, difficulty=1)
    few = tmp_path / "few.sql"
    few.write_text("SELECT task_id FROM candidates LIMIT 1")
    with pytest.raises(TaskSelectorError, match=r"returned 1 distinct candidates; iteration 1 plays 2 tasks"):
        select_positions(lake, selector_query(str(few)), "few", tasks, run_id=RUN, iteration=1, n=2, samples=2,
                         start_policy=None)
    stranger = tmp_path / "stranger.sql"
    stranger.write_text("SELECT 'doors/test/1/0' AS task_id")
    with pytest.raises(TaskSelectorError, match=r"not one of the candidates"):
        select_positions(lake, selector_query(str(stranger)), "stranger", tasks, run_id=RUN, iteration=1, n=1,
                         samples=2, start_policy=None)
    nocol = tmp_path / "nocol.sql"
    nocol.write_text("SELECT position FROM candidates")
    with pytest.raises(TaskSelectorError, match=r"must return a task_id column"):
        select_positions(lake, selector_query(str(nocol)), "nocol", tasks, run_id=RUN, iteration=1, n=1, samples=2,
                         start_policy=None)


def test_a_train_run_records_what_its_selector_chose(tiny, lake):
    """Each iteration's collect run holds the positions its query chose; its episodes are of those tasks."""
    from tests.helpers import small_cfg
    from trajlake.store import runs
    from trajlake.train.loop import train

    cfg = small_cfg(tiny, run_id="ts", task_selector="learnable", task_pool=6, tasks=2, samples=2, iterations=2,
                    minibatch_size=4, micro_batch=2)
    train(cfg, lake)
    listed = [t.task_id for t in make_env("doors").tasks("train", n=6, difficulty=1)]
    for it in (1, 2):
        positions = runs.stored(lake, f"ts/it-{it}").config["task_positions"]
        played = lake.query("SELECT DISTINCT task_id FROM episodes WHERE run_id = ?", [f"ts/it-{it}"])["task_id"]
        assert len(positions) == 2 and sorted(played.to_list()) == sorted(listed[p] for p in positions)
