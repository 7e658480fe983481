"""The RL math of trajlake's trainer: pure functions on torch tensors, no orchestration.

Everything here works on padded batches of token sequences, shape (B, T) (B sequences, T positions), with a
``mask`` of the same shape that is 1 on **agent** tokens (the tokens the policy sampled, which get a loss)
and 0 on prompt, environment-observation and padding tokens. In a multi-turn episode the agent tokens of
the turns are separated by environment tokens; every estimator here treats the agent tokens of a row as
one sequence in order and skips the masked positions entirely (what is stored there, values, log-probs or
garbage, never changes a result and never gets a gradient). Masks are binary: any non-zero entry is "in".

The package: :mod:`.core` (the registries, their entry types, masked helpers, aggregation, logits helpers),
:mod:`.advantages` (token-level estimators), :mod:`.turns` (turn-level estimators, with :mod:`.turn_math`),
:mod:`.losses` (policy and value losses), :mod:`.kl` (KL estimators, penalty, controllers) and
:mod:`.algorithms` (the algos, which tie a loop to the estimators it accepts). Everything
public is re-exported here: ``import trajlake.train.algos as A``.

Registries (:class:`trajlake.core.registry.Registry`), keyed by name (``REGISTRY[name]`` with an unknown name raises
:class:`UnknownNameError`, a ``KeyError`` and ``ValueError`` whose message lists the valid names):

- :data:`ALGOS`: ``grpo``, ``ppo``, ``sft`` (:mod:`.algorithms`): :class:`Algo` entries saying which loop
  runs each (RL iterations or SFT steps), whether it trains a critic, its default advantage estimator and
  which estimators it accepts.
- :data:`ADVANTAGES`: ``gae``, ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_plus_plus`` (alias
  ``reinforce++``), and the turn-level ``gigpo``, ``turn_reinforce``, ``turn_gae`` of
  :mod:`~trajlake.train.algos.turns`. Each is an :class:`Advantage` entry: the function, whether it reads a
  critic's values (``needs_critic``: gae, turn_gae), whether it compares a group's samples
  (``group_relative``: grpo, dr_grpo, rloo, gigpo), the turn structure it reads (``turn_inputs``) and its
  TrainConfig settings (``params``, passed by ``settings(config)``). All are called with the same
  keyword-only signature (see :func:`compute_gae`) and return ``(advantages, returns)``, both (B, T), zero
  outside the mask.
- :data:`POLICY_LOSSES`: ``ppo_clip`` (alias ``vanilla``), ``dual_clip``, ``gspo``. All take the same
  keyword-only signature and return ``(loss, metrics)``: ``loss`` a scalar already aggregated over the
  mask with ``agg_mode`` (see :func:`aggregate`), ``metrics`` a dict of detached 0-dim tensors.
- :data:`VALUE_LOSSES`: ``clipped`` (:func:`value_loss`), ``mse``. Same return convention.
- :data:`KL_ESTIMATORS`: ``k1`` (``kl``), ``k2`` (``mse``), ``k3`` (``low_var_kl``), ``abs``:
  elementwise (B, T) estimates of KL(pi || ref) from tokens sampled from pi.
- :data:`AGG_MODES`: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
  ``seq-mean-token-sum-norm``: (B, T) loss matrix + mask -> scalar.
- :data:`GROUP_FILTERS`: ``outcome_differs``, ``all`` (:mod:`.groups`): which groups' advantages an update
  keeps (only those whose samples' success differs, or every one).
- :data:`KL_CONTROLLERS`: ``fixed`` (:class:`FixedKLController`), ``adaptive`` (:class:`AdaptiveKLController`).
- :data:`KL_PLACEMENTS` (``kl_mode``): ``loss``, ``reward``; :data:`OLD_LOGPROB_SOURCES` (``old_logprobs``):
  ``recompute``, ``behaviour``. Entries say what they are (``in_rewards``, ``recomputed``); the update reads that.

Helpers: :func:`masked_sum`, :func:`masked_mean`, :func:`masked_var`, :func:`masked_whiten`,
:func:`entropy_from_logits`, :func:`log_probs_from_logits`, :func:`kl_penalty`, :func:`apply_kl_penalty`.

Design: a policy loss computes a (B, T) loss matrix (zero outside the mask) and aggregates it itself. Losses
are registered as :class:`~.core.Loss` entries that declare the TrainConfig fields they read (``params``) and
which of their metrics are shares of the mini-batch's loss (``summed``), so the trainer writes
``loss_fn = POLICY_LOSSES[name]; loss_fn(log_probs=..., old_log_probs=..., advantages=..., mask=...,
agg_mode=cfg.optim.agg_mode, **loss_fn.settings(cfg))``; the entropy bonus and a KL loss are aggregated with the
same :func:`aggregate` and ``agg_mode``. For gradient accumulation over micro-batches pass ``denominator``:
``AGG_MODES[mode].count(mask)`` of the whole mini-batch (its tokens or its sequences, as the mode says), so
the micro-batch losses add up to the mini-batch loss. KL controllers share one interface
(``from_settings``, ``value``, ``update``, ``state_dict``).

Conventions follow verl's ``trainer/ppo/core_algos.py`` (loss = minus the surrogate; ratio from log-prob
differences clamped to [-20, 20]; clip fraction = share of tokens where the clipped term is the active one),
written afresh; multi-turn masking is done by skipping rather than by resetting.
"""

from __future__ import annotations

from trajlake.core.registry import UnknownNameError
from trajlake.train.algos import turns
from trajlake.train.algos.advantages import (
    compute_advantages,
    compute_dr_grpo,
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
    group_index,
)
from trajlake.train.algos.algorithms import ALGOS, RL_LOOP, SFT_LOOP, Algo, register_algo
from trajlake.train.algos.core import (
    ADVANTAGES,
    AGG_MODES,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    KL_PLACEMENTS,
    LOG_RATIO_CLAMP,
    OLD_LOGPROB_SOURCES,
    POLICY_LOSSES,
    VALUE_LOSSES,
    Advantage,
    Registry,
    aggregate,
    entropy_from_logits,
    entropy_metric,
    log_probs_and_logsumexp,
    log_probs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    register_advantage,
)
from trajlake.train.algos.groups import GROUP_FILTERS, GroupFilter, outcome_groups, register_group_filter
from trajlake.train.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
    make_kl_controller,
)
from trajlake.train.algos.losses import (
    compute_policy_loss,
    dual_clip_loss,
    gspo_loss,
    mse_value_loss,
    ppo_clip_loss,
    value_loss,
)
from trajlake.train.algos.turns import compute_gigpo, compute_turn_gae, compute_turn_reinforce

__all__ = [
    "Registry", "UnknownNameError", "LOG_RATIO_CLAMP",
    "ALGOS", "Algo", "register_algo", "RL_LOOP", "SFT_LOOP", "Advantage", "register_advantage",
    "GROUP_FILTERS", "GroupFilter", "outcome_groups", "register_group_filter",
    "ADVANTAGES", "POLICY_LOSSES", "VALUE_LOSSES", "KL_ESTIMATORS", "AGG_MODES", "KL_CONTROLLERS", "KL_PLACEMENTS",
    "OLD_LOGPROB_SOURCES",
    "masked_sum", "masked_mean", "masked_var", "masked_whiten", "aggregate",
    "compute_gae", "compute_grpo", "compute_dr_grpo", "compute_rloo", "compute_reinforce_plus_plus",
    "compute_advantages", "group_index", "compute_gigpo", "compute_turn_reinforce", "compute_turn_gae",
    "ppo_clip_loss", "dual_clip_loss", "gspo_loss", "compute_policy_loss",
    "value_loss", "mse_value_loss",
    "kl_k1", "kl_k2", "kl_k3", "kl_abs", "kl_penalty", "apply_kl_penalty",
    "FixedKLController", "AdaptiveKLController", "make_kl_controller",
    "entropy_from_logits", "entropy_metric", "log_probs_and_logsumexp", "log_probs_from_logits", "turns",
]
