"""The rules a train config must follow (TrainConfig runs them at construction), kept apart from the fields
they check so each file reads in one sitting.

`check_numbers` runs first, on values whose types are already checked: every float finite, every integer in
its range (a count >= 1 where 0 means nothing, and under MAX_COUNT), the run id a safe id. Only then do the
cross-field rules of `check_train_config` compare and divide values (`minibatch_size % micro_batch` with
micro_batch = 0 was a ZeroDivisionError). Every message names the field and says what to give instead.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any

from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import InvalidIdError, check_id
from trajlake.train.rollout_engines import ROLLOUT_ENGINES
from trajlake.train.trackers import TRACKERS

#: What the rules check: a trajlake.train.config.TrainConfig. That module imports this one to run them at
#: construction, so it is not imported back (not even for the type checker: the two would need each other).
CheckedConfig = Any

DTYPES = ("fp32", "bf16")

#: The largest count (steps, iterations, tasks, batch sizes, token budgets) a config may ask for. Far beyond any
#: run this trainer makes (10M optimizer steps of the tiny model take weeks), yet it turns a typo such as
#: `sft_steps = 100000000000000000000000` into an error instead of a run that never ends.
MAX_COUNT = 10_000_000
#: seeds: seed + iteration seeds the rollout sampler, whose seeds are 32-bit (numpy, vLLM)
MAX_SEED = 2**31 - 1
#: snapshot ids are BIGINT in the catalog
MAX_SNAPSHOT = 2**63 - 1
#: The largest learning rate: AdamW's first step moves a weight by about 10 x lr, which past ~3e38 overflows
#: float32 inside torch's optimizer (a RuntimeError, not a NaN the run could report). Far above any useful lr.
MAX_LR = 1e30
#: Above this, logits / temperature samples nearly uniformly: not a policy worth training or evaluating.
MAX_TEMPERATURE = 100.0
#: integer fields with a range other than [0, MAX_COUNT]
INT_RANGES = {"seed": (0, MAX_SEED), "train_snapshot": (0, MAX_SNAPSHOT), "sft_snapshot": (0, MAX_SNAPSHOT)}
#: counts for which 0 means nothing (no tasks, empty batches, no steps): >= 1
AT_LEAST_ONE = ("tasks", "samples", "epochs", "minibatch_size", "micro_batch", "grad_accum", "eval_tasks", "sft_steps",
                "log_every", "replay_staleness", "max_turns", "max_new_tokens", "max_context_tokens", "concurrency",
                "replicas", "horizon_every", "sampling_rounds")


class ConfigError(TrajlakeError):
    """A train config is invalid; the message says which field and what to do."""


def check_numbers(c: CheckedConfig) -> None:
    """Every number finite and in range, and the run id a safe id: before any rule compares or divides them."""
    for name, v in c.to_dict().items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"train config: {name} must be a finite number, got {v}")
        if isinstance(v, int) and not isinstance(v, bool):
            low, high = INT_RANGES.get(name, (1 if name in AT_LEAST_ONE else 0, MAX_COUNT))
            if v < low:
                raise ConfigError(f"train config: {name} must be >= {low}, got {v}")
            if v > high:
                cap = " (the cap on counts: far beyond any run)" if high == MAX_COUNT else ""
                raise ConfigError(f"train config: {name} must be at most {high:_}{cap}, got {v}")
    if not 0 < c.rollout.temperature <= MAX_TEMPERATURE:
        raise ConfigError(f"train config: temperature must be > 0 for training rollouts (log-probs use logits / "
                          f"temperature) and at most {MAX_TEMPERATURE:g}, got {c.rollout.temperature}")
    try:
        check_id(c.run.id, "run_id")
    except InvalidIdError as e:  # an empty run id is refused, not replaced by a generated one
        raise ConfigError(f"train config: {e}") from None


@functools.cache
def registries() -> SimpleNamespace:
    """The trainer's registries (train/algos), imported on first use: train.algos imports torch, which reading
    TrainConfig's fields does not need (`train --help`, or a second `train` its run's lease refuses at once)."""
    from trajlake.train import algos
    from trajlake.train.algos.algorithms import DEFAULT_ADVANTAGE, algos_accepting
    from trajlake.train.algos.turns import TURN_BASELINES

    return SimpleNamespace(**{name: getattr(algos, name) for name in REGISTRY_NAMES},
                           DEFAULT_ADVANTAGE=DEFAULT_ADVANTAGE, algos_accepting=algos_accepting,
                           TURN_BASELINES=TURN_BASELINES)


#: what `registries()` holds from train.algos itself
REGISTRY_NAMES = ("ADVANTAGES", "AGG_MODES", "GROUP_FILTERS", "KL_CONTROLLERS", "KL_ESTIMATORS", "KL_PLACEMENTS",
                  "OLD_LOGPROB_SOURCES", "POLICY_LOSSES", "VALUE_LOSSES", "ALGOS", "RL_LOOP", "SFT_LOOP")


def named_entries(c: CheckedConfig) -> dict[str, Any]:
    """The fields of `c` whose value names an entry of a registry (besides advantage, whose default depends on
    algo), in the sections `c` holds."""
    reg = registries()
    named = {"policy_loss": reg.POLICY_LOSSES, "agg_mode": reg.AGG_MODES, "kl_estimator": reg.KL_ESTIMATORS,
            "kl_controller": reg.KL_CONTROLLERS, "value_loss": reg.VALUE_LOSSES, "kl_mode": reg.KL_PLACEMENTS,
            "old_logprobs": reg.OLD_LOGPROB_SOURCES, "rollout_engine": ROLLOUT_ENGINES}
    return {name: registry for name, registry in named.items() if c.value(name) is not None}


def check_train_config(c: CheckedConfig) -> None:
    """Every rule of a TrainConfig (its sections' field types and RolloutConfig's rules were checked before): those
    on the sections every run holds, then, for a run that computes advantages, those on the update's."""
    for ok, message in _common_rules(c):
        if not ok:
            raise ConfigError(f"train config: {message}")
    _check_entry_rules(c)
    _check_horizon(c)
    _check_env(c)
    if c.algorithm is None:  # SFT: the rules below are on sections it does not hold
        return
    reg = registries()
    adv = c.advantage_name
    for ok, message in _update_rules(c, adv):
        if not ok:
            raise ConfigError(f"train config: {message}")
    if c.algorithm.is_cap is not None and not reg.OLD_LOGPROB_SOURCES[c.algorithm.old_logprobs].recomputed:
        raise ConfigError(f"train config: is_cap applies with old_logprobs = recompute (with "
                          f"{c.algorithm.old_logprobs} the ratio is the importance weight)")
    _check_advantage(c, adv)
    _check_stored_data(c)
    _check_async(c)
    if c.algorithm.turn_baseline not in reg.TURN_BASELINES:
        raise ConfigError(f"train config: unknown turn_baseline {c.algorithm.turn_baseline!r}; valid: "
                          f"{', '.join(reg.TURN_BASELINES)}")
    group = reg.ADVANTAGES[adv].min_group_size  # an estimator comparing a task's samples needs two of them
    if c.rollout.samples < group:
        raise ConfigError(f"train config: {adv} compares the samples of a task: samples must be >= {group}, "
                          f"got {c.rollout.samples}")
    _check_group_filter(c)
    _check_dynamic_sampling(c)


def _common_rules(c: CheckedConfig) -> list[tuple[bool, str]]:
    """(holds, what to say when it does not) for each rule on one or two values of the sections every run holds,
    in the order they are checked: names in their registries, ranges, and the batch sizes' divisibility."""
    from trajlake.collect.envs.base import SPLITS

    o = c.optim
    return [
        (bool(c.run.model), "model is required: a model folder or policy:ID"),
        (c.engine.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {c.engine.dtype!r}"),
        (c.engine.zero_stage in (0, 1, 2, 3), f"zero_stage must be 0, 1, 2 or 3, got {c.engine.zero_stage}"),
        *((name in registry, f"unknown {field} {name!r}; valid: {', '.join(registry.names())}")
          for field, registry, name in [(f, registry, c.value(f)) for f, registry in named_entries(c).items()]),
        (c.eval.split in SPLITS, f"eval_split must be one of {', '.join(SPLITS)}, got {c.eval.split!r}"),
        (0 < o.lr <= MAX_LR, f"lr must be > 0 and at most {MAX_LR:g}, got {o.lr}"),
        (0 <= o.weight_decay <= 1, f"weight_decay must be in [0, 1] (AdamW scales weights by 1 - lr * "
                                   f"weight_decay), got {o.weight_decay}"),
        (o.minibatch_size >= o.micro_batch,
         f"minibatch_size ({o.minibatch_size}) must be >= micro_batch ({o.micro_batch})"),
        (o.minibatch_size % o.micro_batch == 0,
         f"minibatch_size ({o.minibatch_size}) must be a multiple of micro_batch ({o.micro_batch})"),
        (o.grad_accum is None or o.minibatch_size % (o.micro_batch * o.grad_accum) == 0,
         f"grad_accum ({o.grad_accum}) needs minibatch_size ({o.minibatch_size}) to be a multiple "
         f"of micro_batch * grad_accum ({o.micro_batch} * {o.grad_accum}); or leave grad_accum unset"),
        (o.grad_clip >= 0, f"grad_clip must be >= 0, got {o.grad_clip}"),
        (o.loss_norm_constant is None or o.loss_norm_constant > 0,
         f"loss_norm_constant must be > 0 (or left unset), got {o.loss_norm_constant}"),
        (c.sft is None or bool(c.sft.filter.strip()),
         f"algo {c.run.algo} needs sft_filter (SQL over episodes, e.g. \"success AND policy_id LIKE 'scripted:%'\")"),
        (all(t in TRACKERS for t in c.run.report_to),
         f"unknown report_to {[t for t in c.run.report_to if t not in TRACKERS]}; valid: "
         f"{', '.join(TRACKERS.names())}"),
    ]


def _update_rules(c: CheckedConfig, adv: str) -> list[tuple[bool, str]]:
    """(holds, what to say when it does not) for each rule on one or two values of the update's sections."""
    reg, a = registries(), c.algorithm
    return [
        (adv in reg.ADVANTAGES, f"unknown advantage {adv!r}; valid: {', '.join(reg.ADVANTAGES.names())}"),
        (0 < c.critic.lr <= MAX_LR, f"critic_lr must be > 0 and at most {MAX_LR:g}, got {c.critic.lr}"),
        (c.kl.coef >= 0 and a.entropy_coef >= 0, "kl_coef and entropy_coef must be >= 0"),
        (a.is_cap is None or a.is_cap > 0, f"is_cap must be > 0, got {a.is_cap}"),
        (0 <= a.gamma <= 1 and 0 <= a.lam <= 1, "gamma and lam must be in [0, 1]"),
    ]


def _check_dynamic_sampling(c: CheckedConfig) -> None:
    """min_outcome_groups and sampling_rounds: fresh rollouts of groups that can differ, a reachable count."""
    if not c.rollout.min_outcome_groups:
        if c.rollout.sampling_rounds > 1:
            raise ConfigError(f"train config: sampling_rounds {c.rollout.sampling_rounds} plays further rounds only "
                              "to reach min_outcome_groups; set min_outcome_groups (or sampling_rounds = 1)")
        return
    if c.data.train_filter:
        raise ConfigError("train config: min_outcome_groups samples more rollouts; a train_filter run trains on "
                          "stored ones and plays none")
    if c.rollout.samples < 2:
        raise ConfigError(f"train config: min_outcome_groups counts groups whose samples' outcomes differ: samples "
                          f"must be >= 2, got {c.rollout.samples}")
    if c.rollout.min_outcome_groups > c.rollout.tasks * c.rollout.sampling_rounds:
        raise ConfigError(f"train config: min_outcome_groups {c.rollout.min_outcome_groups} exceeds the groups "
                          f"{c.rollout.sampling_rounds} rounds of {c.rollout.tasks} tasks can hold; lower it or raise "
                          "sampling_rounds")


def _check_entry_rules(c: CheckedConfig) -> None:
    """Each named entry's own rules on the settings it reads (a loss's hyper-parameters, a KL controller's
    coefficients), as its registry entry declares them (`config_problem`): no entry is named here."""
    for field, registry in named_entries(c).items():
        problem = getattr(registry[c.value(field)], "config_problem", None)
        message = problem(c) if problem is not None else None
        if message:
            raise ConfigError(f"train config: {message}")


def group_filter_of(algo: str, advantage: str | None, group_filter: str | None) -> str:
    """The group filter a run uses: the one given, else the algo's default for an estimator that compares a group's
    samples, and `all` for one that does not (a token-level estimator may play one sample per task)."""
    reg = registries()
    if group_filter:
        return group_filter
    estimator = reg.ADVANTAGES.get(advantage or reg.DEFAULT_ADVANTAGE.get(algo, ""))
    return reg.ALGOS[algo].default_group_filter if estimator is not None and estimator.group_relative else "all"


def _check_group_filter(c: CheckedConfig) -> None:
    """The group filter is registered, and the run has the samples per task it compares (its entry says)."""
    reg = registries()
    name = group_filter_of(c.run.algo, c.algorithm.advantage, c.algorithm.group_filter)
    if name not in reg.GROUP_FILTERS:
        raise ConfigError(f"train config: unknown group_filter {name!r}; valid: {', '.join(reg.GROUP_FILTERS.names())}")
    need = reg.GROUP_FILTERS[name].min_samples
    if reg.ALGOS[c.run.algo].uses_advantages and c.rollout.samples < need:
        raise ConfigError(f"train config: group_filter {name} keeps the groups whose samples' outcomes differ: "
                          f"samples must be >= {need}, got {c.rollout.samples} (or set group_filter = \"all\")")


def _check_advantage(c: CheckedConfig, adv: str) -> None:
    """The estimator fits the algo, as their registry entries say: a critic for exactly the estimators that
    read one."""
    reg = registries()
    algo, estimator = reg.ALGOS[c.run.algo], reg.ADVANTAGES[adv]
    if algo.accepts(estimator):
        return
    if algo.needs_critic:
        critic_ones = [n for n in reg.ADVANTAGES.names() if reg.ADVANTAGES[n].needs_critic]
        others = " or ".join(reg.algos_accepting(estimator)) or "another algo"
        raise ConfigError(f"train config: algo {c.run.algo} trains a critic for advantage {' or '.join(critic_ones)}, "
                          f"got advantage {adv!r}; use algo {others} for critic-free estimators")
    raise ConfigError(f"train config: advantage {adv} needs a critic: use algo "
                      f"{' or '.join(reg.algos_accepting(estimator)) or 'one with needs_critic'}")


def _check_stored_data(c: CheckedConfig) -> None:
    """train_filter's and replay's rules (an RL run's: SFT has no [data] section): one off-policy correction,
    their settings together."""
    if not 0 <= c.data.replay_ratio < 1 or c.data.replay_staleness < 1:
        raise ConfigError(f"train config: replay_ratio must be in [0, 1) and replay_staleness >= 1, got "
                          f"{c.data.replay_ratio} and {c.data.replay_staleness}")
    if c.data.replay_filter is not None and c.data.replay_ratio == 0:
        raise ConfigError("train config: replay_filter narrows what is replayed: set replay_ratio > 0 too")
    if c.data.replay_ratio > 0:
        if c.data.train_filter is not None:
            raise ConfigError("train config: replay_ratio mixes replayed rollouts into fresh ones: not with "
                              "train_filter (every episode is stored already)")
        if not _corrects_off_policy(c):
            raise ConfigError("train config: replay_ratio trains on earlier policies' rollouts: take the ratio "
                              "against their behaviour log-probs with old_logprobs = \"behaviour\", or truncated "
                              "importance weights with is_cap (e.g. 2.0)")
    if c.data.train_snapshot is not None and c.data.train_filter is None:
        raise ConfigError("train config: train_snapshot pins the episodes of train_filter: give train_filter too")
    if c.data.train_filter is None:
        return
    if not c.data.train_filter.strip():
        raise ConfigError("train config: train_filter is empty: give a SQL filter over episodes columns, or "
                          "leave it out to collect fresh rollouts")
    if not _corrects_off_policy(c):
        raise ConfigError("train config: train_filter trains on rollouts other policies played: take the ratio "
                          "against their behaviour log-probs with old_logprobs = \"behaviour\", or truncated "
                          "importance weights with is_cap (e.g. 2.0)")


def _check_async(c: CheckedConfig) -> None:
    """The async collectors' rules: RL on fresh rollouts that the collectors play on their own, corrected for
    the policies that played them."""
    if c.asynchronous.collectors < 0 or c.asynchronous.staleness < 0:
        raise ConfigError(f"train config: async_collectors and async_staleness must be >= 0, got "
                          f"{c.asynchronous.collectors} and {c.asynchronous.staleness}")
    if c.asynchronous.collectors == 0:
        return
    from trajlake.train.task_select import is_query
    clashes = [(c.data.train_filter is not None, "train_filter (the episodes are stored already)"),
               (c.data.replay_ratio > 0, "replay_ratio (every async group is an earlier policy's already)"),
               (c.rollout.sampling_rounds > 1 or c.rollout.min_outcome_groups > 0, "dynamic sampling (sampling_rounds, "
                                                                    "min_outcome_groups)"),
               (c.rollout.replicas > 1, "replicas (each collector is one copy of the policy)"),
               (is_query(c.rollout.task_selector), f"task_selector {c.rollout.task_selector} (the collectors take the "
                                                   "split's blocks in turn)"),
               (c.rollout.horizon_start > 0, "the horizon curriculum (horizon_start)")]
    for clash, what in clashes:
        if clash:
            raise ConfigError(f"train config: async_collectors plays rollouts beside the learner: not with {what}")
    if not _corrects_off_policy(c):
        raise ConfigError("train config: async_collectors trains on rollouts of earlier policies: take the ratio "
                          "against their behaviour log-probs with old_logprobs = \"behaviour\", or truncated "
                          "importance weights with is_cap (e.g. 2.0)")


def _check_horizon(c: CheckedConfig) -> None:
    """The horizon curriculum's rules: it starts within max_turns, and caps rollouts the run collects."""
    reg = registries()
    if c.rollout.horizon_start == 0:
        if c.rollout.horizon_every != 1:
            raise ConfigError("train config: horizon_every paces the horizon curriculum: set horizon_start too "
                              "(the first iteration's turn cap), or leave horizon_every out")
        return
    if c.rollout.horizon_start > c.rollout.max_turns:
        raise ConfigError(f"train config: horizon_start ({c.rollout.horizon_start}) must be at most max_turns "
                          f"({c.rollout.max_turns}), the cap it grows to; lower horizon_start or raise max_turns")
    if _supervised(c) or c.data.train_filter is not None:
        raise ConfigError(f"train config: horizon_start caps the turns of the rollouts {_algos_of(reg.RL_LOOP, 'and')} "
                          f"collect: not with algo {_algos_of(reg.SFT_LOOP, 'or')} or train_filter (no rollouts are "
                          "played); leave it at 0")


def _check_env(c: CheckedConfig) -> None:
    """An env that plays an AgentGym server has its URL wherever episodes are played (SFT without evals
    plays none)."""
    if not _supervised(c) or c.eval.every > 0:
        c.rollout.check_env_url()


def _corrects_off_policy(c: CheckedConfig) -> bool:
    """Whether the ratio corrects for rollouts another policy played: taken against their stored behaviour
    log-probs (a source that is not recomputed), or with truncated importance weights (is_cap)."""
    reg = registries()
    return not reg.OLD_LOGPROB_SOURCES[c.algorithm.old_logprobs].recomputed or c.algorithm.is_cap is not None


def _supervised(c: CheckedConfig) -> bool:
    """Whether the config's algo runs in the SFT loop (trains on stored episodes' tokens, plays no rollouts)."""
    reg = registries()
    return reg.ALGOS[c.run.algo].loop == reg.SFT_LOOP


def _algos_of(loop: str, conjunction: str) -> str:
    """The names of the algos `loop` runs, for a message: "grpo and ppo", "a, b or c"."""
    reg = registries()
    names = [n for n in reg.ALGOS.names() if reg.ALGOS[n].loop == loop]
    return f"{', '.join(names[:-1])} {conjunction} {names[-1]}" if len(names) > 1 else "".join(names)

