"""The algos' registries, their entry types, the masked helpers, loss aggregation and the logits helpers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from trajlake.core.registry import Registry

#: Log-ratios are clamped to this before exp(), as verl does, so a wild token cannot overflow the ratio.
LOG_RATIO_CLAMP = 20.0

# ------------------------------------------------------------------------------------------ entry types


class AdvantageFn(Protocol):
    """``(*, token_level_rewards, mask, values=None, group_ids=None, gamma, lam, ...) -> (advantages,
    returns)``: tensors (B, T), zero outside the mask. Every estimator takes one keyword-only signature and
    ignores what it does not read (see :func:`~trajlake.train.algos.advantages.compute_gae`)."""

    def __call__(self, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...


class KLEstimatorFn(Protocol):
    """``(log_probs, ref_log_probs) -> (B, T)`` elementwise estimate of KL(pi || ref) on tokens sampled from pi."""

    def __call__(self, log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class Loss:
    """A registered policy or value loss: ``fn(**kwargs) -> (loss, metrics)`` (a 0-dim loss already aggregated
    with ``agg_mode``; metrics as detached 0-dim tensors), called like ``fn``.

    ``params`` maps the loss's hyper-parameter keywords to the TrainConfig fields that hold them (``{"clip_eps":
    "value_clip"}``): the trainer passes exactly these, so a new hyper-parameter is a config field and one
    entry here. ``summed`` names its metrics that are a share of the mini-batch's loss (aggregated with the
    mini-batch's denominator), which the trainer adds up over micro-batches; every other metric is a mean
    over the micro-batch's tokens, weighed by them. ``rule(**settings)`` returns what is wrong with the
    loss's hyper-parameters (None when nothing is): the config check and the loss itself both ask it."""

    fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    params: Mapping[str, str] = field(default_factory=dict)
    summed: tuple[str, ...] = ()
    rule: Callable[..., str | None] | None = None

    def __call__(self, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.fn(**kwargs)

    def settings(self, config: Any) -> dict[str, Any]:
        """The hyper-parameters this loss reads, from `config` (a TrainConfig)."""
        return {kw: config.value(name) for kw, name in self.params.items()}

    def config_problem(self, config: Any) -> str | None:
        """What is wrong with the settings `config` gives this loss, as its rule says; None when nothing is."""
        return self.rule(**self.settings(config)) if self.rule else None


def register_loss(registry: Registry[Loss], name: str, *aliases: str, params: Mapping[str, str] | None = None,
                  summed: tuple[str, ...] = (), rule: Callable[..., str | None] | None = None) -> Callable:
    """Decorator: register the loss function under ``name`` (and ``aliases``) as a :class:`Loss`."""

    def deco(fn: Callable) -> Callable:
        registry.add(name, Loss(fn, dict(params or {}), summed, rule), *aliases)
        return fn

    return deco


#: The turn structure an estimator may read beyond the token-level keywords, as the batch holds it: ``turn_index``
#: (B, T), each agent token's turn; ``step_keys`` (B, K), an id of the observation each turn answered.
TURN_INPUT_NAMES = ("turn_index", "step_keys")


@dataclass(frozen=True)
class Advantage:
    """A registered advantage estimator: ``fn(**kwargs) -> (advantages, returns)``, both (B, T) and zero
    outside the mask, called like ``fn`` (every estimator takes one keyword-only signature, see
    :class:`AdvantageFn`), with what the trainer must know to run it:

    - ``needs_critic``: it reads ``values`` (B, T), a critic's per-token estimates, so only an algo that
      trains a critic (``needs_critic``, e.g. ppo) runs it, and every algo without one refuses it.
    - ``group_relative``: it compares the samples of a group (a task's), so a group of one has no baseline:
      a config with ``samples < 2`` is refused, and stored groups of one are left out.
    - ``turn_inputs``: the turn structure it reads (names of :data:`TURN_INPUT_NAMES`); the trainer reads
      the turns of the stored episodes into the batch and passes these. An estimator with any is turn-level:
      it discounts across turns itself, so a reward spec that discounts them too is refused.
    - ``params``: its own keyword settings mapped to the TrainConfig fields that hold them
      (``{"baseline": "turn_baseline"}``), passed by :meth:`settings` as :class:`Loss` does."""

    fn: AdvantageFn
    needs_critic: bool = False
    group_relative: bool = False
    turn_inputs: tuple[str, ...] = ()
    params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        unknown = [n for n in self.turn_inputs if n not in TURN_INPUT_NAMES]
        if unknown:
            raise ValueError(f"an advantage estimator reads turn inputs of {', '.join(TURN_INPUT_NAMES)}, got "
                             f"{', '.join(map(repr, unknown))}")

    def __call__(self, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fn(**kwargs)

    @property
    def turn_level(self) -> bool:
        """Whether it works on turns (reads the turn structure) rather than on tokens alone."""
        return bool(self.turn_inputs)

    @property
    def min_group_size(self) -> int:
        """The fewest samples a group needs to give this estimator a learning signal: 2 when it compares them."""
        return 2 if self.group_relative else 1

    def settings(self, config: Any) -> dict[str, Any]:
        """The estimator's own settings, from `config` (a TrainConfig)."""
        return {kw: config.value(name) for kw, name in self.params.items()}


def register_advantage(name: str, *aliases: str, needs_critic: bool = False, group_relative: bool = False,
                       turn_inputs: tuple[str, ...] = (), params: Mapping[str, str] | None = None) -> Callable:
    """Decorator: register the estimator function under ``name`` (and ``aliases``) in :data:`ADVANTAGES` as an
    :class:`Advantage` with these properties; the function itself is returned unchanged."""

    def deco(fn: Callable) -> Callable:
        ADVANTAGES.add(name, Advantage(fn, needs_critic, group_relative, tuple(turn_inputs), dict(params or {})),
                       *aliases)
        return fn

    return deco


@dataclass(frozen=True)
class AggMode:
    """A loss aggregation mode: ``reduce(loss_mat, mask, denominator=None, norm_constant=None) -> 0-dim``, and
    what its denominator counts (``per``: ``token`` or ``sequence``), so a trainer that splits a mini-batch into
    micro-batches divides each by the whole mini-batch's :meth:`count`. Called like ``reduce``."""

    reduce: Callable[..., torch.Tensor]
    per: str

    def __post_init__(self):
        if self.per not in ("token", "sequence"):
            raise ValueError(f"an aggregation mode counts per token or per sequence, got {self.per!r}")

    def __call__(self, loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                 norm_constant: float | None = None) -> torch.Tensor:
        return self.reduce(loss_mat, mask, denominator=denominator, norm_constant=norm_constant)

    def count(self, mask: torch.Tensor) -> torch.Tensor:
        """The denominator of ``mask`` (B, T): its agent tokens, or its sequences with at least one."""
        return _bool(mask).sum() if self.per == "token" else _seq_count(mask)


def register_agg_mode(name: str, *, per: str) -> Callable:
    """Decorator: register the reduce function under ``name`` as an :class:`AggMode` counting ``per``."""

    def deco(fn: Callable) -> Callable:
        AGG_MODES.add(name, AggMode(fn, per))
        return fn

    return deco


# ----------------------------------------------------------------------------------------------- registries


class AdvantageRegistry(Registry[Advantage]):
    """The advantage estimators. A plain function added (``@ADVANTAGES.register(name)``) is an
    :class:`Advantage` with the defaults: token-level, critic-free, comparing no group, no settings; declare
    more with :func:`register_advantage`."""

    def add(self, name: str, entry: Advantage | AdvantageFn, *aliases: str) -> Advantage:
        return super().add(name, entry if isinstance(entry, Advantage) else Advantage(entry), *aliases)


ADVANTAGES = AdvantageRegistry("advantage estimator")
POLICY_LOSSES: Registry[Loss] = Registry("policy loss")
VALUE_LOSSES: Registry[Loss] = Registry("value loss")
KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry("KL estimator")
AGG_MODES: Registry[AggMode] = Registry("loss aggregation mode")
KL_CONTROLLERS: Registry[type] = Registry("KL controller")


@dataclass(frozen=True)
class KLPlacement:
    """Where the KL to the reference policy enters an update (``kl_mode``): ``in_rewards``, a penalty on the token
    rewards before the advantages (PPO-RLHF's, measured on pi_old and updating the controller once per batch);
    else a term of the actor's loss (GRPO's, on the log-probs being trained, the controller updated after the
    update)."""

    in_rewards: bool
    description: str = ""


@dataclass(frozen=True)
class OldLogprobSource:
    """Where the ratio's pi_old comes from (``old_logprobs``): ``recomputed``, a forward pass of the actor over
    the batch before the update (truncated importance weights, ``is_cap``, then correct for the policy that
    played); else the behaviour log-probs stored with each rollout (the ratio is itself the importance weight,
    so data other policies played needs nothing more)."""

    recomputed: bool
    description: str = ""


KL_PLACEMENTS: Registry[KLPlacement] = Registry("kl_mode")
KL_PLACEMENTS.add("loss", KLPlacement(False, "a term of the actor's loss"))
KL_PLACEMENTS.add("reward", KLPlacement(True, "a penalty on the token rewards before the advantages"))
OLD_LOGPROB_SOURCES: Registry[OldLogprobSource] = Registry("old_logprobs")
OLD_LOGPROB_SOURCES.add("recompute", OldLogprobSource(True, "the actor's forward pass before the update"))
OLD_LOGPROB_SOURCES.add("behaviour", OldLogprobSource(False, "the behaviour log-probs stored with each rollout"))

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


def _zero_outside(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


# -------------------------------------------------------------------------------------------- aggregation


def _seq_count(mask: torch.Tensor) -> torch.Tensor:
    """Number of sequences (rows) with at least one agent token; mask (B, T) -> 0-dim."""
    return (_bool(mask).sum(-1) > 0).sum()


def _div(num: torch.Tensor, den: torch.Tensor | float) -> torch.Tensor:
    if isinstance(den, torch.Tensor):
        return num / den.clamp(min=1).to(num.dtype)
    return num / max(float(den), 1e-12)


@register_agg_mode("token-mean", per="token")
def agg_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                   norm_constant: float | None = None) -> torch.Tensor:
    """Sum over every masked-in token of the batch / number of masked-in tokens (or ``denominator``).

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor (0 when the mask is empty). Long sequences weigh
    more (each token counts once): DAPO's token-level loss, verl's default.
    """
    return _div(masked_sum(loss_mat, mask), _bool(mask).sum() if denominator is None else denominator)


@register_agg_mode("seq-mean-token-sum", per="sequence")
def agg_seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                           norm_constant: float | None = None) -> torch.Tensor:
    """Per-sequence sum over its tokens, then the mean over sequences.

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor. Sequences with no agent token are not counted;
    ``denominator`` replaces the number of sequences.
    """
    seq = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    return _div(seq.sum(), _seq_count(mask) if denominator is None else denominator)


@register_agg_mode("seq-mean-token-mean", per="sequence")
def agg_seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator: float | None = None,
                            norm_constant: float | None = None) -> torch.Tensor:
    """Per-sequence mean over its tokens, then the mean over sequences (original GRPO; GSPO).

    loss_mat, mask: shape (B, T). Returns a 0-dim tensor. Sequences with no agent token are not counted;
    ``denominator`` replaces the number of sequences.
    """
    seq = masked_mean(loss_mat, mask, dim=-1)  # (B,)
    return _div(seq.sum(), _seq_count(mask) if denominator is None else denominator)


@register_agg_mode("seq-mean-token-sum-norm", per="sequence")
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
    and get no gradient. ``denominator``: the mode's count (``AGG_MODES[mode].count``: tokens for token-mean,
    sequences for seq-mean-*) of the whole mini-batch, to divide by instead of this batch's, for gradient
    accumulation. ``norm_constant``: the constant of
    ``seq-mean-token-sum-norm``. Modes: see :data:`AGG_MODES`.
    """
    return AGG_MODES[mode](loss_mat, mask, denominator=denominator, norm_constant=norm_constant)



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
    return log_probs_and_logsumexp(logits, labels)[0]


def log_probs_and_logsumexp(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`log_probs_from_logits` and the logsumexp of the logits it subtracted: logits (..., V), labels (...)
    int -> two (...) tensors, in float32 at least. Differentiable in logits."""
    x = logits.to(_float_dtype(logits))
    picked = torch.gather(x, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(x, dim=-1)
    return picked - lse, lse


@torch.no_grad()
def entropy_metric(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """`entropy_from_logits` without gradient, from the logits (..., V) and their logsumexp `lse` (...):
    lse - sum(softmax * logits), a dot product per position instead of log_softmax, exp, clamp and product
    over the vocabulary (one (..., V) temporary instead of four). Positions whose result is not finite
    (-inf logits: a masked vocabulary) are computed by `entropy_from_logits`. Returns (...) float32 at least."""
    x = logits.to(_float_dtype(logits))
    flat, lse_flat = x.reshape(-1, x.shape[-1]), lse.reshape(-1, 1).to(x.dtype)
    p = (flat - lse_flat).exp_()
    out = lse_flat[:, 0] - torch.bmm(p[:, None, :], flat[:, :, None]).reshape(-1)
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        out[bad] = entropy_from_logits(flat[bad])
    return out.reshape(x.shape[:-1])


