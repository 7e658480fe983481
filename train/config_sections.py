"""TrainConfig's sections, as verl groups its config: each a frozen dataclass of the fields of one concern,
`cfg.kl.coef` in code, a `[kl]` table in a TOML file, `--kl.coef` on a command line.

    [kl]
    coef = 0.01          # trajlake train --kl.coef 0.01

This file holds the sections that say what a run is and how it plays and stores (run, rollout, eval, data,
asynchronous, checkpoint, engine, sft); train/config_update.py holds the update's (algorithm, kl, critic, optim);
train/config.py assembles them into TrainConfig. Every field also has a flat name, unique in TrainConfig: its
section's `flat_names` entry (`coef` in [kl] is `kl_coef`), else its own name (`lr`). Flat names are what a
run's stored config is keyed by (`runs.config`, the same as before the sections), what a TOML file may give at its
top level (every config written before the sections loads as it did), a command line's second spelling
(`--kl-coef`) and what `TrainConfig.replace` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trajlake.collect.config import RolloutConfig
from trajlake.core.config_types import added_later, check_field_types, operational, setting
from trajlake.core.errors import TrajlakeError
from trajlake.train.config_checks import ConfigError


@dataclass(frozen=True, kw_only=True)
class Section:
    """A section of TrainConfig: its table's `key`, its fields' flat names where they differ from theirs, and
    its fields' types checked at construction (the rules across fields run on the whole TrainConfig)."""

    key: ClassVar[str]
    flat_names: ClassVar[dict[str, str]] = {}
    config_name: ClassVar[str] = "train config"
    error_type: ClassVar[type[TrajlakeError]] = ConfigError

    def __post_init__(self):
        check_field_types(self, self.config_name, self.error_type)


@dataclass(frozen=True, kw_only=True)
class RunSection(Section):
    """[run]: what is trained, from where, for how long, and how it reports."""

    key: ClassVar[str] = "run"
    flat_names: ClassVar[dict[str, str]] = {"id": "run_id"}

    model: str = setting(help=(
        "Starting point: a model folder (save_pretrained layout), `policy:ID` (a checkpoint in the store) or "
        "`run:RUN_ID` (the last checkpoint of that train run, e.g. `run:sft-doors` after the warm start)."))
    algo: str = setting("grpo", help=(
        "grpo (group-relative advantages, no critic), ppo (GAE with a critic) or sft (cross-entropy on a filtered "
        "store query; `sft_filter`, `sft_steps`)."))
    id: str | None = operational(None, help=(
        "Run id. A run restarted with the same id resumes from its last checkpoint; None makes a new id. A given one "
        "is a safe id (trajlake.core.ids.check_id: letters, digits, '.', '_', '-'; not empty): it names folders."))
    seed: int = setting(0, help=(
        "Seeds torch, the minibatch shuffles and the rollout sampler (iteration i samples with seed + i)."))
    iterations: int = operational(10, help="Iterations (collect -> score -> update -> checkpoint) of grpo/ppo.")
    reward_spec: str | None = setting(None, help=(
        "Reward spec TOML; None: the built-in default spec (rewards/specs/default.toml)."))
    log_every: int = operational(10, help="SFT: record a train_steps row every N steps.")
    progress: bool = operational(True, help="Show a progress bar with the main metrics.")
    report_to: tuple[str, ...] = operational((), help=(
        "Experiment trackers every train_steps row also goes to, under the peers' metric names (train/trackers.py): "
        "tensorboard (`<checkpoint_dir>/<run_id>/tensorboard`), wandb (online when logged in, else offline)."))


@dataclass(frozen=True, kw_only=True)
class RolloutSection(RolloutConfig, Section):
    """[rollout]: how the iterations' rollouts play: the env, the template, sampling (RolloutConfig's fields, as
    collect plays them: `cfg.rollout` is handed to it as it is), and which tasks."""

    key: ClassVar[str] = "rollout"
    flat_names: ClassVar[dict[str, str]] = {"engine": "rollout_engine"}
    config_name: ClassVar[str] = "train config"
    error_type: ClassVar[type[TrajlakeError]] = ConfigError

    tasks: int = setting(16, help="Tasks per iteration.")
    rotate_tasks: bool = setting(True, help=(
        "With task_selector rotation: iteration i plays tasks [i * tasks, (i + 1) * tasks) of the split, so no two "
        "iterations repeat a task (OpenManus-RL replays the same ones every step), around again from the start of a "
        "split with an end (an AgentGym server's train split); False plays the first `tasks` every iteration."))
    task_selector: str = added_later("rotation", help=(
        "Which tasks each iteration plays (train/task_select.py): `rotation` (the next block of the split, see "
        "rotate_tasks), `learnable` (a query over the lake's own history: the tasks of the split's first task_pool "
        "that this run's policies sometimes win, then those never played, then the rest; train/queries/ "
        "learnable.sql), or the path of a .sql file of your own (the same parameters; copy learnable.sql to start). "
        "The tasks each iteration played are recorded in its collect run, so a run replays as it was."))
    task_pool: int = added_later(0, help=(
        "With a query task_selector: how many tasks of the split (its first N) it chooses from; 0: the whole split "
        "(a split without an end needs a number)."))
    samples: int = setting(4, help=(
        "Samples per task: the group size K of GRPO (>= 2 for grpo, else every advantage is 0)."))
    min_outcome_groups: int = added_later(0, help=(
        "DAPO's dynamic sampling: when an iteration's `tasks` groups hold fewer than this many whose samples' "
        "outcomes differ, it plays another round of `tasks` other tasks (collect run `<run_id>/it-<n>/round-<k>`), "
        "up to `sampling_rounds` rounds, and the update learns from every round's groups. 0: one round. The tasks of "
        "a round are the selector's next ones (a query selector's first not yet played this iteration; with "
        "rotation, iteration i reserves blocks i*R .. i*R+R-1 of the split). Each iteration records the rounds it "
        "played."))
    sampling_rounds: int = added_later(1, help=(
        "With min_outcome_groups: the most rounds an iteration plays (DAPO's max_num_gen_batches), bounding its time "
        "when the policy wins nothing or everything."))
    horizon_start: int = added_later(0, help=(
        "Horizon curriculum (AgentGym-RL's ScalingInter-RL): the turn cap of the first iteration's rollouts, one "
        "turn more every `horizon_every` iterations up to max_turns (`horizon`), so that the policy learns a task's "
        "first steps on short, low-variance episodes before it plays whole ones. 0: off, every iteration plays "
        "max_turns. Held-out evals always play max_turns. Part of the run: a restart may not change it."))
    horizon_every: int = added_later(1, help=(
        "With horizon_start: iterations per one-turn growth of the cap (1: one turn more every iteration)."))
    engine: str = operational("auto", help=(
        "What plays the rollouts and held-out evals: `transformers` (the actor itself, in this process), `vllm` (a "
        "vLLM engine started once, each new checkpoint loaded into it without a restart; `make setup-vllm` on a "
        "CPU), or `auto`: the faster of the two for the run at hand, by a rule from measured speeds (the model's "
        "size, the tokens the run generates, whether vLLM is installed: train/rollout_engines.py), printed and "
        "recorded with the run (`rollout_engine_chosen`). With replicas > 1, each replica runs the engine."))


@dataclass(frozen=True, kw_only=True)
class EvalSection(Section):
    """[eval]: the held-out evaluations during training."""

    key: ClassVar[str] = "eval"
    flat_names: ClassVar[dict[str, str]] = {"every": "eval_every", "split": "eval_split", "tasks": "eval_tasks"}

    every: int = operational(0, help=(
        "Evaluate every N iterations (and before the first) on held-out tasks, greedy; 0: never."))
    split: str = setting("test", help="Split of the held-out tasks.")
    tasks: int = setting(32, help="Held-out tasks per evaluation.")
    stop_on_regression: bool = operational(True, help=(
        "With eval_every: stop the run (finished, the reason in its last train_steps row) when an evaluation's "
        "success falls below the 95% Wilson lower bound of the first one (the starting policy's), so RL never ends a "
        "long run below where it started. The best checkpoint on the eval split is `best_eval_policy`."))


@dataclass(frozen=True, kw_only=True)
class DataSection(Section):
    """[data]: stored rollouts trained on instead of (or beside) fresh ones."""

    key: ClassVar[str] = "data"

    train_filter: str | None = setting(None, help=(
        "SQL over episodes columns choosing stored episodes that the RL iterations train on instead of collecting "
        "(any runs, policies, envs), e.g. \"run_id LIKE 'demo-grpo/%'\"; `tasks` GRPO groups an iteration, dealt in "
        "order and wrapping around (train/sources/stored.py). The ratio is taken against their stored behaviour "
        'log-probs: set old_logprobs = "behaviour" or is_cap. None: every iteration collects fresh rollouts.'))
    train_snapshot: int | None = setting(None, help=(
        "With train_filter: the snapshot its episodes and their scores are read at (already scored by reward_spec, "
        "e.g. with `trajlake rewards`); None: score what the filter selects when the run starts and read the "
        "snapshot after (a restart reads that one again)."))
    replay_ratio: float = setting(0.0, help=(
        "Share of each iteration's GRPO groups replayed from this run's own earlier rollouts, beside the fresh ones "
        "(0: none; 0.25: one replayed group for every three fresh ones). Replayed episodes keep their stored scores "
        'and behaviour log-probs: set old_logprobs = "behaviour" or is_cap.'))
    replay_staleness: int = setting(1, help=(
        "How many policy versions back a replayed rollout may be: the last N iterations' rollouts."))
    replay_filter: str | None = setting(None, help=(
        'SQL over episodes columns narrowing the replay pool (e.g. "success"); None: every rollout in it.'))


@dataclass(frozen=True, kw_only=True)
class AsyncSection(Section):
    """[asynchronous]: rollouts that collector processes play beside the learner, which trains on what they stored."""

    key: ClassVar[str] = "asynchronous"
    flat_names: ClassVar[dict[str, str]] = {"collectors": "async_collectors", "staleness": "async_staleness"}

    collectors: int = added_later(0, help=(
        "0: each iteration collects, then trains (the synchronous loop). N: N collector processes (Ray actors) "
        "keep playing the newest policy stored in `policies` into the lake while the learner trains on the groups "
        "they stored (train/sources/asynchronous.py); needs a sqlite: or postgres: lake, and the ratio taken "
        'against the behaviour log-probs (old_logprobs = "behaviour" or is_cap).'))
    staleness: int = added_later(1, help=(
        "Async: the learner trains only on groups played by a policy at most this many steps older than the one it "
        "updates; older ones are skipped (the stale_groups metric)."))


@dataclass(frozen=True, kw_only=True)
class CheckpointSection(Section):
    """[checkpoint]: checkpoints."""

    key: ClassVar[str] = "checkpoint"
    flat_names: ClassVar[dict[str, str]] = {"dir": "checkpoint_dir", "every": "checkpoint_every"}

    dir: str = operational("checkpoints", help=(
        "Folder for checkpoints: each is `<checkpoint_dir>/<run_id>/step-<n>` and a row in `policies`."))
    save_optimizer: bool = operational(True, help=(
        "Also save the DeepSpeed state (optimizer moments; the critic's weights) with each checkpoint, so a resumed "
        "run continues exactly; without it a resumed run restarts the optimizer and the critic."))
    every: int = operational(0, help=(
        "SFT: checkpoint every N steps (0: only at the end). RL checkpoints every iteration."))


@dataclass(frozen=True, kw_only=True)
class EngineSection(Section):
    """[engine]: DeepSpeed's engine."""

    key: ClassVar[str] = "engine"

    zero_stage: int = setting(0, help="DeepSpeed ZeRO stage, 0-3.")
    dtype: str = setting("fp32", help=(
        "fp32 or bf16 (DeepSpeed bf16: bf16 weights and activations, fp32 master weights)."))


@dataclass(frozen=True, kw_only=True)
class SFTSection(Section):
    """[sft]: SFT on a filtered store query."""

    key: ClassVar[str] = "sft"
    flat_names: ClassVar[dict[str, str]] = {"filter": "sft_filter", "steps": "sft_steps", "snapshot": "sft_snapshot"}

    filter: str = setting("success", help=(
        "SQL over episodes columns choosing SFT data, e.g. \"success AND policy_id LIKE 'scripted:%'\"."))
    steps: int = operational(100, help="SFT optimizer steps.")
    snapshot: int | None = setting(None, help="Snapshot SFT reads (None: the latest at start).")


__all__ = ["Section", "RunSection", "RolloutSection", "EvalSection", "DataSection", "AsyncSection",
           "CheckpointSection", "EngineSection", "SFTSection"]
