"""Packing a micro-batch's rows into one row for the update's forward pass, without padding.

Rows that start with the same prefix (a GRPO group's prompt) become one packed row: the prefix once, then
each row's own rest (its suffix) one after the other. Position ids restart after the prefix for every
suffix, and a (block-diagonal after the prefix) attention mask lets a suffix token see the prefix and the
tokens of its own suffix before it, nothing of the other suffixes. So every token is computed as in a
pass over its own unpadded row: the same logits, the same gradients (float rounding aside; tests:
tests/test_train_packing.py). A prefix of length 0 packs rows that share nothing (verl's remove-padding,
OpenRLHF's packing). The mask is dense: sdpa and eager attention read a (L, context + L) mask, so the
attention computes every pair of the packed row, the masked ones too. `packed_cost` and
`padded_cost` weigh that against the padding and the pass it saves, so long suffixes keep the padded layout.

All functions here are pure: tensors in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packed:
    """A micro-batch of B right-padded rows (width T) packed into one row of L tokens, after `context`
    tokens whose keys and values the model already holds.

    ids (1, L) long; positions (1, L) long (the packed tokens' positions in their own rows); segments (L,)
    long (-1 on the shared prefix, b on row b's suffix); scored: (N,) long indices into the L tokens whose
    logits score a token, with the (row, column) of the token each one scores in `rows` and `cols` (N,)
    (column = the scoring position + 1)."""

    ids: torch.Tensor
    positions: torch.Tensor
    segments: torch.Tensor
    context: int
    scored: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor

    @property
    def length(self) -> int:
        return self.ids.shape[1]


def pack_rows(ids: torch.Tensor, lengths: list[int], prefix: int, start: int, context: int = 0) -> Packed:
    """Pack the rows of `ids` (B, T), row b of `lengths[b]` real tokens, that all start with the same
    `prefix` tokens (prefix <= start; `context` <= prefix of them are already held by the model as keys and
    values): the packed row is ids[0, context:prefix] then, for each row b, ids[b, prefix:lengths[b]]. The
    tokens scored are those after column `start` of each row: positions start..lengths[b] - 2 score columns
    start + 1..lengths[b] - 1."""
    if not context <= prefix <= start:
        raise ValueError(f"expected context {context} <= prefix {prefix} <= start {start}")
    if min(lengths) < start + 2:
        raise ValueError(f"a row of {min(lengths)} tokens has nothing to score after column {start}")
    ids = ids.cpu()
    parts, positions, segments, scored, rows, cols = [ids[0, context:prefix]], [], [], [], [], []
    positions.append(torch.arange(context, prefix))
    segments.append(torch.full((prefix - context,), -1, dtype=torch.long))
    offset = prefix - context  # where the current suffix starts in the packed row
    for b, n in enumerate(lengths):
        parts.append(ids[b, prefix:n])
        positions.append(torch.arange(prefix, n))
        segments.append(torch.full((n - prefix,), b, dtype=torch.long))
        at = torch.arange(start, n - 1)  # the scoring positions of row b
        scored.append(offset + at - prefix)
        rows.append(torch.full_like(at, b))
        cols.append(at + 1)
        offset += n - prefix
    return Packed(torch.cat(parts)[None], torch.cat(positions)[None], torch.cat(segments), context,
                  torch.cat(scored), torch.cat(rows), torch.cat(cols))


def packed_mask(segments: torch.Tensor, context: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of a packed row, (1, 1, L, context + L) of `dtype`: 0 where a query
    token may see a key token, the dtype's lowest value elsewhere. Every token sees the `context` keys held
    before the row; within the row (segments (L,): -1 on the prefix, b on row b's suffix), a token sees the
    tokens before it (itself included) that are on the prefix or on its own suffix."""
    n = segments.shape[0]
    order = torch.arange(n)
    seen = (order[None, :] <= order[:, None]) & ((segments[None, :] == -1) | (segments[None, :] == segments[:, None]))
    seen = torch.cat([torch.ones((n, context), dtype=torch.bool), seen], dim=1)
    zero = torch.zeros((), dtype=dtype)
    return torch.where(seen, zero, torch.finfo(dtype).min)[None, None]


#: the fixed cost of one pass through a decoder layer (kernel launches, Python, autograd nodes), in
#: multiply-adds: measured on a 1-thread CPU, a pass over the tiny model's 4 layers costs about as much as
#: 60 more tokens, a pass over SmolLM2-135M's 30 layers as 3
PASS_MACS = 1.1e7


@dataclass(frozen=True)
class PassCosts:
    """What a forward pass computes besides its tokens, in tokens of a decoder layer (its projections and MLP
    for one token): `pair`, one (query, key) pair of attention; `call`, the pass itself."""

    pair: float
    call: float


def pass_costs(config) -> PassCosts:
    """PassCosts from a transformers config: a pair costs 2 * heads * head_dim multiply-adds (scores and
    values), a token the q, k, v, o projections and the MLP, a pass PASS_MACS. Both 0 when the config does
    not say (then only tokens count)."""
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    if not hidden or not heads:
        return PassCosts(0.0, 0.0)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    mlp = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * mlp
    return PassCosts(2 * heads * head_dim / per_token, PASS_MACS / per_token)


def padded_cost(rows: int, width: int, shared: int, context: int, costs: PassCosts) -> float:
    """What the padded pass over `rows` rows of `width` columns computes, in tokens (`PassCosts`): the
    `shared` prefix (beyond the `context` already held) read once in a pass of its own (0: not shared, every
    row reads all its columns), then each row's other columns attending to all the columns before them."""
    rest = width - shared
    tokens = shared - context + rows * rest if shared else rows * width
    pairs = (shared - context) * shared + rows * rest * width
    calls = 2 if shared > context else 1
    return tokens + costs.pair * pairs + costs.call * calls


def packed_cost(lengths: list[int], prefix: int, context: int, costs: PassCosts) -> float:
    """What the packed pass computes, as `padded_cost` counts it: L = prefix - context + sum(lengths -
    prefix) tokens, each attending to the context + L columns of the packed row (masked ones included), in
    one pass."""
    tokens = prefix - context + sum(n - prefix for n in lengths)
    return tokens + costs.pair * tokens * (context + tokens) + costs.call


__all__ = ["Packed", "pack_rows", "packed_mask", "PASS_MACS", "PassCosts", "pass_costs", "padded_cost", "packed_cost"]
