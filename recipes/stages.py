"""A recipe's train stages: each is a train config of train/configs/ (TOML) under the recipe's own settings, so a
setting has one default, in its file, and a recipe holds only what it changes.

A recipe config (DemoConfig, PipelineConfig) has a dict per stage, `sft` and `grpo`, of TrainConfig fields over
the stage's file, and a `stage_config(stage)` that reads them through `stage_config` below. Its command line's
short flags (`--sft-steps`, `--iterations`, `--lr`...) are STAGE_FLAGS: each names the stage fields it sets.
"""

from __future__ import annotations

from typing import Any

from trajlake.core.errors import TrajlakeError

#: a recipe's short flags for stage fields: flag -> the (stage, field)s it sets
STAGE_FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    "sft_steps": (("sft", "sft_steps"),), "sft_every": (("sft", "checkpoint_every"),),
    "sft_batch": (("sft", "minibatch_size"),), "sft_lr": (("sft", "lr"),),
    "iterations": (("grpo", "iterations"),), "tasks": (("grpo", "tasks"),), "samples": (("grpo", "samples"),),
    "lr": (("grpo", "lr"),), "temperature": (("grpo", "temperature"),), "advantage": (("grpo", "advantage"),),
    "task_selector": (("grpo", "task_selector"),), "rl_eval_every": (("grpo", "eval_every"),),
    "micro_batch": (("sft", "micro_batch"), ("grpo", "micro_batch")),
}
#: the stages a recipe has
STAGES = ("sft", "grpo")


def layered(*layers: dict) -> dict:
    """A recipe config's keywords, later layers over earlier ones: the stages' dicts (`sft`, `grpo`) merge key by
    key, and a STAGE_FLAGS flag becomes the stage fields it sets."""
    out: dict = {stage: {} for stage in STAGES}
    for layer in layers:
        for key, value in layer.items():
            if key in STAGE_FLAGS:
                for stage, name in STAGE_FLAGS[key]:
                    out[stage] = {**out[stage], name: value}
            elif key in STAGES:
                out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def stage_config(cfg: Any, stage: str, file: str, what: str, **recipe: Any):
    """The TrainConfig of recipe config `cfg`'s stage `stage`: train/configs/`file`, the rollout settings every
    stage shares (`cfg.rollout`), its seed, progress and checkpoint folder, the recipe's own defaults `recipe`,
    then `cfg`'s fields for the stage (`cfg.sft`, `cfg.grpo`); a `micro_batch` above the stage's `minibatch_size` is
    that (the recipes' --micro-batch caps both stages' passes). A field the stage does not have, or a value it
    refuses: one line naming the recipe (`what`) and the stage."""
    from trajlake.train.config import CONFIGS_DIR, load_config

    fields = {**recipe, **getattr(cfg, stage)}
    try:
        micro = (fields.pop("micro_batch") if "micro_batch" in fields
                 else load_config(CONFIGS_DIR / file).optim.micro_batch)
        tc = load_config(CONFIGS_DIR / file, **cfg.rollout, seed=cfg.seed, progress=cfg.progress,
                         checkpoint_dir=str(cfg.checkpoints.absolute()), **fields, micro_batch=1)
        # the rollout settings whole, None included (load_config keeps the file's value for a None: doors'
        # level); a micro batch (one flag sets both stages') at most the stage's step batch
        return tc.replace(**cfg.rollout, micro_batch=min(micro, tc.optim.minibatch_size))
    except TrajlakeError as e:
        raise TrajlakeError(f"{what}: the {stage} stage: {e}") from None


def check_counts(tc: Any, stage: str, what: str, fields: tuple[str, ...]) -> None:
    """Refuse a stage config whose `fields` (counts the recipe steps by) are below 1, in one line."""
    for name in fields:
        if tc.value(name) < 1:
            raise TrajlakeError(f"{what}: the {stage} stage's {name} must be >= 1, got {tc.value(name)}")


def train_stage(lake: Any, tc: Any):
    """Train the stage's TrainConfig `tc` (resumed when stored); its result."""
    from trajlake.train.loop import train

    return train(tc, lake)


__all__ = ["STAGES", "STAGE_FLAGS", "check_counts", "layered", "stage_config", "train_stage"]
