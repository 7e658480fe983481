"""Which tasks an RL iteration plays: `rotation` through the split, or a query over the lake's own history.

RL learns only from groups whose samples' outcomes differ. On TextCraft the SFT policy won 43% of the easy test
goals and none of the goals GRPO played: there was nothing to reinforce. Since every rollout is in the store,
the tasks a policy lineage sometimes wins are one query away; `learnable` (train/queries/learnable.sql) is that
query, and a user's own .sql file (a depth curriculum, a replay of hard tasks) is the same kind of thing.

A query selector reads two tables made here, `candidates(task_id, position, difficulty)` (the first
`task_pool` tasks of the split) and `params(run_id, iteration, tasks, samples, start_policy)`, plus any of the
lake's tables and views, and returns task ids in priority order. It runs as a checked read (one SELECT, only
the lake's tables and views and those two, no catalog or table functions: store/sql_guard.py). The positions
it chose go into the iteration's collect config (`task_positions`), so the collect run records what it played
and a restart of the iteration plays the same tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from trajlake.core.errors import TrajlakeError
from trajlake.core.registry import Registry
from trajlake.core.text_files import read_text_file

#: the queries trajlake ships (train/queries/NAME.sql)
QUERIES_DIR = Path(__file__).parent / "queries"
#: the largest query file read: a selector is one SELECT, not a data file
MAX_QUERY_BYTES = 64 * 1024
#: the tables a selector query gets besides the lake's own
SELECTOR_TABLES = ("candidates", "params")


@dataclass(frozen=True)
class TaskSelector:
    """A named selector: `query` is the path of its .sql file, or None for the rotation through the split."""

    query: Path | None
    description: str


TASK_SELECTORS: Registry[TaskSelector] = Registry("task selector")
TASK_SELECTORS.add("rotation", TaskSelector(None, "the next block of `tasks` tasks of the split each iteration"))
TASK_SELECTORS.add("learnable", TaskSelector(QUERIES_DIR / "learnable.sql",
                                             "tasks this run's policies sometimes win first, then unplayed ones"))
TASK_SELECTORS.add("curriculum", TaskSelector(QUERIES_DIR / "curriculum.sql",
                                              "the lowest difficulty not yet mastered (80% won) first, then harder "
                                              "ones; learnable's order within a level"))
TASK_SELECTORS.add("frontier", TaskSelector(QUERIES_DIR / "frontier.sql",
                                            "curriculum's levels; within a level the least played of the tasks "
                                            "not always or never won first, so each is played before any is "
                                            "replayed"))


def is_query(name: str) -> bool:
    """Whether task_selector `name` chooses by a query (a registered one with a .sql file, or a user's file);
    False for the rotation through the split."""
    return name not in TASK_SELECTORS or TASK_SELECTORS[name].query is not None


class TaskSelectorError(TrajlakeError):
    """A task selector cannot be used; the message names it and the problem."""


def selector_query(name: str) -> str | None:
    """The SQL of task_selector `name` (a registered name or the path of a .sql file), checked as a read over the
    lake and the selector's tables; None for rotation. TaskSelectorError (one line) when it cannot be used."""
    if name in TASK_SELECTORS:
        path = TASK_SELECTORS[name].query
        if path is None:
            return None
    elif name.endswith(".sql"):
        path = Path(name)
    else:
        raise TaskSelectorError(f"unknown task_selector {name!r}; valid: {', '.join(TASK_SELECTORS.names())}, "
                                "or the path of a .sql file")
    sql = read_text_file(path, "task_selector query file", MAX_QUERY_BYTES, error=TaskSelectorError)
    check_selector_sql(sql, name)
    return sql


def check_selector_sql(sql: str, name: str) -> None:
    """Refuse SQL that is not one SELECT reading only the lake's tables and views and the selector's tables."""
    from trajlake.schemas.tables import TABLES
    from trajlake.schemas.views import VIEWS
    from trajlake.store.attach import check_read_only
    from trajlake.store.sql_guard import check_expression

    body = sql.strip().rstrip(";").strip()
    what = f"task_selector {name}"
    try:
        check_read_only(body)
        check_expression(f"(SELECT count(*) FROM (\n{body}\n))", what, [*TABLES, *VIEWS, *SELECTOR_TABLES])
    except TrajlakeError as e:
        raise TaskSelectorError(f"{what}: {e}") from None


def candidate_table(tasks: list) -> pa.Table:
    """`candidates`: each task's id, its position in the split's task list, and its difficulty when it has one."""
    def difficulty(task) -> int | None:
        meta = task.meta if isinstance(task.meta, dict) else {}
        value = meta.get("difficulty", meta.get("depth"))
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return pa.table({"task_id": pa.array([t.task_id for t in tasks], pa.string()),
                     "position": pa.array(range(len(tasks)), pa.int64()),
                     "difficulty": pa.array([difficulty(t) for t in tasks], pa.int64())})


def select_positions(lake, sql: str, name: str, tasks: list, *, run_id: str, iteration: int, n: int, samples: int,
                     start_policy: str | None, exclude: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """The positions (in `tasks`, the candidate pool) of the first `n` task ids the selector query returns,
    passing over the positions in `exclude` (those this iteration played already). TaskSelectorError when it
    returns fewer than `n` such candidates, or ids that are not candidates."""
    params = pa.table({"run_id": [run_id], "iteration": pa.array([iteration], pa.int64()),
                       "tasks": pa.array([n], pa.int64()), "samples": pa.array([samples], pa.int64()),
                       "start_policy": pa.array([start_policy], pa.string())})
    try:
        out = lake.query(sql.strip().rstrip(";"), tables={"candidates": candidate_table(tasks), "params": params})
    except TrajlakeError as e:
        raise TaskSelectorError(f"task_selector {name}: {e}") from None
    if "task_id" not in out.columns:
        raise TaskSelectorError(f"task_selector {name}: the query must return a task_id column, got "
                                f"{', '.join(out.columns) or 'no columns'}")
    position = {t.task_id: i for i, t in enumerate(tasks)}
    chosen: list[int] = []
    for task_id in out["task_id"].to_list():
        if task_id not in position:
            raise TaskSelectorError(f"task_selector {name}: it returned {str(task_id)[:80]!r}, which is not one of "
                                    "the candidates (the split's tasks it may choose from)")
        if position[task_id] not in chosen and position[task_id] not in exclude:
            chosen.append(position[task_id])
        if len(chosen) == n:
            return tuple(chosen)
    played = f" besides the {len(exclude)} this iteration played already" if exclude else ""
    raise TaskSelectorError(f"task_selector {name}: it returned {len(chosen)} distinct candidates{played}; "
                            f"iteration {iteration} plays {n} tasks")


__all__ = ["TASK_SELECTORS", "TaskSelector", "TaskSelectorError", "candidate_table", "check_selector_sql", "is_query",
           "select_positions", "selector_query"]
