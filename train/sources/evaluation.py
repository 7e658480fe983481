"""The held-out evaluation during training: greedy episodes of `eval_tasks` tasks of `eval_split`, played by rank 0
as the iteration's rollouts are (the actor itself, or the run's rollout engine), made by evaluate's own code."""

from __future__ import annotations

from trajlake.train.distributed import broadcast
from trajlake.train.engine import Engines
from trajlake.train.sources.fresh import collect_run
from trajlake.train.train_run import TrainRun


def eval_config(r: TrainRun, policy_id: str, step: int):
    """The collect run of a held-out eval of this train run, made by evaluate's own code: greedy, one sample
    of `eval_tasks` tasks of `eval_split`, played as the rollouts are."""
    from trajlake.collect.config import rollout_fields
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.run import eval_collect_config

    c, policy = r.cfg, f"policy:{policy_id}"
    ec = EvalConfig(**rollout_fields(c.rollout, split=c.eval.split,
                                     concurrency=min(c.rollout.concurrency, c.eval.tasks)),
                    policies=(policy,), tasks=c.eval.tasks, greedy=True, seed=c.run.seed, progress=False)
    return eval_collect_config(ec, policy, f"{r.run_id}/eval-{step}", parent_run_id=r.run_id)


def evaluate(r: TrainRun, engines: Engines, policy_id: str, path: str, step: int) -> dict[str, float]:
    """Greedy episodes on held-out tasks (rank 0); success rate and mean env reward, on every rank."""
    from trajlake.evaluate.run import success_rate

    out = None
    if r.main:
        out = success_rate(r.lake, collect_run(r, engines, policy_id, path, eval_config(r, policy_id, step)))
    return broadcast(out)


__all__ = ["eval_config", "evaluate"]
