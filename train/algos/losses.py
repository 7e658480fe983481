"""Policy losses (ppo_clip, dual_clip, gspo) and value losses (clipped, mse), registered by name."""

from __future__ import annotations

import torch

from trajlake.train.algos.core import (
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    VALUE_LOSSES,
    _bool,
    _zero_outside,
    aggregate,
    masked_mean,
    register_loss,
)

# ------------------------------------------------------------------------------------------ policy losses
#
# Every policy loss has the same keyword-only signature and returns (loss, metrics): loss is a 0-dim
# tensor, the (B, T) loss matrix aggregated over the mask with `agg_mode`; metrics are detached 0-dim
# tensors (pg_loss, pg_clipfrac, ppo_kl, ratio_mean, ...). Masked-out positions never get a gradient.


#: the clip range's keywords and the TrainConfig fields that hold them
CLIP = {"clip_low": "clip_low", "clip_high": "clip_high"}


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


@register_loss(POLICY_LOSSES, "ppo_clip", "vanilla", params=CLIP, summed=("pg_loss",))
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


def _dual_clip_rule(*, clip_c: float, **_: float) -> str | None:
    return None if clip_c > 1.0 else f"dual_clip needs clip_c > 1, got {clip_c}"


@register_loss(POLICY_LOSSES, "dual_clip", params={**CLIP, "clip_c": "clip_c"}, summed=("pg_loss",),
               rule=_dual_clip_rule)
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
    problem = _dual_clip_rule(clip_c=clip_c)
    if problem:
        raise ValueError(problem)
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


@register_loss(POLICY_LOSSES, "gspo", params=CLIP, summed=("pg_loss",))
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


@register_loss(VALUE_LOSSES, "clipped", params={"clip_eps": "value_clip"}, summed=("vf_loss",))
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


@register_loss(VALUE_LOSSES, "mse", summed=("vf_loss",))
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


