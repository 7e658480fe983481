"""How one update deals a batch out: its rows over the processes (by length), each process's share into
length-bucketed micro-batches (as many on every process, so collectives line up), the denominator of the
whole mini-batch that every micro-batch's loss is divided by, per-token results of the whole batch gathered
on every process (`per_token`), and metrics averaged over the processes (`Meter`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from trajlake.train.algos import AGG_MODES
from trajlake.train.batch import Batch, micro_batches, shard
from trajlake.train.config import TrainConfig
from trajlake.train.distributed import all_gather, all_mean, device
from trajlake.train.engine import Engines
from trajlake.train.forward import prefix_to_share


class Meter:
    """Weighted sums of metrics, averaged over all processes at the end."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, name: str, value, weight: float = 1.0) -> None:
        v = float(value)
        if math.isnan(v) or weight == 0:
            return
        self.sums[name] = self.sums.get(name, 0.0) + v * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def result(self) -> dict[str, float]:
        keys = sorted(set().union(*all_gather(sorted(self.sums))))
        flat = {f"s:{k}": self.sums.get(k, 0.0) for k in keys} | {f"w:{k}": self.weights.get(k, 0.0) for k in keys}
        flat = all_mean(flat)
        return {k: flat[f"s:{k}"] / flat[f"w:{k}"] for k in keys if flat[f"w:{k}"] > 0}


def take(x: torch.Tensor | None, idx: list[int], width: int) -> torch.Tensor | None:
    """Rows `idx` of a (B, T) tensor of the whole batch cut to a micro-batch's `width`: (len(idx), width), on
    this process's device; None stays None."""
    return None if x is None else x[torch.as_tensor(idx, dtype=torch.long), :width].to(device())


def micro_shares(batch: Batch, rows: list[int], cfg: TrainConfig, world: int, rank: int, share: bool = False):
    """This process's micro-batches of `rows`: (sub-batch, its row indices); as many on every process (a
    process short of rows runs a fully masked one-row micro-batch, so collectives line up). With `share`
    (the forward reads a prefix common to a micro-batch's rows once), rows are grouped by group id instead
    of by length alone when that makes less to compute (a GRPO group's samples share their prompt:
    `tokens_read`)."""
    lengths = batch.lengths
    per_rank = -(-len(rows) // world)
    count = max(1, -(-per_rank // cfg.optim.micro_batch))
    mine = shard(rows, lengths, rank, world)
    groups = micro_batches(lengths, mine, cfg.optim.micro_batch, count)
    if share and len(mine) > 1:
        by_group = micro_batches(lengths, mine, cfg.optim.micro_batch, count, keys=batch.group_ids)
        if by_group != groups and tokens_read(batch, by_group) < tokens_read(batch, groups):
            groups = by_group
    for mb in groups:
        if mb:
            yield batch.rows(mb), mb
        else:
            sub = batch.rows([rows[0]], width=min(2, batch.input_ids.shape[1]))
            sub.loss_mask = torch.zeros_like(sub.loss_mask)
            yield sub, [rows[0]]


def tokens_read(batch: Batch, groups: list[list[int]]) -> int:
    """Positions a packed forward pass (train/packing.py) computes over the micro-batches `groups`: a prefix
    shared by a micro-batch's rows once, then each row's other tokens, no padding."""
    lengths, total = batch.lengths, 0
    for mb in groups:
        if not mb:
            continue
        sub = batch.rows(mb)
        prefix = prefix_to_share(sub.input_ids, sub.attention_mask, sub.loss_mask)
        total += prefix + sum(lengths[i] - prefix for i in mb)
    return total


def denominator(batch: Batch, rows: list[int], cfg: TrainConfig, world: int) -> float:
    m = batch.loss_mask[torch.as_tensor(rows, dtype=torch.long)]
    return float(AGG_MODES[cfg.optim.agg_mode].count(m)) / world  # tokens or sequences, as the mode divides by


@torch.no_grad()
def per_token(batch: Batch, cfg: TrainConfig, fn: Callable[[Batch], torch.Tensor], engines: Engines, *,
              share: bool = False) -> torch.Tensor:
    """`fn(sub_batch) -> (b, t)` over the whole batch, each process computing a share: (B, T) on every one.
    `share`: `fn` reads a prefix shared by a micro-batch's rows once (see `micro_shares`)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    for sub, idx in micro_shares(batch, list(range(batch.size)), cfg, engines.world, engines.rank, share):
        if sub.loss_mask.any():
            out[torch.as_tensor(idx), :sub.input_ids.shape[1]] = fn(sub).float().cpu()
        else:
            fn(sub)  # keep ZeRO-3's collective forward passes in step
    if engines.world > 1:
        torch.distributed.all_reduce(out)
    return out


__all__ = ["Meter", "take", "micro_shares", "tokens_read", "denominator", "per_token"]
