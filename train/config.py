"""The train stage's configuration: one dataclass, every field documented, checked at construction.

`load_config(path)` reads it from TOML (the field names below at the top level, or each in its section's table,
`[kl] coef = 0.01`: train/config_sections.py; an unknown key is an error naming it). `TrainConfig(...)` raises
`ConfigError` naming the field when a value has the wrong type (checked from the annotations), when a number is not
finite or out of its range, and saying what to fix when fields disagree with each other (the rules:
train/config_checks.py).

A run's settings are stored once, in its `runs.config` row; restarting the same run id resumes it only with
the same RUN_FIELDS (see `TrainConfig.differences` and RESUMABLE_FIELDS below).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from trajlake.collect.config import RolloutConfig
from trajlake.core.config_types import (
    added_fields,
    added_later,
    check_field_types,
    operational,
    operational_fields,
    run_fields,
    setting,
)
from trajlake.core.errors import TrajlakeError
from trajlake.core.text_files import read_text_file
from trajlake.store.runs import differences
from trajlake.train.config_checks import (  # noqa: F401  (the constants are this module's API too)
    DTYPES,
    MAX_COUNT,
    ConfigError,
    check_numbers,
    check_train_config,
    group_filter_of,
    registries,
)
from trajlake.train.config_sections import flatten

#: the train configs the package ships (the recipes' and the docs')
CONFIGS_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True, kw_only=True)
class TrainConfig(RolloutConfig):
    """What `trajlake train` trains, on what data, and how.

    A run id is one run: restarting it resumes from its last checkpoint, and only with the settings it was
    started with (RUN_FIELDS: every field but RESUMABLE_FIELDS; `model` is compared as the policy it resolves
    to). What may differ on a restart is how the run is carried out, not what it trains: `iterations` and
    `sft_steps` (extend a run; never below the steps it has done), `env_url`, `concurrency`, `micro_batch`,
    `grad_accum`, `checkpoint_dir`, `save_optimizer`, `checkpoint_every`, `log_every`, `eval_every` and
    `progress`. The run's `runs.config` then records the values of the latest restart.

    How the rollouts (and the held-out evals) play is RolloutConfig's fields (env, split, template, sampling,
    turns...), inherited; `temperature` must be > 0 here (log-probs in training use logits / temperature too).
    """

    config_name: ClassVar[str] = "train config"
    error_type: ClassVar[type[TrajlakeError]] = ConfigError

    # ---- what and from where -----------------------------------------------------------------------
    model: str = setting(help=(
        "Starting point: a model folder (save_pretrained layout), `policy:ID` (a checkpoint in the store) or "
        "`run:RUN_ID` (the last checkpoint of that train run, e.g. `run:sft-doors` after the warm start)."))
    algo: str = setting("grpo", help=(
        "grpo (group-relative advantages, no critic), ppo (GAE with a critic) or sft (cross-entropy on a filtered "
        "store query; `sft_filter`, `sft_steps`)."))
    run_id: str | None = operational(None, help=(
        "Run id. A run restarted with the same id resumes from its last checkpoint; None makes a new id. A given one "
        "is a safe id (trajlake.core.ids.check_id: letters, digits, '.', '_', '-'; not empty): it names folders."))
    checkpoint_dir: str = operational("checkpoints", help=(
        "Folder for checkpoints: each is `<checkpoint_dir>/<run_id>/step-<n>` and a row in `policies`."))
    seed: int = setting(0, help=(
        "Seeds torch, the minibatch shuffles and the rollout sampler (iteration i samples with seed + i)."))

    # ---- rollouts (and RolloutConfig's fields) --------------------------------------------------------
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
    iterations: int = operational(10, help="Iterations (collect -> score -> update -> checkpoint) of grpo/ppo.")
    reward_spec: str | None = setting(None, help=(
        "Reward spec TOML; None: the built-in default spec (rewards/specs/default.toml)."))
    horizon_start: int = added_later(0, help=(
        "Horizon curriculum (AgentGym-RL's ScalingInter-RL): the turn cap of the first iteration's rollouts, one "
        "turn more every `horizon_every` iterations up to max_turns (`horizon`), so that the policy learns a task's "
        "first steps on short, low-variance episodes before it plays whole ones. 0: off, every iteration plays "
        "max_turns. Held-out evals always play max_turns. Part of the run: a restart may not change it."))
    horizon_every: int = added_later(1, help=(
        "With horizon_start: iterations per one-turn growth of the cap (1: one turn more every iteration)."))
    eval_every: int = operational(0, help=(
        "Evaluate every N iterations (and before the first) on held-out tasks, greedy; 0: never."))
    eval_split: str = setting("test", help="Split of the held-out tasks.")
    eval_tasks: int = setting(32, help="Held-out tasks per evaluation.")
    stop_on_regression: bool = operational(True, help=(
        "With eval_every: stop the run (finished, the reason in its last train_steps row) when an evaluation's "
        "success falls below the 95% Wilson lower bound of the first one (the starting policy's), so RL never ends a "
        "long run below where it started. The best checkpoint on the eval split is `best_eval_policy`."))

    # ---- stored rollouts (instead of collecting) -------------------------------------------------------
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

    # ---- asynchronous rollouts --------------------------------------------------------------------------
    async_collectors: int = added_later(0, help=(
        "0: each iteration collects, then trains (the synchronous loop). N: N collector processes (Ray actors) "
        "keep playing the newest policy stored in `policies` into the lake while the learner trains on the groups "
        "they stored (train/sources/asynchronous.py); needs a sqlite: or postgres: lake, and the ratio taken "
        'against the behaviour log-probs (old_logprobs = "behaviour" or is_cap).'))
    async_staleness: int = added_later(1, help=(
        "Async: the learner trains only on groups played by a policy at most this many steps older than the one it "
        "updates; older ones are skipped (the stale_groups metric)."))

    # ---- the update ----------------------------------------------------------------------------------
    advantage: str | None = setting(None, help=(
        "Advantage estimator (train.algos.ADVANTAGES); None: grpo for grpo, gae for ppo."))
    policy_loss: str = setting("ppo_clip", help="Policy loss (train.algos.POLICY_LOSSES): ppo_clip, dual_clip, gspo.")
    agg_mode: str = setting("token-mean", help=(
        "Loss aggregation (train.algos.AGG_MODES) for the policy, entropy, KL and value losses."))
    loss_norm_constant: float | None = setting(None, help=(
        "Constant of agg_mode seq-mean-token-sum-norm; None: max_new_tokens * max_turns."))
    clip_low: float = setting(0.2, help="Lower clip range of the ratio (1 - clip_low).")
    clip_high: float = setting(0.2, help="Upper clip range of the ratio (1 + clip_high); 0.28 is DAPO's clip-higher.")
    clip_c: float = setting(3.0, help="Dual-clip bound c (> 1) of dual_clip.")
    norm_adv_by_std: bool = setting(True, help="grpo: divide by the group std (False: Dr. GRPO style).")
    whiten_advantages: bool = setting(True, help="gae: whiten advantages over the batch.")
    gamma: float = setting(1.0, help=(
        "Discount over agent tokens (gae, reinforce++), or over turns (gigpo, turn_reinforce, turn_gae)."))
    lam: float = setting(0.95, help="GAE lambda (gae over tokens, turn_gae over turns).")
    step_advantage_weight: float = setting(1.0, help=(
        "gigpo: weight of the step-level advantage (steps of a group that saw the same observation compared) added "
        "to the episode-level one."))
    turn_baseline: str = setting("none", help=(
        "turn_reinforce: what each turn's discounted return is compared with: none, turn (the group's mean at the "
        "same turn number) or episode (the group's mean episode return)."))
    group_filter: str | None = added_later(None, before="all", help=(
        "Which GRPO groups the update learns from (train.algos.GROUP_FILTERS): `outcome_differs` keeps only the "
        "groups whose samples' success differs (DAPO's dynamic sampling; GiGPO and RAGEN do the same): a group all "
        "won or all lost has no outcome to learn from, and its shaping differences alone, divided by the group's "
        "small std, would get a win's weight. `all` keeps every group. None: the algo's default for an estimator "
        "that compares a group's samples (grpo: outcome_differs; ppo: all), `all` for a token-level one. Each "
        "iteration records the share of groups with an outcome difference (`outcome_groups`)."))
    drop_zero_advantage: bool = setting(True, help=(
        "Leave out of the actor's update the sequences whose advantage is 0 on every token (GRPO groups whose "
        "samples all scored the same, DAPO's dynamic-sampling filter): they add no policy gradient, but a step on "
        "them alone would still move the weights by Adam's momentum. An iteration with none left skips the update."))
    advantage_floor: float | None = setting(None, help=(
        "Raise every advantage below this to it (None: off). 0 learns only from the samples that did better than "
        "their baseline: on stored rollouts the policy no longer plays (train_filter), pushing the worse ones down "
        "moves their probability onto replies the data never shows, whose failures the update never sees (measured "
        "in the re-score-and-retrain workflow of docs/rewards.md)."))
    entropy_coef: float = setting(0.0, help="Entropy bonus weight (loss -= entropy_coef * entropy).")
    kl_coef: float = setting(0.001, help=(
        "KL(pi || ref) weight, an anchor to the starting policy; > 0 loads a frozen reference model (the starting "
        "model) and costs one more forward pass per sequence. 0.001 with k3 is verl's GRPO setting (verl-agent's "
        "GiGPO uses 0.01); 0 turns the anchor off."))
    kl_estimator: str = setting("k3", help="KL estimator (train.algos.KL_ESTIMATORS): k1, k2, k3, abs.")
    kl_mode: str = setting("loss", help=(
        "`loss`: a KL term in the loss (GRPO); `reward`: a per-token penalty on the rewards (PPO-RLHF)."))
    kl_controller: str = setting("fixed", help="fixed or adaptive (then kl_target and kl_horizon are needed).")
    kl_target: float | None = setting(None, help="Adaptive controller: the KL it steers to.")
    kl_horizon: float | None = setting(None, help="Adaptive controller: horizon in sequences.")
    old_logprobs: str = setting("recompute", help=(
        "recompute: pi_old is recomputed by the actor before the epochs; behaviour: the stored sampling log-probs "
        "are pi_old (no extra forward; the ratio is then an importance weight pi / mu)."))
    is_cap: float | None = setting(None, help=(
        "With recompute: truncated importance weights min(pi_old / mu, is_cap) from the stored behaviour log-probs "
        "(off-policy correction of replayed or mismatched rollouts); None: off."))
    value_loss: str = setting("clipped", help="ppo: value loss (train.algos.VALUE_LOSSES): clipped, mse.")
    value_clip: float = setting(0.5, help="ppo: clip range of the clipped value loss.")
    critic_lr: float = setting(1e-5, help="ppo: learning rate of the critic.")
    critic_warmup: int = setting(0, help="ppo: iterations that train only the critic.")

    # ---- optimisation ---------------------------------------------------------------------------------
    lr: float = setting(1e-6, help=(
        "Actor learning rate (AdamW). 1e-6 is what AgentGym-RL, GiGPO and RAGEN use to fine-tune full weights with "
        "RL: Adam's first steps move every weight by about lr whatever the gradient, so 1e-5 on a noisy batch moves "
        "a pretrained policy far (SFT wants more: set it per run)."))
    lr_warmup_steps: int = added_later(0, help=(
        "Optimizer steps over which the actor's lr rises linearly to lr (DeepSpeed's WarmupLR: the first step at lr "
        "/ N, lr from step N on); 0: none, as verl's default. A resume without save_optimizer warms up again."))
    weight_decay: float = setting(0.0, help="AdamW weight decay.")
    epochs: int = setting(1, help="Passes over each iteration's batch.")
    minibatch_size: int = setting(16, help="Sequences per optimizer step, over all processes.")
    micro_batch: int = operational(4, help=(
        "Sequences per forward pass per process (micro-batches are length-bucketed, right-padded)."))
    grad_accum: int | None = operational(None, help=(
        "Micro-batches per optimizer step per process; None: minibatch_size / (micro_batch * processes). Given, it "
        "must agree: minibatch_size = micro_batch * grad_accum * processes."))
    grad_clip: float = setting(1.0, help="Gradient norm clip (0: off).")
    zero_stage: int = setting(0, help="DeepSpeed ZeRO stage, 0-3.")
    dtype: str = setting("fp32", help=(
        "fp32 or bf16 (DeepSpeed bf16: bf16 weights and activations, fp32 master weights)."))
    save_optimizer: bool = operational(True, help=(
        "Also save the DeepSpeed state (optimizer moments; the critic's weights) with each checkpoint, so a resumed "
        "run continues exactly; without it a resumed run restarts the optimizer and the critic."))

    # ---- sft ----------------------------------------------------------------------------------------
    sft_filter: str = setting("success", help=(
        "SQL over episodes columns choosing SFT data, e.g. \"success AND policy_id LIKE 'scripted:%'\"."))
    sft_steps: int = operational(100, help="SFT optimizer steps.")
    sft_snapshot: int | None = setting(None, help="Snapshot SFT reads (None: the latest at start).")
    checkpoint_every: int = operational(0, help=(
        "SFT: checkpoint every N steps (0: only at the end). RL checkpoints every iteration."))
    log_every: int = operational(10, help="SFT: record a train_steps row every N steps.")
    progress: bool = operational(True, help="Show a progress bar with the main metrics.")
    rollout_engine: str = operational("auto", help=(
        "What plays the rollouts and held-out evals: `transformers` (the actor itself, in this process), `vllm` (a "
        "vLLM engine started once, each new checkpoint loaded into it without a restart; `make setup-vllm` on a "
        "CPU), or `auto`: the faster of the two for the run at hand, by a rule from measured speeds (the model's "
        "size, the tokens the run generates, whether vLLM is installed: train/rollout_engines.py), printed and "
        "recorded with the run (`rollout_engine_chosen`). With replicas > 1, each replica runs the engine."))
    report_to: tuple[str, ...] = operational((), help=(
        "Experiment trackers every train_steps row also goes to, under the peers' metric names (train/trackers.py): "
        "tensorboard (`<checkpoint_dir>/<run_id>/tensorboard`), wandb (online when logged in, else offline)."))

    def __post_init__(self):
        # the types first (every rule below compares values), then the numbers' ranges (before any rule
        # divides by one), then RolloutConfig's rules and this config's own (train/config_checks.py)
        check_field_types(self, self.config_name, self.error_type)
        check_numbers(self)
        super().__post_init__()
        check_train_config(self)

    # ---- derived ------------------------------------------------------------------------------------
    @property
    def group_filter_name(self) -> str:
        """The group filter used (the algo's registered default when `group_filter` is None)."""
        return group_filter_of(self.algo, self.advantage, self.group_filter)

    @property
    def advantage_name(self) -> str:
        """The advantage estimator used (the algo's registered default when `advantage` is None)."""
        return self.advantage or registries().ALGOS[self.algo].default_advantage

    def turns_at(self, iteration: int) -> int:
        """The turn cap of iteration `iteration`'s (from 0) rollouts under the horizon curriculum."""
        return horizon(iteration, self.horizon_start, self.horizon_every, self.max_turns)

    @property
    def norm_constant(self) -> float:
        return float(self.loss_norm_constant or self.max_new_tokens * self.max_turns)

    def accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step per process for `world_size` processes."""
        per = self.micro_batch * world_size
        if self.grad_accum is not None:
            if self.micro_batch * self.grad_accum * world_size != self.minibatch_size:
                raise ConfigError(
                    f"train config: minibatch_size ({self.minibatch_size}) != micro_batch ({self.micro_batch}) * "
                    f"grad_accum ({self.grad_accum}) * processes ({world_size}); fix one or unset grad_accum")
            return self.grad_accum
        if self.minibatch_size % per:
            raise ConfigError(f"train config: minibatch_size ({self.minibatch_size}) is not a multiple of "
                              f"micro_batch * processes ({self.micro_batch} * {world_size})")
        return self.minibatch_size // per

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with `changes` (checked again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, stored: dict[str, Any], *, start_policy: str | None = None,
                    spec_id: str | None = None) -> list[tuple[str, Any, Any]]:
        """(field, stored value, given value) for each of RUN_FIELDS where this config differs from the `stored`
        config of the run it would resume (`runs.config`; trajlake.store.runs.differences). `model` is compared
        as the policy it resolves to (`start_policy`, stored beside the config), so `run:ID`, `policy:ID` and the
        folder of one checkpoint are the same start, and `run:ID` is not once that run has trained on.
        `reward_spec` is compared by its content (`spec_id`, stored beside the config as `reward_spec_id`), so
        an edited spec file at the same path is a different run and a copy at another path is the same. A field
        the stored config lacks (a lake from before it existed) is not compared, except those declared
        `added_later` (ADDED_FIELDS): compared with the value that run played by."""
        reg = registries()

        def adjust(name: str, old: Any, new: Any) -> tuple[Any, Any] | None:
            if name == "model" and start_policy and stored.get("start_policy"):
                if stored["start_policy"] == start_policy:
                    return None
                return f"{old} (policy {stored['start_policy']})", f"{new} (policy {start_policy})"
            if name == "reward_spec" and spec_id and stored.get("reward_spec_id"):
                if stored["reward_spec_id"] == spec_id:
                    return None
                return f"{old} (spec {stored['reward_spec_id']})", f"{new} (spec {spec_id})"
            if name == "advantage":  # None is the algo's default: compare the estimators actually used
                return old or reg.DEFAULT_ADVANTAGE.get(stored.get("algo", self.algo), old), self.advantage_name
            if name == "group_filter":  # likewise (a run stored before the filter existed kept every group)
                algo = stored.get("algo", self.algo)
                used = old or (group_filter_of(algo, stored.get("advantage"), old) if algo in reg.ALGOS else old)
                return used, self.group_filter_name
            return old, new

        return differences(stored, self, adjust=adjust)


FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}
# How a run is carried out, not what it trains, is declared `operational` on its field: it may differ when a run
# id is restarted. iterations and sft_steps extend (or end sooner) the same run; env_url says where the env
# server is now, not which env it serves; concurrency is how many episodes play at once, replicas on how many
# policy copies, rollout_engine with what (a restart may move to a machine with vLLM); micro_batch and
# grad_accum split a mini-batch over forward passes and processes (the losses are aggregated over the whole
# mini-batch, so the update is the same); checkpoint_dir, save_optimizer and checkpoint_every say where and how
# often checkpoints are written (a restart finds the last one through the store); log_every, eval_every,
# progress and report_to are what the run reports and where; run_id is the key itself.
RESUMABLE_FIELDS = operational_fields(TrainConfig)
# What makes a train run the run it is: every other field (the starting model, the data and rollouts, the
# reward spec, the algorithm and its hyper-parameters, seed, precision, ZeRO stage, the held-out evals). A
# restart with any of them changed would continue one run's weights, optimizer state and train_steps under
# other settings while its runs.config described the first ones, so it is refused; a new field is one of these
# unless it is declared `operational`.
RUN_FIELDS = run_fields(TrainConfig)
# RUN_FIELDS declared `added_later`: added after train runs were stored, with the value that keeps the old
# meaning: a stored config without one was played by that value (every iteration at max_turns before the
# horizon curriculum), so a restart at it resumes the run and a restart at another is refused like any other
# changed RUN_FIELD.
ADDED_FIELDS = added_fields(TrainConfig)


def horizon(iteration: int, start: int, every: int, max_turns: int) -> int:
    """The turn cap of iteration `iteration` (from 0) under the horizon curriculum: `start` turns, one more
    every `every` iterations, never above `max_turns`; `start` 0 (the curriculum off) is max_turns throughout.
    E.g. start 2, every 3, max_turns 4: iterations 0-2 play 2 turns, 3-5 play 3, 6 and after play 4."""
    if start == 0:
        return max_turns
    return min(max_turns, start + iteration // every)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> TrainConfig:
    """A TrainConfig from a flat mapping; unknown keys are an error naming them."""
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(FIELDS))}")
    if "model" not in data:
        raise ConfigError(f"{source}: `model` is required (a model folder or policy:ID)")
    try:
        return TrainConfig(**data)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except TypeError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_config(path: str | Path, **overrides: Any) -> TrainConfig:
    """Read a TrainConfig from a TOML file (each field at the top level or in its section's table:
    train/config_sections.py); `overrides` (not None) replace file values."""
    path = Path(path)
    try:
        data = tomllib.loads(read_text_file(path, "train config", error=ConfigError))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{path}: not a train config: its values nest too deep for TOML's reader") from None
    data = flatten(data, str(path), ConfigError)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data, str(path))


__all__ = ["TrainConfig", "CONFIGS_DIR", "ConfigError", "load_config", "config_from_dict", "RUN_FIELDS",
           "RESUMABLE_FIELDS", "ADDED_FIELDS", "horizon"]
