"""Evaluation statistics as pure functions: pass@k, confidence intervals, and the per-group summary table.

Conventions: `confidence` is a two-sided level (0.95); an interval is (low, high). A group with no episodes
never reaches these functions (the summary only has groups that exist).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import polars as pl


def z_value(confidence: float) -> float:
    """The standard normal quantile of a two-sided `confidence` level (1.96 for 0.95)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: sensible at 0 and n successes, unlike the normal one."""
    if n <= 0:
        raise ValueError("wilson_interval needs n >= 1")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}")
    z = z_value(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, not 1e-17 rounding residue
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def mean_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean with a normal-approximation interval (sample std / sqrt(n)); a single
    value has a zero-width interval."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = z_value(confidence) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with `n` samples of which `c` succeeded (Chen et al., 2021):
    1 - C(n - c, k) / C(n, k), the chance that k samples drawn without replacement contain a success."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples, got n = {n}")
    if not 0 <= c <= n:
        raise ValueError(f"successes must be in [0, n], got {c} of {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(episodes: pl.DataFrame, by: list[str], ks: list[int], confidence: float = 0.95) -> pl.DataFrame:
    """One row per group of `by`: episodes, tasks, success rate (Wilson interval), pass@k for each k that
    every task of the group has samples for (mean over tasks, normal interval over tasks), mean reward
    (interval), mean turns, format-error rate and agent tokens per episode.

    `episodes`: one row per episode with columns `by` + task_id, success (bool), reward (float or null),
    num_turns, format_errors (turns with a malformed reply), turns_played, agent_tokens. With a `status` column,
    episodes of status `error` (an env error, not the policy's doing) are left out: they would count as failures
    in the success rate and as samples in pass@k.
    """
    if "status" in episodes.columns:
        episodes = episodes.filter(~pl.col("status").eq_missing("error"))
    rows = []
    for key, g in episodes.group_by(by, maintain_order=True):
        n, s = g.height, int(g["success"].fill_null(False).sum())
        lo, hi = wilson_interval(s, n, confidence)
        row = dict(zip(by, key, strict=True))
        row.update(episodes=n, tasks=g["task_id"].n_unique(), success_rate=s / n, success_low=lo, success_high=hi)
        per_task = g.group_by("task_id").agg(pl.len().alias("n"), pl.col("success").fill_null(False).sum().alias("c"))
        min_n = int(per_task["n"].min())
        for k in ks:
            if k > min_n:
                continue
            vals = [pass_at_k(int(t["n"]), int(t["c"]), k) for t in per_task.iter_rows(named=True)]
            m, lo, hi = mean_interval(vals, confidence)
            row.update({f"pass@{k}": m, f"pass@{k}_low": lo, f"pass@{k}_high": hi})
        rewards = g["reward"].drop_nulls().to_list()
        if rewards:
            m, lo, hi = mean_interval([float(r) for r in rewards], confidence)
            row.update(reward_mean=m, reward_low=lo, reward_high=hi)
        played = int(g["turns_played"].sum())
        row.update(mean_turns=float(g["num_turns"].mean()),
                   format_error_rate=int(g["format_errors"].sum()) / played if played else 0.0,
                   tokens_per_episode=float(g["agent_tokens"].mean()))
        rows.append(row)
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def held_out_label(contaminated: int, tasks: int) -> str:
    """How a held-out number reads: `clean` when none of its `tasks` was trained on, else how many were."""
    return "clean" if contaminated == 0 else f"NOT CLEAN: {contaminated} of {tasks} tasks trained on"


def format_summary(summary: pl.DataFrame, digits: int = 2) -> pl.DataFrame:
    """The summary for a terminal: each estimate with its interval in one cell ("0.82 [0.74, 0.88]")."""
    if summary.height == 0:
        return summary

    def cell(row: dict, name: str) -> str | None:
        v = row.get(name)
        if v is None:
            return None
        lo, hi = row.get(f"{name}_low"), row.get(f"{name}_high")
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None else f"{v:.{digits}f}"

    passes = [c for c in summary.columns if c.startswith("pass@") and not c.endswith(("_low", "_high"))]
    out = []
    for row in summary.iter_rows(named=True):
        r = {k: row[k] for k in ("policy", "env", "difficulty", "episodes", "tasks") if k in row}
        r["success"] = cell({**row, "success": row["success_rate"]}, "success")
        for c in passes:
            r[c] = cell(row, c)
        r["reward"] = cell({**row, "reward": row.get("reward_mean")}, "reward")
        r["turns"] = round(row["mean_turns"], digits)
        r["format_errors"] = round(row["format_error_rate"], digits)
        r["tokens"] = round(row["tokens_per_episode"], 1)
        if "contaminated_tasks" in row:  # a held-out number says whether it is one (evaluate/contamination.py)
            k = row["contaminated_tasks"]
            r["held_out"] = None if k is None else held_out_label(k, row["tasks"])
            r["clean_success"] = cell({**row, "clean_success": row["clean_success_rate"]}, "clean_success")
        out.append(r)
    return pl.DataFrame(out)


__all__ = ["z_value", "wilson_interval", "mean_interval", "pass_at_k", "summarize", "format_summary", "held_out_label"]
