"""The update's sections of TrainConfig (train/config_sections.py has the others): advantages and the policy
loss, the KL anchor, PPO's critic, and the optimizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trajlake.core.config_types import added_later, operational, setting
from trajlake.train.config_sections import Section


@dataclass(frozen=True, kw_only=True)
class AlgorithmSection(Section):
    """[algorithm]: advantages, the policy loss and what it keeps."""

    key: ClassVar[str] = "algorithm"

    advantage: str | None = setting(None, help=(
        "Advantage estimator (train.algos.ADVANTAGES); None: grpo for grpo, gae for ppo."))
    policy_loss: str = setting("ppo_clip", help="Policy loss (train.algos.POLICY_LOSSES): ppo_clip, dual_clip, gspo.")
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
    old_logprobs: str = setting("recompute", help=(
        "recompute: pi_old is recomputed by the actor before the epochs; behaviour: the stored sampling log-probs "
        "are pi_old (no extra forward; the ratio is then an importance weight pi / mu)."))
    is_cap: float | None = setting(None, help=(
        "With recompute: truncated importance weights min(pi_old / mu, is_cap) from the stored behaviour log-probs "
        "(off-policy correction of replayed or mismatched rollouts); None: off."))


@dataclass(frozen=True, kw_only=True)
class KLSection(Section):
    """[kl]: the KL anchor to the starting policy."""

    key: ClassVar[str] = "kl"
    flat_names: ClassVar[dict[str, str]] = {name: f"kl_{name}" for name in
                                            ("coef", "estimator", "mode", "controller", "target", "horizon")}

    coef: float = setting(0.001, help=(
        "KL(pi || ref) weight, an anchor to the starting policy; > 0 loads a frozen reference model (the starting "
        "model) and costs one more forward pass per sequence. 0.001 with k3 is verl's GRPO setting (verl-agent's "
        "GiGPO uses 0.01); 0 turns the anchor off."))
    estimator: str = setting("k3", help="KL estimator (train.algos.KL_ESTIMATORS): k1, k2, k3, abs.")
    mode: str = setting("loss", help=(
        "`loss`: a KL term in the loss (GRPO); `reward`: a per-token penalty on the rewards (PPO-RLHF)."))
    controller: str = setting("fixed", help="fixed or adaptive (then kl_target and kl_horizon are needed).")
    target: float | None = setting(None, help="Adaptive controller: the KL it steers to.")
    horizon: float | None = setting(None, help="Adaptive controller: horizon in sequences.")


@dataclass(frozen=True, kw_only=True)
class CriticSection(Section):
    """[critic]: PPO's value model."""

    key: ClassVar[str] = "critic"
    flat_names: ClassVar[dict[str, str]] = {"lr": "critic_lr", "warmup": "critic_warmup"}

    value_loss: str = setting("clipped", help="ppo: value loss (train.algos.VALUE_LOSSES): clipped, mse.")
    value_clip: float = setting(0.5, help="ppo: clip range of the clipped value loss.")
    lr: float = setting(1e-5, help="ppo: learning rate of the critic.")
    warmup: int = setting(0, help="ppo: iterations that train only the critic.")


@dataclass(frozen=True, kw_only=True)
class OptimSection(Section):
    """[optim]: the optimizer, the batches it steps on, and how a batch's loss is aggregated."""

    key: ClassVar[str] = "optim"

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
    agg_mode: str = setting("token-mean", help=(
        "Loss aggregation (train.algos.AGG_MODES) for the policy, entropy, KL and value losses."))
    loss_norm_constant: float | None = setting(None, help=(
        "Constant of agg_mode seq-mean-token-sum-norm; None: max_new_tokens * max_turns."))


__all__ = ["AlgorithmSection", "KLSection", "CriticSection", "OptimSection"]
