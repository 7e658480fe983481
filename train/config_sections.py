"""TrainConfig's sections, as verl groups its config: a TOML file may write each field in its section's table and
a command line may give it by its dotted name.

    [kl]                 # the same as kl_coef = 0.01 at the top level
    coef = 0.01          # and as `trajlake train --kl.coef 0.01` (or --kl-coef 0.01)

A field's short name in its section drops the section's own prefix (`kl_coef` is `kl.coef`, `run_id` is
`run.id`, `eval_every` is `eval.every`); the others keep their names (`optim.lr`, `rollout.temperature`). The
dataclass stays flat (`cfg.kl_coef`), and so does the config a run stores, so run ids and resumes do not depend on
how a file was written. A flat file (every config from before the sections) loads as it did.
"""

from __future__ import annotations

from typing import Any

from trajlake.core.errors import TrajlakeError

#: section -> (what it holds, its fields in TrainConfig's order); every field is in exactly one
#: (tests/test_train_config_sections.py holds this to TrainConfig's fields)
SECTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "run": ("what is trained, from where, for how long, and how it reports",
            ("model", "algo", "run_id", "seed", "iterations", "reward_spec", "log_every", "progress", "report_to")),
    "rollout": ("how the iterations' rollouts play: the env, the template, sampling, and which tasks",
                ("env", "env_url", "split", "difficulty", "max_turns", "template", "system_prompt", "temperature",
                 "top_p", "max_new_tokens", "max_context_tokens", "truncation", "on_format_error", "concurrency",
                 "replicas", "tasks", "rotate_tasks", "task_selector", "task_pool", "samples", "min_outcome_groups",
                 "sampling_rounds", "horizon_start", "horizon_every", "rollout_engine")),
    "eval": ("the held-out evaluations during training",
             ("eval_every", "eval_split", "eval_tasks", "stop_on_regression")),
    "data": ("stored rollouts trained on instead of (or beside) fresh ones",
             ("train_filter", "train_snapshot", "replay_ratio", "replay_staleness", "replay_filter")),
    "async": ("rollouts that collector processes play beside the learner, which trains on what they stored",
              ("async_collectors", "async_staleness")),
    "algorithm": ("advantages, the policy loss and what it keeps",
                  ("advantage", "policy_loss", "agg_mode", "loss_norm_constant", "clip_low", "clip_high", "clip_c",
                   "norm_adv_by_std", "whiten_advantages", "gamma", "lam", "step_advantage_weight", "turn_baseline",
                   "group_filter", "drop_zero_advantage", "advantage_floor", "entropy_coef", "old_logprobs",
                   "is_cap")),
    "kl": ("the KL anchor to the starting policy",
           ("kl_coef", "kl_estimator", "kl_mode", "kl_controller", "kl_target", "kl_horizon")),
    "critic": ("PPO's value model", ("value_loss", "value_clip", "critic_lr", "critic_warmup")),
    "optim": ("the optimizer and the batches it steps on",
              ("lr", "lr_warmup_steps", "weight_decay", "epochs", "minibatch_size", "micro_batch", "grad_accum",
               "grad_clip")),
    "engine": ("DeepSpeed's engine", ("zero_stage", "dtype")),
    "checkpoint": ("checkpoints", ("checkpoint_dir", "save_optimizer", "checkpoint_every")),
    "sft": ("SFT on a filtered store query", ("sft_filter", "sft_steps", "sft_snapshot")),
}

#: field -> its section
SECTION_OF: dict[str, str] = {f: name for name, (_, fields) in SECTIONS.items() for f in fields}


def short_name(field: str) -> str:
    """`field`'s name in its section: `kl_coef` is `coef` in [kl], `lr` stays `lr` in [optim]."""
    prefix = SECTION_OF[field] + "_"
    return field[len(prefix):] if field.startswith(prefix) else field


def dotted(field: str) -> str:
    """`field`'s dotted name: `kl_coef` is `kl.coef`."""
    return f"{SECTION_OF[field]}.{short_name(field)}"


#: (section, short name) -> field
_FIELD_AT = {(SECTION_OF[f], short_name(f)): f for f in SECTION_OF}


def flatten(data: dict[str, Any], where: str, error: type[TrajlakeError]) -> dict[str, Any]:
    """A TOML config's keys as TrainConfig's fields: each `[section]` table's keys by their field names, the top
    level's as they are. `error` (one line, naming `where`) for an unknown section or key, and for a field given
    both at the top level and in its section."""
    flat = {k: v for k, v in data.items() if k not in SECTIONS or not isinstance(v, dict)}
    for section, table in data.items():
        if section not in SECTIONS or not isinstance(table, dict):
            continue
        for key, value in table.items():
            field = _FIELD_AT.get((section, key))
            if field is None:
                valid = ", ".join(short_name(f) for f in SECTIONS[section][1])
                raise error(f"{where}: [{section}] has no key {key!r}; valid: {valid}")
            if field in flat:
                raise error(f"{where}: {field} is given twice, at the top level and as {key} in [{section}]")
            flat[field] = value
    return flat


__all__ = ["SECTIONS", "SECTION_OF", "dotted", "flatten", "short_name"]
