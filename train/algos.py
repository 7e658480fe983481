"""The RL math of trajlake's trainer: pure functions on torch tensors, no orchestration.

Everything here works on padded batches of token sequences, shape (B, T) (B sequences, T positions), with a
``mask`` of the same shape that is 1 on **agent** tokens (the tokens the policy sampled, which get a loss)
and 0 on prompt, environment-observation and padding tokens. In a multi-turn episode the agent tokens of
the turns are separated by environment tokens; every estimator here treats the agent tokens of a row as
one sequence in order and skips the masked positions entirely (what is stored there, values, log-probs or
garbage, never changes a result and never gets a gradient). Masks are binary: any non-zero entry is "in".

Registries, keyed by name (``REGISTRY[name]`` with an unknown name raises :class:`UnknownNameError`, a
``KeyError`` and ``ValueError`` whose message lists the valid names):

- :data:`ADVANTAGES`: ``gae``, ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_plus_plus`` (alias
  ``reinforce++``), and the turn-level ``gigpo``, ``turn_reinforce``, ``turn_gae`` of
  :mod:`~trajlake.train.algos_turns` (which also read the turn structure: ``turn_index`` and more, see
  its ``TURN_INPUTS``). All take the same keyword-only signature (see :func:`compute_gae`) and return
  ``(advantages, returns)``, both (B, T), zero outside the mask.
- :data:`POLICY_LOSSES`: ``ppo_clip`` (alias ``vanilla``), ``dual_clip``, ``gspo``. All take the same
  keyword-only signature and return ``(loss, metrics)``: ``loss`` a scalar already aggregated over the
  mask with ``agg_mode`` (see :func:`aggregate`), ``metrics`` a dict of detached 0-dim tensors.
- :data:`VALUE_LOSSES`: ``clipped`` (:func:`value_loss`), ``mse``. Same return convention.
- :data:`KL_ESTIMATORS`: ``k1`` (``kl``), ``k2`` (``mse``), ``k3`` (``low_var_kl``), ``abs``:
  elementwise (B, T) estimates of KL(pi || ref) from tokens sampled from pi.
- :data:`AGG_MODES`: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
  ``seq-mean-token-sum-norm``: (B, T) loss matrix + mask -> scalar.
- :data:`KL_CONTROLLERS`: ``fixed`` (:class:`FixedKLController`), ``adaptive`` (:class:`AdaptiveKLController`).

Helpers: :func:`masked_sum`, :func:`masked_mean`, :func:`masked_var`, :func:`masked_whiten`,
:func:`entropy_from_logits`, :func:`log_probs_from_logits`, :func:`kl_penalty`, :func:`apply_kl_penalty`.

Design: a policy loss computes a (B, T) loss matrix (zero outside the mask) and aggregates it itself, so the
trainer writes ``loss, m = POLICY_LOSSES[name](log_probs=..., old_log_probs=..., advantages=..., mask=...,
agg_mode=cfg.agg_mode, **cfg.loss_kwargs)``; the entropy bonus and a KL loss are aggregated with the same
:func:`aggregate` and ``agg_mode``. For gradient accumulation over micro-batches pass ``denominator`` (the
token or sequence count of the whole mini-batch) so the micro-batch losses add up to the mini-batch loss.

Conventions follow verl's ``trainer/ppo/core_algos.py`` (loss = minus the surrogate; ratio from log-prob
differences clamped to [-20, 20]; clip fraction = share of tokens where the clipped term is the active one),
written afresh; multi-turn masking is done by skipping rather than by resetting.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch

from trajlake.registry import Registry, UnknownNameError

__all__ = [
    "Registry", "UnknownNameError",
    "ADVANTAGES", "POLICY_LOSSES", "VALUE_LOSSES", "KL_ESTIMATORS", "AGG_MODES", "KL_CONTROLLERS",
    "masked_sum", "masked_mean", "masked_var", "masked_whiten", "aggregate",
    "compute_gae", "compute_grpo", "compute_dr_grpo", "compute_rloo", "compute_reinforce_plus_plus",
    "compute_advantages", "group_index",
    "ppo_clip_loss", "dual_clip_loss", "gspo_loss", "compute_policy_loss",
    "value_loss", "mse_value_loss",
    "kl_k1", "kl_k2", "kl_k3", "kl_abs", "kl_penalty", "apply_kl_penalty",
    "FixedKLController", "AdaptiveKLController", "make_kl_controller",
    "entropy_from_logits", "log_probs_from_logits",
    "algos_turns",
]

#: Log-ratios are clamped to this before exp(), as verl does, so a wild token cannot overflow the ratio.
LOG_RATIO_CLAMP = 20.0


# ----------------------------------------------------------------------------------------------- registries


ADVANTAGES = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
VALUE_LOSSES = Registry("value loss")
KL_ESTIMATORS = Registry("KL estimator")
AGG_MODES = Registry("loss aggregation mode")
KL_CONTROLLERS = Registry("KL controller")


# ------------------------------------------------------------------------------------------------- helpers


def _float_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype results are computed in: the inputs' floating dtype, at least float32."""
    dt = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dt = torch.promote_types(dt, t.dtype)
    return dt


def _bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over the positions where ``mask`` is non-zero.

    x, mask: same shape, e.g. (B, T). ``dim`` None sums everything (0-dim result); else that dim only.
    Values outside the mask (even NaN/inf) are ignored and get no gradient.
    """
    xm = torch.where(_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the masked-in positions; 0 where there are none.

    x, mask: same shape, e.g. (B, T). ``dim`` None: 0-dim result; ``dim=-1``: shape (B,).
    """
    count = _bool(mask).sum() if dim is None else _bool(mask).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype if x.is_floating_point() else torch.float32)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked-in positions (0-dim). Bessel-corrected when ``unbiased`` and n > 1;
    0 when fewer than 2 positions are in (unbiased) or none (biased).

    x, mask: same shape, e.g. (B, T).
    """
    n = _bool(mask).sum()
    mean = masked_mean(x, mask)
    sq = masked_sum((x - mean) ** 2, mask)
    if unbiased:
        return torch.where(n > 1, sq / (n - 1).clamp(min=1), torch.zeros_like(sq))
    return sq / n.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Whiten ``x`` with the mean and (unbiased) variance of its masked-in positions; zero outside the mask.

    x, mask: shape (B, T) (any shape works; statistics are over all masked-in entries). Returns the same
    shape: ``(x - mean) / sqrt(var + eps)``, with the mean added back when ``shift_mean`` is False.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(_bool(mask), out, torch.zeros((), dtype=out.dtype, device=out.device))


# -------------------------------------------------------------------------------------------- aggregation


def _seq_count(mask: torch.Tensor) -> torch.Tensor:
    """Number of sequences (rows) with at least one agent token; mask (B, T) -> 0-dim."""
    return (_bool(mask).sum(-1) > 0).sum()


def _div(num: torch.Tensor, den: torch.Tensor | float) -> torch.Tensor:
    if isinstance(den, torch.Tensor):
        return num / den.clamp(min=1).to(num.dtype)
    return num / max(float(den), 1e-12)


@AGG_MODES.register("token-mean")
def agg_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                   norm_constant: float | None = None) -> torch.Tensor:
    """Sum over every masked-in token of the batch / number of masked-in tokens (or ``denominator``).

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor (0 when the mask is empty). Long sequences weigh
    more (each token counts once): DAPO's token-level loss, verl's default.
    """
    return _div(masked_sum(loss_mat, mask), _bool(mask).sum() if denominator is None else denominator)


@AGG_MODES.register("seq-mean-token-sum")
def agg_seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                           norm_constant: float | None = None) -> torch.Tensor:
    """Per-sequence sum over its tokens, then the mean over sequences.

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor. Sequences with no agent token are not counted;
    ``denominator`` replaces the number of sequences.
    """
    seq = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    return _div(seq.sum(), _seq_count(mask) if denominator is None else denominator)


@AGG_MODES.register("seq-mean-token-mean")
def agg_seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                            norm_constant: float | None = None) -> torch.Tensor:
    """Per-sequence mean over its tokens, then the mean over sequences (original GRPO; GSPO).

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor. Sequences with no agent token are not counted;
    ``denominator`` replaces the number of sequences.
    """
    seq = masked_mean(loss_mat, mask, dim=-1)  # (B,)
    return _div(seq.sum(), _seq_count(mask) if denominator is None else denominator)


@AGG_MODES.register("seq-mean-token-sum-norm")
def agg_seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                                norm_constant: float | None = None) -> torch.Tensor:
    """Dr. GRPO's aggregation: per-sequence token sum divided by a constant, mean over sequences.

    loss_mat, mask: shape (B, T). ``norm_constant`` (default T, the padded length; Dr. GRPO uses the
    maximum generation length) is the same for every sequence, so no length bias. Returns a 0-dim tensor;
    ``denominator`` replaces the number of sequences.
    """
    c = float(loss_mat.shape[-1] if norm_constant is None else norm_constant)
    return agg_seq_mean_token_sum(loss_mat, mask, denominator) / c


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *,
              denominator: float | None = None, norm_constant: float | None = None) -> torch.Tensor:
    """Reduce a (B, T) loss matrix over the mask to a scalar with the aggregation mode ``mode``.

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor. Entries outside the mask are ignored (even NaN)
    and get no gradient. ``denominator``: token count (token-mean) or sequence count (seq-mean-*) to divide
    by instead of this batch's, for gradient accumulation. ``norm_constant``: the constant of
    ``seq-mean-token-sum-norm``. Modes: see :data:`AGG_MODES`.
    """
    return AGG_MODES[mode](loss_mat, mask, denominator=denominator, norm_constant=norm_constant)


# --------------------------------------------------------------------------------------------- advantages
#
# Every estimator has the same keyword-only signature, so the trainer calls
# ADVANTAGES[name](**kwargs) with one dict; each documents which arguments it reads. Unused ones are ignored.


def _zero_outside(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


@torch.no_grad()
def _masked_discounted_scan(rewards: torch.Tensor, values: torch.Tensor | None, mask: torch.Tensor,
                            gamma: float, lam: float) -> torch.Tensor:
    """GAE over the masked-in positions of each row, skipping masked-out ones: (B, T) -> (B, T).

    With values None (all zero) and lam=1 this is the discounted return-to-go over agent tokens.
    Loop over T with vector ops over B: for each position, going backwards, the "next" value and advantage
    are those of the next agent token of the row; masked-out positions leave them untouched.
    """
    B, T = rewards.shape
    m = _bool(mask)
    zero = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    next_value, next_adv = zero, zero
    out = torch.zeros_like(rewards)
    gl = gamma * lam
    for t in range(T - 1, -1, -1):
        mt = m[:, t]
        v = zero if values is None else values[:, t]
        delta = rewards[:, t] + gamma * next_value - v
        adv = delta + gl * next_adv
        adv = torch.where(mt, adv, next_adv)
        out[:, t] = adv
        next_adv = adv
        if values is not None:
            next_value = torch.where(mt, v, next_value)
    return _zero_outside(out, m)


@ADVANTAGES.register("gae")
def compute_gae(*, token_level_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None,
                group_ids: Sequence[Hashable] | torch.Tensor | None = None, scores: torch.Tensor | None = None,
                gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6, whiten: bool = False,
                norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over agent tokens (PPO with a critic).

    Reads: ``token_level_rewards`` (B, T), ``values`` (B, T) (required), ``mask`` (B, T), ``gamma``, ``lam``,
    ``whiten``. Ignores group_ids, scores, eps, norm_by_std.

    For each row with agent positions t_1 < ... < t_n (mask == 1), in that order:
    ``delta_k = r[t_k] + gamma * V[t_{k+1}] - V[t_k]`` (V after the last agent token = 0),
    ``A_k = delta_k + gamma * lam * A_{k+1}``. Environment/prompt/padding tokens between turns are skipped
    entirely: they neither carry nor break the recursion, and rewards and values stored at them are ignored
    (reward allocation puts rewards on agent tokens).

    Returns ``(advantages, returns)``, shape (B, T), zero outside the mask; ``returns = A + V`` (before
    whitening); with ``whiten`` the advantages are whitened over all masked-in tokens of the batch.
    """
    if values is None:
        raise ValueError("gae needs values (the critic's per-token value estimates)")
    dt = _float_dtype(token_level_rewards, values)
    r, v = token_level_rewards.detach().to(dt), values.detach().to(dt)
    adv = _masked_discounted_scan(r, v, mask, gamma, lam)
    returns = _zero_outside(adv + v, mask)
    if whiten:
        adv = masked_whiten(adv, mask)
    return adv, returns


@ADVANTAGES.register("reinforce_plus_plus", "reinforce++")
def compute_reinforce_plus_plus(*, token_level_rewards: torch.Tensor, mask: torch.Tensor,
                                values: torch.Tensor | None = None,
                                group_ids: Sequence[Hashable] | torch.Tensor | None = None,
                                scores: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                                eps: float = 1e-6, whiten: bool = True,
                                norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go over agent tokens, whitened over the whole batch.

    Reads: ``token_level_rewards`` (B, T), ``mask`` (B, T), ``gamma``. Ignores values, group_ids, scores,
    lam, eps, whiten, norm_by_std (whitening is part of the estimator).

    ``G[t_k] = r[t_k] + gamma * G[t_{k+1}]`` over each row's agent positions in order (masked positions
    skipped, as in :func:`compute_gae`); advantages = ``masked_whiten(G, mask)`` over the batch.
    Returns ``(advantages, returns)``, shape (B, T), zero outside the mask; returns = G (unwhitened).
    """
    dt = _float_dtype(token_level_rewards)
    r = token_level_rewards.detach().to(dt)
    returns = _masked_discounted_scan(r, None, mask, gamma, 1.0)
    adv = masked_whiten(returns, mask)
    return adv, returns


def group_index(group_ids: Sequence[Hashable] | torch.Tensor | Iterable[Hashable], device=None) -> torch.Tensor:
    """Map group ids (any hashables, ints, a tensor or numpy array, length B) to dense ints 0..G-1, shape (B,).

    Groups are numbered in order of first appearance.
    """
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.tolist()
    elif hasattr(group_ids, "tolist"):  # numpy
        group_ids = group_ids.tolist()
    seen: dict[Hashable, int] = {}
    idx = [seen.setdefault(g if not isinstance(g, list) else tuple(g), len(seen)) for g in group_ids]
    return torch.tensor(idx, dtype=torch.long, device=device)


def _outcome_scores(token_level_rewards: torch.Tensor, mask: torch.Tensor,
                    scores: torch.Tensor | None) -> torch.Tensor:
    """Outcome score per sequence, shape (B,): ``scores`` if given, else the masked sum of token rewards."""
    if scores is not None:
        s = torch.as_tensor(scores, device=token_level_rewards.device)
        if s.dim() != 1 or s.shape[0] != token_level_rewards.shape[0]:
            raise ValueError(f"scores must have shape (B,) = ({token_level_rewards.shape[0]},), got {tuple(s.shape)}")
        return s.detach().to(torch.float64)
    return masked_sum(token_level_rewards.detach().to(torch.float64), mask, dim=-1)


def _group_stats(s: torch.Tensor, group_ids) -> tuple[torch.Tensor, ...]:
    """For scores s (B,) float64 and group ids: per-row (B,) group count, mean, unbiased std, constant flag."""
    if group_ids is None:
        raise ValueError("this estimator needs group_ids (shape (B,): the group, e.g. task, of each sequence)")
    idx = group_index(group_ids, device=s.device)
    if idx.shape[0] != s.shape[0]:
        raise ValueError(f"group_ids has {idx.shape[0]} entries for a batch of {s.shape[0]}")
    G = int(idx.max()) + 1 if idx.numel() else 0
    count = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, idx, torch.ones_like(s))
    total = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, idx, s)
    mean = total / count
    sq = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, idx, (s - mean[idx]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    hi = torch.full((G,), -math.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, idx, s, "amax")
    lo = torch.full((G,), math.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, idx, s, "amin")
    const = hi == lo  # a group of identical scores (incl. size 1): advantage exactly 0, no rounding noise
    return count[idx], total[idx], mean[idx], std[idx], const[idx]


def _broadcast(seq_adv: torch.Tensor, token_level_rewards: torch.Tensor, mask: torch.Tensor):
    dt = _float_dtype(token_level_rewards)
    adv = _zero_outside(seq_adv.to(dt).unsqueeze(-1).expand_as(token_level_rewards), mask).contiguous()
    return adv, adv.clone()


@ADVANTAGES.register("grpo")
def compute_grpo(*, token_level_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None,
                 group_ids: Sequence[Hashable] | torch.Tensor | None = None, scores: torch.Tensor | None = None,
                 gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6, whiten: bool = False,
                 norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantages: ``(score - group mean) / (group std + eps)`` broadcast over agent tokens.

    Reads: ``token_level_rewards`` (B, T) and ``mask`` (B, T) (the score of a sequence is the masked sum of
    its token rewards unless ``scores`` (B,) is given), ``group_ids`` (B,) (required; any hashables),
    ``eps``, ``norm_by_std`` (False: no division by the std, as Dr. GRPO). Ignores values, gamma, lam,
    whiten. The std is the unbiased (Bessel) std of the group, as torch.std.

    A group of size 1, or whose scores are all equal, gets advantage exactly 0.
    Returns ``(advantages, returns)``, shape (B, T), zero outside the mask; returns = advantages (no critic).
    Statistics are computed in float64.
    """
    s = _outcome_scores(token_level_rewards, mask, scores)
    _, _, mean, std, const = _group_stats(s, group_ids)
    a = s - mean
    if norm_by_std:
        a = a / (std + eps)
    a = torch.where(const, torch.zeros_like(a), a)
    return _broadcast(a, token_level_rewards, mask)


@ADVANTAGES.register("dr_grpo")
def compute_dr_grpo(*, token_level_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None,
                    group_ids: Sequence[Hashable] | torch.Tensor | None = None, scores: torch.Tensor | None = None,
                    gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6, whiten: bool = False,
                    norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO ("GRPO done right"): ``score - group mean``, no division by the group std.

    Reads: ``token_level_rewards``/``scores``, ``mask``, ``group_ids`` as :func:`compute_grpo`. Ignores
    ``norm_by_std`` (always off) and values, gamma, lam, eps, whiten.

    Dr. GRPO also drops GRPO's per-sequence length normalisation: that lives in the loss aggregation, so
    pair this estimator with ``agg_mode="seq-mean-token-sum-norm"`` (per-sequence token sum divided by a
    constant such as the maximum generation length) or ``"seq-mean-token-sum"``, not
    ``"seq-mean-token-mean"``. Returns ``(advantages, returns)``, (B, T), zero outside the mask.
    """
    return compute_grpo(token_level_rewards=token_level_rewards, mask=mask, group_ids=group_ids, scores=scores,
                        eps=eps, norm_by_std=False)


@ADVANTAGES.register("rloo")
def compute_rloo(*, token_level_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None,
                 group_ids: Sequence[Hashable] | torch.Tensor | None = None, scores: torch.Tensor | None = None,
                 gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6, whiten: bool = False,
                 norm_by_std: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: each sequence's score minus the mean score of the *other* sequences of its group.

    Reads: ``token_level_rewards``/``scores``, ``mask``, ``group_ids`` (required) as :func:`compute_grpo`.
    Ignores values, gamma, lam, eps, whiten, norm_by_std.

    ``A_i = s_i - (sum_group - s_i) / (n - 1)`` (= n/(n-1) * (s_i - mean)); a group of size 1 or of equal
    scores gets exactly 0. Returns ``(advantages, returns)``, (B, T), zero outside the mask; returns = A.
    """
    s = _outcome_scores(token_level_rewards, mask, scores)
    count, total, _, _, const = _group_stats(s, group_ids)
    a = s - (total - s) / (count - 1).clamp(min=1)
    a = torch.where(const | (count < 2), torch.zeros_like(a), a)
    return _broadcast(a, token_level_rewards, mask)


def compute_advantages(name: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """``ADVANTAGES[name](**kwargs)``: (advantages, returns), each (B, T)."""
    return ADVANTAGES[name](**kwargs)


# ------------------------------------------------------------------------------------------ policy losses
#
# Every policy loss has the same keyword-only signature and returns (loss, metrics): loss is a 0-dim
# tensor, the (B, T) loss matrix aggregated over the mask with `agg_mode`; metrics are detached 0-dim
# tensors (pg_loss, pg_clipfrac, ppo_kl, ratio_mean, ...). Masked-out positions never get a gradient.


def _log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_old on agent tokens (clamped to +-20), exactly 0 (and no gradient) elsewhere. (B, T)"""
    lr = (log_probs - old_log_probs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return _zero_outside(lr, mask)


def _finish(loss_mat, mask, agg_mode, is_weights, denominator, norm_constant, metrics, clipped, log_ratio):
    """Apply importance weights, zero outside the mask, aggregate; fill the common metrics."""
    if is_weights is not None:
        loss_mat = loss_mat * _zero_outside(is_weights.detach().to(loss_mat.dtype), mask)
    loss_mat = _zero_outside(loss_mat, mask)
    loss = aggregate(loss_mat, mask, agg_mode, denominator=denominator, norm_constant=norm_constant)
    with torch.no_grad():
        metrics.update({
            "pg_loss": loss.detach(),
            "pg_clipfrac": masked_mean(clipped.float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),  # k1 estimate of KL(old || new) on old's samples
        })
    return loss, metrics


@POLICY_LOSSES.register("ppo_clip", "vanilla")
def ppo_clip_loss(*, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, agg_mode: str = "token-mean", clip_low: float = 0.2,
                  clip_high: float = 0.2, clip_c: float = 3.0, is_weights: torch.Tensor | None = None,
                  denominator: float | None = None,
                  norm_constant: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with separate lower and upper clip ranges (DAPO's clip-higher: 0.2 / 0.28).

    Inputs, shape (B, T): ``log_probs`` (current policy, with grad), ``old_log_probs`` (the policy that
    produced the advantages; detached), ``advantages``, ``mask``. Optional ``is_weights`` (B, T): detached
    per-token importance weights multiplying the loss (off-policy replay, e.g. truncated pi_old/pi_behaviour).
    Ignores ``clip_c``.

    ``ratio = exp(log_probs - old_log_probs)``;
    ``loss_t = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``, aggregated with ``agg_mode``.
    Returns ``(loss, metrics)``: loss 0-dim; metrics pg_loss, pg_clipfrac (share of agent tokens where the
    clipped term is active, i.e. strictly larger), ppo_kl, ratio_mean.
    """
    lr = _log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(lr)
    adv = _zero_outside(advantages.detach().to(ratio.dtype), mask)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(l1, l2)
    metrics = {"ratio_mean": masked_mean(ratio.detach(), mask)}
    return _finish(loss_mat, mask, agg_mode, is_weights, denominator, norm_constant, metrics, l2 > l1, lr.detach())


@POLICY_LOSSES.register("dual_clip")
def dual_clip_loss(*, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, agg_mode: str = "token-mean", clip_low: float = 0.2,
                   clip_high: float = 0.2, clip_c: float = 3.0, is_weights: torch.Tensor | None = None,
                   denominator: float | None = None,
                   norm_constant: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dual-clip PPO (Ye et al. 2020): PPO clip, and for negative advantages the loss is bounded by -c * A.

    Inputs as :func:`ppo_clip_loss`, shape (B, T); ``clip_c`` > 1 (default 3).
    ``loss_t = max(-A r, -A clip(r))`` for A >= 0, ``min(max(-A r, -A clip(r)), -c A)`` for A < 0: a token
    whose ratio has grown huge under a negative advantage gives a bounded loss and no gradient.
    Returns ``(loss, metrics)``; metrics add pg_clipfrac_lower (share of agent tokens hitting the -c A bound).
    """
    if clip_c <= 1.0:
        raise ValueError(f"dual_clip needs clip_c > 1, got {clip_c}")
    lr = _log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(lr)
    adv = _zero_outside(advantages.detach().to(ratio.dtype), mask)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clip1 = torch.maximum(l1, l2)
    l3 = -adv * clip_c
    neg = adv < 0
    loss_mat = torch.where(neg, torch.minimum(clip1, l3), clip1)
    metrics = {
        "ratio_mean": masked_mean(ratio.detach(), mask),
        "pg_clipfrac_lower": masked_mean((neg & (clip1 > l3)).float(), mask),
    }
    return _finish(loss_mat, mask, agg_mode, is_weights, denominator, norm_constant, metrics, l2 > l1, lr.detach())


@POLICY_LOSSES.register("gspo")
def gspo_loss(*, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, agg_mode: str = "seq-mean-token-mean", clip_low: float = 3e-4,
              clip_high: float = 4e-4, clip_c: float = 3.0, is_weights: torch.Tensor | None = None,
              denominator: float | None = None,
              norm_constant: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025): sequence-level importance ratio, clipped per sequence.

    Inputs as :func:`ppo_clip_loss`, shape (B, T); ``advantages`` are normally constant over a sequence
    (GRPO's). Ignores ``clip_c``. Defaults: the paper's clip ranges (3e-4, 4e-4) and its aggregation,
    ``seq-mean-token-mean``, with which the gradient equals GSPO's
    ``-A_i s_i (1/|y_i|) sum_t grad log pi(y_t)``.

    ``s_i = exp(mean over the agent tokens of sequence i of (log pi - log pi_old))``; the token form
    ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` has the value s_i at every token of the sequence (so the
    clip ``clip(s, 1 - clip_low, 1 + clip_high)`` acts on whole sequences) and gradient s_i * grad log pi(y_t).
    ``loss_t = max(-A s_{i,t}, -A clip(s_{i,t}))``. Returns ``(loss, metrics)``; pg_clipfrac is the share of
    agent tokens in clipped sequences; metrics add seq_ratio_mean (mean of s_i over non-empty sequences).
    """
    lr = _log_ratio(log_probs, old_log_probs, mask)
    m = _bool(mask)
    seq_lr = masked_mean(lr, m, dim=-1)  # (B,)
    tok = _zero_outside(log_probs - log_probs.detach(), m)  # 0 in value, d/dlog_probs = 1 on agent tokens
    log_s = (seq_lr.detach().unsqueeze(-1) + tok).clamp(max=10.0)
    s = torch.exp(log_s)
    adv = _zero_outside(advantages.detach().to(s.dtype), mask)
    l1 = -adv * s
    l2 = -adv * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(l1, l2)
    nonempty = m.any(-1)
    metrics = {"seq_ratio_mean": masked_mean(torch.exp(seq_lr.detach()), nonempty)}
    return _finish(loss_mat, mask, agg_mode, is_weights, denominator, norm_constant, metrics, l2 > l1, lr.detach())


def compute_policy_loss(name: str, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``POLICY_LOSSES[name](**kwargs)``: (scalar loss, metrics)."""
    return POLICY_LOSSES[name](**kwargs)


# ----------------------------------------------------------------------------------------------- value loss


@VALUE_LOSSES.register("clipped")
def value_loss(*, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_eps: float = 0.5, agg_mode: str = "token-mean", denominator: float | None = None,
               norm_constant: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO/verl): ``0.5 * max((v - R)^2, (clip(v, v_old - eps, v_old + eps) - R)^2)``.

    Inputs, shape (B, T): ``values`` (current critic, with grad), ``old_values`` (critic at rollout time),
    ``returns`` (targets R, e.g. from :func:`compute_gae`), ``mask``. ``clip_eps`` (verl's cliprange_value,
    default 0.5). Aggregated over the mask with ``agg_mode``.
    Returns ``(loss, metrics)``: loss 0-dim; metrics vf_loss, vf_clipfrac (share of agent tokens where the
    clipped term is strictly larger), vpred_mean.
    """
    v_old, R = old_values.detach(), returns.detach()
    v_clip = torch.maximum(torch.minimum(values, v_old + clip_eps), v_old - clip_eps)
    l1 = (values - R) ** 2
    l2 = (v_clip - R) ** 2
    loss_mat = _zero_outside(0.5 * torch.maximum(l1, l2), mask)
    loss = aggregate(loss_mat, mask, agg_mode, denominator=denominator, norm_constant=norm_constant)
    with torch.no_grad():
        metrics = {"vf_loss": loss.detach(), "vf_clipfrac": masked_mean((l2 > l1).float(), mask),
                   "vpred_mean": masked_mean(values.detach(), mask)}
    return loss, metrics


@VALUE_LOSSES.register("mse")
def mse_value_loss(*, values: torch.Tensor, old_values: torch.Tensor | None = None, returns: torch.Tensor,
                   mask: torch.Tensor, clip_eps: float = 0.5, agg_mode: str = "token-mean",
                   denominator: float | None = None,
                   norm_constant: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Unclipped value loss ``0.5 * (v - R)^2`` over the mask (OpenManus-RL's seed critic, up to the 0.5).

    Inputs, shape (B, T): values, returns, mask; old_values and clip_eps are ignored.
    Returns ``(loss, metrics)`` as :func:`value_loss` (vf_clipfrac is 0).
    """
    loss_mat = _zero_outside(0.5 * (values - returns.detach()) ** 2, mask)
    loss = aggregate(loss_mat, mask, agg_mode, denominator=denominator, norm_constant=norm_constant)
    z = torch.zeros((), device=values.device)
    return loss, {"vf_loss": loss.detach(), "vf_clipfrac": z, "vpred_mean": masked_mean(values.detach(), mask)}


# ----------------------------------------------------------------------------------------------------- KL
#
# Estimators of KL(pi || ref) per token, from tokens sampled from pi: log_probs = log pi(y_t),
# ref_log_probs = log ref(y_t), both (B, T) -> (B, T). (Schulman, "Approximating KL divergence".)


@KL_ESTIMATORS.register("k1", "kl")
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log ref: unbiased, high variance, can be negative. (B, T) -> (B, T)."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2", "mse")
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 (log pi - log ref)^2: biased, low variance, >= 0. (B, T) -> (B, T)."""
    return 0.5 * (log_probs - ref_log_probs) ** 2


@KL_ESTIMATORS.register("k3", "low_var_kl")
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log ref - log pi) - (log ref - log pi) - 1: unbiased for KL(pi||ref), low variance, >= 0.

    (B, T) -> (B, T). As verl's low_var_kl, the log-ratio is clamped to [-20, 20] and the result to <= 10.
    """
    lr = (ref_log_probs - log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(lr) - lr - 1.0).clamp(max=10.0)


@KL_ESTIMATORS.register("abs")
def kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """|log pi - log ref|. (B, T) -> (B, T)."""
    return (log_probs - ref_log_probs).abs()


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor | None = None,
               estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate with the named estimator, shape (B, T); zero outside ``mask`` when given.

    Differentiable in log_probs (use it aggregated as a KL loss, GRPO-style: ``aggregate(kl_penalty(...),
    mask, agg_mode)``); ref_log_probs is detached.
    """
    kl = KL_ESTIMATORS[estimator](log_probs, ref_log_probs.detach())
    return kl if mask is None else _zero_outside(kl, mask)


@torch.no_grad()
def apply_kl_penalty(token_rewards: torch.Tensor, log_probs: torch.Tensor, ref_log_probs: torch.Tensor,
                     mask: torch.Tensor, coef: float, estimator: str = "k1") -> tuple[torch.Tensor, dict[str, float]]:
    """KL as a reward penalty (PPO-RLHF): ``rewards - coef * KL_t`` on agent tokens.

    token_rewards, log_probs (rollout policy), ref_log_probs, mask: shape (B, T). Returns
    ``(rewards, metrics)``: rewards (B, T) (unchanged outside the mask); metrics ``kl`` (float: the mean
    over non-empty sequences of each sequence's token-mean KL; feed it to ``controller.update``) and
    ``kl_coef``. No gradient.
    """
    kl = kl_penalty(log_probs.detach(), ref_log_probs, mask, estimator)
    rewards = token_rewards - coef * kl.to(token_rewards.dtype)
    m = _bool(mask)
    seq_kl = masked_mean(kl, m, dim=-1)
    current = masked_mean(seq_kl, m.any(-1))
    return rewards, {"kl": float(current), "kl_coef": float(coef)}


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """A constant KL coefficient: ``.value``; ``update`` does nothing."""

    def __init__(self, kl_coef: float, **_: Any):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, as in verl/TRL).

    After each batch, ``update(current_kl, n_steps)``:
    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e * n_steps / horizon``.
    ``n_steps`` is the number of samples (sequences) the KL was measured on.
    """

    def __init__(self, kl_coef: float, target_kl: float, horizon: float, **_: Any):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError("AdaptiveKLController needs target_kl > 0 and horizon > 0")
        self.value = float(kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), float(state["horizon"])


def make_kl_controller(kind: str = "fixed", kl_coef: float = 0.001, target_kl: float | None = None,
                       horizon: float | None = None):
    """Build a KL controller by name (``fixed`` or ``adaptive``; the latter needs target_kl and horizon)."""
    cls = KL_CONTROLLERS[kind]
    if cls is AdaptiveKLController:
        if target_kl is None or horizon is None:
            raise ValueError("an adaptive KL controller needs target_kl and horizon")
        return cls(kl_coef, target_kl, horizon)
    return cls(kl_coef)


# ------------------------------------------------------------------------------------------ logits helpers


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of the softmax distribution at each position: logits (B, T, V) -> (B, T).

    Numerically stable: ``-sum p * log_softmax(logits)`` with log-probabilities from log_softmax
    (logsumexp shift) and 0 * log 0 taken as 0, so -inf logits (masked vocabulary) are fine and huge
    logits do not overflow. Computed in float32 at least (bf16/fp16 are upcast). ``chunk_size``: rows of
    the flattened (B*T, V) view per step, to bound memory for big vocabularies. Differentiable.
    """

    def ent(x: torch.Tensor) -> torch.Tensor:
        x = x.to(_float_dtype(x))
        logp = torch.log_softmax(x, dim=-1)
        p = logp.exp()
        safe = logp.clamp(min=torch.finfo(logp.dtype).min)
        return -(p * safe).sum(-1)

    if chunk_size is None:
        return ent(logits)
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.cat([ent(c) for c in flat.split(chunk_size, dim=0)]) if flat.shape[0] else flat.new_zeros(0)
    return out.reshape(logits.shape[:-1])


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under softmax(logits): logits (B, T, V), labels (B, T) int -> (B, T).

    ``logits[label] - logsumexp(logits)`` in float32 at least. Differentiable in logits. (The caller aligns
    logits at position t with the token at t + 1.)
    """
    x = logits.to(_float_dtype(logits))
    picked = torch.gather(x, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)


# ------------------------------------------------------------------------------------ turn-level estimators
#
# GiGPO, per-turn discounted returns and turn-level GAE live in algos_turns.py, which registers them in
# ADVANTAGES. Importing it here, where the registry is defined, means that whoever holds ADVANTAGES holds them
# too, whichever of the two modules was imported first (the module, not names from it, so the import cycle is
# harmless). Re-exported: `algos.algos_turns.turn_index_from_lengths`, `algos.algos_turns.TURN_INPUTS`, ...
from trajlake.train import algos_turns  # noqa: E402
