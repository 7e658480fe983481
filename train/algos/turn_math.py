"""The machinery of the turn-level estimators (train/algos/turns.py): turn slots, discounted returns over
turns, segment statistics and step groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trajlake.train.algos.advantages import group_index
from trajlake.train.algos.core import _bool, _float_dtype

# ------------------------------------------------------------------------------------ building the inputs


def turn_first_positions(turn_index: torch.Tensor, mask: torch.Tensor, num_turns: int | None = None) -> torch.Tensor:
    """The position of each turn's first agent token: (B, T) -> (B, K) long, -1 where a turn has none.

    K = ``num_turns`` (default: 1 + the largest turn index on the mask). A trainer whose critic aligns values
    differently from trajlake's ValueModel can gather ``turn_values`` at these positions minus one.
    """
    slot, K = _turn_slots(turn_index.long(), _bool(mask), num_turns, "turn_first_positions")
    return _first_positions(slot, K)


def _first_positions(slot: torch.Tensor, K: int) -> torch.Tensor:
    B, T = slot.shape
    pos = torch.arange(T, device=slot.device).expand(B, T)
    first = torch.full((B, K + 1), T, dtype=torch.long, device=slot.device).scatter_reduce(1, slot, pos, "amin")
    first = first[:, :K]
    return torch.where(first < T, first, torch.full_like(first, -1))


# ------------------------------------------------------------------------------------------- turn structure


def _turn_slots(ti: torch.Tensor, m: torch.Tensor, K: int | None, name: str) -> tuple[torch.Tensor, int]:
    """turn_index on the mask, the spare slot K elsewhere: (B, T) long, for scatters into (B, K + 1); and K
    (``K`` if given, else 1 + the largest turn index on the mask)."""
    if bool((m & (ti < 0)).any()):
        raise ValueError(f"{name}: turn_index must be >= 0 on agent tokens, got {int(ti[m].min())}")
    hi = int(torch.where(m, ti, -1).max()) if m.numel() else -1
    if K is None:
        K = hi + 1
    elif hi >= K:
        raise ValueError(f"{name}: turn_index {hi} on an agent token, but only {K} turns (turn_rewards / "
                         "turn_mask / turn_values have that many columns)")
    return torch.where(m, ti, K), K


@dataclass
class _Turns:
    """The turn structure of a batch. m, slot: (B, T); valid, has_tok, r: (B, K); r float64."""

    m: torch.Tensor
    slot: torch.Tensor
    K: int
    valid: torch.Tensor
    has_tok: torch.Tensor
    r: torch.Tensor
    dt: torch.dtype

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """A per-turn (B, K) quantity on each turn's agent tokens: (B, T), zero outside the mask."""
        if self.K == 0:
            return torch.zeros(self.m.shape, dtype=self.dt, device=self.m.device)
        g = torch.gather(x, 1, self.slot.clamp(max=self.K - 1))
        return torch.where(self.m, g, torch.zeros((), dtype=g.dtype, device=g.device)).to(self.dt)


def _missing(name: str, **inputs: tuple[Any, str]) -> None:
    """Raise naming every input that is None: inputs are name -> (value, what it is)."""
    gone = [f"{k} ({what})" for k, (v, what) in inputs.items() if v is None]
    if gone:
        raise ValueError(f"{name} needs {' and '.join(gone)}")


TURN_INDEX_WHAT = "(B, T) long: each agent token's turn number, e.g. turn_index_from_lengths"


def _width(x: torch.Tensor | None, B: int, what: str, name: str) -> int | None:
    if x is None:
        return None
    if x.dim() != 2 or x.shape[0] != B:
        raise ValueError(f"{name}: {what} must have shape (B, K) with B = {B}, got {tuple(x.shape)}")
    return int(x.shape[1])


def _turns(name: str, token_level_rewards: torch.Tensor, mask: torch.Tensor, turn_index: torch.Tensor,
           turn_rewards: torch.Tensor | None, turn_mask: torch.Tensor | None,
           turn_values: torch.Tensor | None = None, values: torch.Tensor | None = None) -> _Turns:
    if mask.shape != token_level_rewards.shape or mask.dim() != 2:
        raise ValueError(f"{name}: token_level_rewards and mask must both be (B, T), got "
                         f"{tuple(token_level_rewards.shape)} and {tuple(mask.shape)}")
    ti = torch.as_tensor(turn_index, device=mask.device)
    if ti.shape != mask.shape or ti.is_floating_point():
        raise ValueError(f"{name}: turn_index must be an integer tensor of the mask's shape {tuple(mask.shape)}, "
                         f"got {ti.dtype} {tuple(ti.shape)}")
    ti = ti.long()
    m = _bool(mask)
    B = m.shape[0]
    if turn_rewards is not None:
        turn_rewards = torch.as_tensor(turn_rewards, device=m.device)
    if turn_mask is not None:
        turn_mask = torch.as_tensor(turn_mask, device=m.device)
    widths = {w for w in (_width(turn_rewards, B, "turn_rewards", name), _width(turn_mask, B, "turn_mask", name),
                          _width(turn_values, B, "turn_values", name)) if w is not None}
    if len(widths) > 1:
        raise ValueError(f"{name}: turn_rewards, turn_mask and turn_values disagree on the number of turns: "
                         f"{sorted(widths)}")
    slot, K = _turn_slots(ti, m, widths.pop() if widths else None, name)
    counts = torch.zeros(B, K + 1, dtype=torch.long, device=m.device).scatter_add_(1, slot, m.long())[:, :K]
    has_tok = counts > 0
    if turn_mask is None:
        valid = has_tok
    else:
        valid = _bool(turn_mask)
        bad = has_tok & ~valid
        if bool(bad.any()):
            b, k = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name}: turn {k} of row {b} has agent tokens but is outside turn_mask")
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=m.device)
    if turn_rewards is None:
        tok = torch.where(m, token_level_rewards.detach().to(f64), zero)
        r = torch.zeros(B, K + 1, dtype=f64, device=m.device).scatter_add_(1, slot, tok)[:, :K]
    else:
        r = torch.where(valid, turn_rewards.detach().to(f64), zero)
    dt = _float_dtype(token_level_rewards, turn_rewards, turn_values, values)
    return _Turns(m, slot, K, valid, has_tok, r, dt)


@torch.no_grad()
def _discounted_returns(r: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_k = r_k + gamma * G_next over each row's valid turns, skipping invalid ones; 0 at invalid turns.
    r, valid: (B, K) -> (B, K)."""
    B, K = r.shape
    out = torch.zeros_like(r)
    nxt = torch.zeros(B, dtype=r.dtype, device=r.device)
    for k in range(K - 1, -1, -1):
        g = r[:, k] + gamma * nxt
        nxt = torch.where(valid[:, k], g, nxt)
        out[:, k] = torch.where(valid[:, k], g, torch.zeros_like(g))
    return out


def _segment_stats(x: torch.Tensor, seg: torch.Tensor,
                   weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element mean and unbiased std of its segment: x (N,) float64, seg (N,) long -> (N,), (N,).

    ``weight`` (N,): non-negative integer frequency weights (an element of weight w counts w times; 0:
    not in the population). A segment of equal values (or of one) gets exactly that value and std 0.
    """
    N = x.shape[0]
    if N == 0:
        return x.clone(), x.clone()
    S = int(seg.max()) + 1
    w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
    z = torch.zeros(S, dtype=x.dtype, device=x.device)
    count = z.index_add(0, seg, w)
    mean = z.index_add(0, seg, w * x) / count.clamp(min=1)
    inpop = w > 0
    hi = torch.full((S,), -torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(
        0, seg[inpop], x[inpop], "amax")
    lo = torch.full((S,), torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(
        0, seg[inpop], x[inpop], "amin")
    const = hi == lo
    mean = torch.where(const, hi, mean)
    sq = z.index_add(0, seg, w * (x - mean[seg]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    std = torch.where(const | (count < 2), torch.zeros_like(std), std)
    return mean[seg], std[seg]


def _center(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, norm_by_std: bool, eps: float) -> torch.Tensor:
    """x - mean, divided by (std + eps) when norm_by_std and std > 0."""
    a = x - mean
    if norm_by_std:
        a = a / torch.where(std > 0, std + eps, torch.ones_like(std))
    return a


def _groups(group_ids, B: int, device, name: str) -> torch.Tensor:
    idx = group_index(group_ids, device=device)
    if idx.shape[0] != B:
        raise ValueError(f"{name}: group_ids has {idx.shape[0]} entries for a batch of {B}")
    return idx


