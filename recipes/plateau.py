"""The recipe's measured choices: SFT until val stops improving, the rollout temperature the policy survives, and
RL's best checkpoint on val.

Each answers one way the TextCraft run went wrong: "RL vs the SFT plateau" compared RL with an SFT still rising
on val; sampling at T=1.0 broke a 135M policy (greedy 0.43, T=1.0 0.07); and the last RL checkpoint was kept
however its val success went. Every number here is an eval run in the store, so a re-run reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from trajlake.core.display import console, show
from trajlake.store import Lake


@dataclass(frozen=True)
class Plateau:
    """Where SFT stopped: val success per checkpoint step, the best step (the earliest of equals), and why."""

    val_by_step: dict[int, float]
    step: int
    reason: str


def plateau_steps(every: int, cap: int) -> list[int]:
    """The checkpoint steps of an SFT run of at most `cap` steps checkpointed every `every` (the cap always)."""
    steps = list(range(every, cap + 1, every))
    return steps if steps and steps[-1] == cap else [*steps, cap]


def plateau_reached(val: dict[int, float], patience: int) -> int | None:
    """The best step once the last `patience` checkpoints have not improved on it (strictly), else None."""
    steps = sorted(val)
    best = max(steps, key=lambda k: (val[k], -k))
    later = [k for k in steps if k > best]
    return best if len(later) >= patience else None


def sft_to_plateau(cfg, lake: Lake, model: Path, sft_filter: str, *, train_stage, evaluate_policies) -> Plateau:
    """SFT (the recipe's sft stage: `cfg.stage_config("sft")`) in stretches of its `checkpoint_every` steps, each
    checkpoint evaluated greedily on val as it is made, until `sft_patience` checkpoints in a row bring no gain
    over the best (a plateau) or its `sft_steps` is reached (the cap). The run is one train run extended stretch by
    stretch with its optimizer state saved, so it trains as one uninterrupted run would; a checkpoint already
    stored is not trained again."""

    sft = f"{cfg.prefix}-sft"
    stage = cfg.stage_config("sft")
    stage = stage.replace(run_id=sft, model=str(model), sft_filter=sft_filter, save_optimizer=True,
                    micro_batch=min(stage.optim.micro_batch, stage.optim.minibatch_size))
    val: dict[int, float] = {}
    for k in plateau_steps(stage.checkpoint.every, stage.sft.steps):
        policy = f"policy:{sft}/step-{k}"
        stored = lake.query("SELECT count(*) AS n FROM policies WHERE policy_id = ?", [f"{sft}/step-{k}"])["n"][0]
        if not stored:
            train_stage(lake, stage.replace(sft_steps=k))
        summary = evaluate_policies(cfg, lake, [policy], model, split="val")
        val[k] = summary.filter(pl.col("policy") == policy)["success_rate"][0]
        best = plateau_reached(val, cfg.sft_patience)
        if best is not None:
            return Plateau(val, best, f"val success has not improved for {cfg.sft_patience} checkpoints since "
                                      f"step {best}")
    best = max(val, key=lambda k: (val[k], -k))
    return Plateau(val, best, f"the cap of {stage.sft.steps} steps (val success may still be rising: raise "
                              "sft_steps)")


def choose_rollout_temperature(cfg, lake: Lake, policy: str, model: Path, *, default: float) -> float:
    """`default`, or with cfg.temperatures the highest of them whose sampled val success `policy` keeps within
    greedy's interval (evaluate.temperature), its table printed."""
    if not cfg.temperatures:
        return default
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.temperature import sweep_temperatures

    base = EvalConfig(policies=(policy,), split="val", tasks=cfg.val_eval_tasks, tokenizer=str(model), seed=cfg.seed,
                      progress=cfg.progress, **cfg.rollout)
    result = sweep_temperatures(lake, base, policy, tuple(cfg.temperatures), split="val")
    if cfg.progress:
        show(result.table)
    console.print(f"rollout temperature: {result.chosen:g} (the highest whose sampled val success is within "
                  "greedy's 95% interval)")
    return result.chosen


def rl_best_on_val(lake: Lake, run_id: str, last_policy: str) -> tuple[str, dict[int, float], str]:
    """RL's policy as the recipe keeps it: its best checkpoint on val (the last one when none was evaluated);
    val success by step (0: the start); and a line saying which and why."""
    from trajlake.train.eval_guard import best_eval_policy, eval_points, stopped_reason

    points = eval_points(lake, run_id)
    by_step = {p.step: round(p.success, 3) for p in points}
    best = best_eval_policy(lake, run_id)
    stopped = stopped_reason(lake, run_id)
    tail = f"; the run stopped early: {stopped}" if stopped else ""
    if best is None:
        return f"policy:{last_policy}", by_step, f"the last checkpoint (no val evaluation){tail}"
    start = by_step.get(0)
    versus = f" (start {start:.2f})" if start is not None else ""
    return (f"policy:{best.policy_id}", by_step,
            f"step {best.step}, the best on val: {best.success:.2f}{versus}{tail}")


__all__ = ["Plateau", "choose_rollout_temperature", "plateau_reached", "plateau_steps", "rl_best_on_val",
           "sft_to_plateau"]
