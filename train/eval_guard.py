"""What a train run's held-out evaluations decide: where it stops, and which of its checkpoints is its best.

RL on a real world can make a good policy worse (SmolLM2 on TextCraft: 0.40 after SFT, 0.10 after GRPO). A run
that evaluates as it goes (`eval_every`) stops once an evaluation falls below the 95% Wilson lower bound of
its first one (the starting policy's), and the policy a recipe keeps is the checkpoint that did best on the
eval split, not the last one: as SFT's plateau is chosen on val, so is RL's.

Everything here reads the run's `train_steps` rows (the step-0 row holds the start's evaluation), so a run
restarted after it stopped stays stopped, and the best checkpoint is a query any stage can make.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajlake.evaluate.metrics import wilson_interval
from trajlake.store import Lake


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of a train run: its step (0: the starting policy), success rate and episodes."""

    step: int
    success: float
    episodes: int
    policy_id: str | None = None

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval of the success rate."""
        return wilson_interval(round(self.success * self.episodes), self.episodes)


def regression(start: EvalPoint | None, now: EvalPoint) -> str | None:
    """Why the run must stop, or None: `now`'s success is below the lower bound of `start`'s 95% interval (a
    drop the start's own sampling noise does not explain)."""
    if start is None or start.episodes == 0 or now.episodes == 0:
        return None
    low, high = start.interval
    if now.success >= low:
        return None
    return (f"eval success {now.success:.2f} at step {now.step} fell below the starting policy's 95% interval "
            f"[{low:.2f}, {high:.2f}] (success {start.success:.2f} on {start.episodes} episodes)")


_EVALS_SQL = """
SELECT step, policy_id, TRY_CAST(metrics->>'eval_success' AS DOUBLE) AS success,
       coalesce(TRY_CAST(metrics->>'eval_episodes' AS BIGINT), 0) AS episodes
FROM train_steps WHERE run_id = ? AND (metrics->>'eval_success') IS NOT NULL ORDER BY step
"""


def eval_points(lake: Lake, run_id: str) -> list[EvalPoint]:
    """Every evaluation of train run `run_id`, by step (step 0's policy is None: the run's start)."""
    return [EvalPoint(r["step"], r["success"], r["episodes"], r["policy_id"])
            for r in lake.query(_EVALS_SQL, [run_id]).iter_rows(named=True)]


def stopped_reason(lake: Lake, run_id: str) -> str | None:
    """The reason train run `run_id` stopped on a regression, or None when it did not."""
    rows = lake.query("SELECT (metrics->>'stopped') AS s FROM train_steps WHERE run_id = ? "
                      "AND (metrics->>'stopped') IS NOT NULL ORDER BY step DESC LIMIT 1", [run_id])
    return rows["s"][0] if rows.height else None


def best_eval_policy(lake: Lake, run_id: str) -> EvalPoint | None:
    """The checkpoint of train run `run_id` with the highest eval success (the earliest of equals), or None when
    no checkpoint was evaluated. The start (step 0) is no checkpoint of the run: compare with it yourself."""
    points = [p for p in eval_points(lake, run_id) if p.step > 0 and p.policy_id]
    return max(points, key=lambda p: (p.success, -p.step)) if points else None


__all__ = ["EvalPoint", "best_eval_policy", "eval_points", "regression", "stopped_reason"]
