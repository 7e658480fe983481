"""Token-level advantage estimators (gae, reinforce++, grpo, dr_grpo, rloo), registered in ADVANTAGES."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

import torch

from trajlake.train.algos.core import (
    ADVANTAGES,
    _bool,
    _float_dtype,
    _zero_outside,
    masked_sum,
    masked_whiten,
    register_advantage,
)

# --------------------------------------------------------------------------------------------- advantages
#
# Every estimator has the same keyword-only signature, so the trainer calls
# ADVANTAGES[name](**kwargs) with one dict; each documents which arguments it reads. Unused ones are ignored.
# Its registration says what the trainer must provide: a critic (needs_critic), groups of two or more samples
# (group_relative).



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


@register_advantage("gae", needs_critic=True)
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


@register_advantage("reinforce_plus_plus", "reinforce++")
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


@register_advantage("grpo", group_relative=True)
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


@register_advantage("dr_grpo", group_relative=True)
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


@register_advantage("rloo", group_relative=True)
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


