"""Is a held-out number held out? Per evaluation, the tasks that share a goal with any episode in the evaluated
policy's lineage (the store's `eval_contamination` view, schemas/lineage_views.py), and the success on the rest.

Every evaluation summary carries these columns (evaluate, the report, the viewer's run page); a number whose
tasks are not all clean is labelled so wherever it is printed. A user runs the same query:
`trajlake sql --file docs/queries/contamination.sql`.
"""

from __future__ import annotations

import polars as pl

from trajlake.evaluate.metrics import wilson_interval
from trajlake.store import Lake
from trajlake.store.reads import eval_contamination

#: the columns `with_contamination` adds to a summary's overall rows, with their types
COLUMN_TYPES = {"contaminated_tasks": pl.Int64, "clean_tasks": pl.Int64, "clean_episodes": pl.Int64,
                "clean_success_rate": pl.Float64, "clean_success_low": pl.Float64, "clean_success_high": pl.Float64}
COLUMNS = tuple(COLUMN_TYPES)


def outside_goals_of(splits: tuple[str, ...] = ("test", "val")) -> str:
    """A filter over episodes (SQL): those whose goal no stored episode of a task of `splits` has (the store's
    `episode_goals`). Training data restricted by it (e.g. imported expert trajectories, whose goals are text
    and not the server's indices) shares no goal with the held-out tasks played so far: play them first."""
    listed = ", ".join(f"'{s}'" for s in splits if s.isidentifier())
    return ("episode_id NOT IN (SELECT g.episode_id FROM episode_goals g JOIN episode_goals h USING (family, goal) "
            f"JOIN tasks t ON t.task_id = h.task_id WHERE t.split IN ({listed}))")


def contamination(lake: Lake, eval_runs: list[str]) -> pl.DataFrame:
    """One row per eval run of `eval_runs` (and env, split): its tasks, how many share a goal with the policy's
    training episodes, and the success on the clean ones (store.reads.eval_contamination's columns)."""
    return eval_contamination(lake, eval_runs)


def with_contamination(lake: Lake, summary: pl.DataFrame, runs: dict[str, str], confidence: float = 0.95,
                       overall: str = "all") -> pl.DataFrame:
    """`summary` (one row per policy, env and difficulty) with COLUMNS filled on its rows of difficulty
    `overall`, for the policies of `runs` (policy spec -> eval run id): the clean success with its Wilson
    interval at `confidence`. Rows of one difficulty keep them empty (the count is over the whole evaluation)."""
    found = contamination(lake, list(runs.values()))
    by_run = {r["eval_run"]: r for r in found.iter_rows(named=True)}
    rows = []
    for row in summary.iter_rows(named=True):
        c = by_run.get(runs.get(row["policy"], ""))
        extra = dict.fromkeys(COLUMNS)
        if c is not None and row.get("difficulty") == overall:
            extra.update(contaminated_tasks=c["contaminated_tasks"], clean_tasks=c["clean_tasks"],
                         clean_episodes=c["clean_episodes"], clean_success_rate=c["clean_success_rate"])
            if c["clean_episodes"]:
                lo, hi = wilson_interval(c["clean_successes"], c["clean_episodes"], confidence)
                extra.update(clean_success_low=lo, clean_success_high=hi)
        rows.append({**row, **extra})
    return pl.DataFrame(rows, schema={**summary.schema, **COLUMN_TYPES})


def contamination_notes(summary: pl.DataFrame) -> list[str]:
    """One line per evaluated policy whose tasks are not all clean: how many were trained on, and the success on
    the clean rest (or that there is none)."""
    notes = []
    if "contaminated_tasks" not in summary.columns:
        return notes
    for row in summary.iter_rows(named=True):
        k = row.get("contaminated_tasks")
        if not k:
            continue
        clean = (f"success on the {row['clean_tasks']} clean tasks: {row['clean_success_rate']:.2f} "
                 f"[{row['clean_success_low']:.2f}, {row['clean_success_high']:.2f}]" if row["clean_episodes"]
                 else "no task is clean")
        notes.append(f"{row['policy']}: {k} of {row['tasks']} {row['env']} tasks share a goal with episodes its "
                     f"lineage trained on, so its success {row['success_rate']:.2f} is not held out; {clean}")
    return notes


__all__ = ["COLUMNS", "contamination", "contamination_notes", "outside_goals_of",
           "with_contamination"]
