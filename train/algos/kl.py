"""KL estimators (k1, k2, k3, abs), the KL penalty on rewards, and the KL coefficient controllers."""

from __future__ import annotations

from typing import Any

import torch

from trajlake.train.algos.core import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOG_RATIO_CLAMP,
    _bool,
    _zero_outside,
    masked_mean,
)

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

    @classmethod
    def from_settings(cls, kl_coef: float, *, target_kl: float | None = None,
                      horizon: float | None = None) -> FixedKLController:
        """The controller for a config's settings (a fixed one reads only `kl_coef`)."""
        return cls(kl_coef)

    @classmethod
    def config_problem(cls, config: Any) -> str | None:
        """What is wrong with a TrainConfig's KL settings for this controller: nothing, whatever they are."""
        return None

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

    @classmethod
    def from_settings(cls, kl_coef: float, *, target_kl: float | None = None,
                      horizon: float | None = None) -> AdaptiveKLController:
        """The controller for a config's settings: it needs `target_kl` and `horizon`."""
        if target_kl is None or horizon is None:
            raise ValueError("an adaptive KL controller needs target_kl and horizon")
        return cls(kl_coef, target_kl, horizon)

    @classmethod
    def config_problem(cls, config: Any) -> str | None:
        """What is wrong with a TrainConfig's KL settings for this controller: it adapts a starting coefficient
        towards a target over a horizon, so it needs all three."""
        if not (config.kl.target and config.kl.horizon):
            return "kl_controller adaptive needs kl_target > 0 and kl_horizon > 0"
        if config.kl.coef <= 0:
            return "kl_controller adaptive needs a starting kl_coef > 0"
        return None

    def update(self, current_kl: float, n_steps: int) -> None:
        err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), float(state["horizon"])


def make_kl_controller(kind: str, kl_coef: float, target_kl: float | None = None, horizon: float | None = None):
    """Build a KL controller by name (``fixed`` or ``adaptive``; the latter needs target_kl and horizon) at the
    starting coefficient `kl_coef` (the run's: TrainConfig.kl_coef holds the one default): every controller has
    ``from_settings``, ``value``, ``update``, ``state_dict`` and ``load_state_dict``."""
    return KL_CONTROLLERS[kind].from_settings(kl_coef, target_kl=target_kl, horizon=horizon)
