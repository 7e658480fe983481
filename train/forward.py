"""The forward passes of an update: log-probs and entropies of the actor (or the frozen reference), values of
the critic.

`forward_logprobs` is the one way to get log-probs. It scores the tokens after position `start` (the caller
masks the others: the first prompt) and `_logits` picks how to compute their logits. Every path gives the
logits (and gradients) of one plain pass over the full rows; tests/test_train_fastpath.py checks that they do.

- plain: one pass over the full rows (`start` 0, or a model that does not take `logits_to_keep`);
- kept: one pass that computes logits only from position `start` on (transformers' `logits_to_keep`);
- shared prefix: a prefix of up to `start` tokens that every row starts with (a GRPO group's prompt) is read
  once, in a pass over one row, and every row's rest attends to its keys and values (models for which
  `can_share_prefix`; worth it from MIN_SHARED_PREFIX tokens on). That pass can start from a `Context`: the
  keys and values of a prefix every row of a whole mini-batch starts with (a system prompt), computed once
  for all its micro-batches (`prefix_context`; its share of the gradient goes back by `context_loss`).
- packed: the same shared prefix, then every row's rest unpadded, in one row (train/packing.py): one pass,
  no padding, logits only where a token is scored. Taken instead of the shared prefix (or kept) when it
  computes less (`packing.packed_cost`: not for long rows, whose dense mask costs more than the padding).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trajlake.lm.prefix import MIN_SHARED_PREFIX, cache_kwargs, cache_unsupported, common_prefix, returned_cache
from trajlake.train.algos import entropy_from_logits, entropy_metric, log_probs_and_logsumexp
from trajlake.train.distributed import device
from trajlake.train.packing import Packed, pack_rows, packed_cost, packed_mask, padded_cost, pass_costs

_KEEPS_LOGITS: dict[type, bool] = {}


def accepts_logits_to_keep(model) -> bool:
    """Whether `model` (a module or a DeepSpeed engine around one) takes transformers' `logits_to_keep`."""
    module = getattr(model, "module", model)
    cls = type(module)
    if cls not in _KEEPS_LOGITS:
        try:
            _KEEPS_LOGITS[cls] = "logits_to_keep" in inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            _KEEPS_LOGITS[cls] = False
    return _KEEPS_LOGITS[cls]


def can_share_prefix(model) -> bool:
    """Whether `forward_logprobs` can read a prefix shared by the rows once for `model`: a causal LM with
    full attention (sdpa or eager) that takes `logits_to_keep`, not partitioned by ZeRO-3."""
    module = getattr(model, "module", model)
    stage = getattr(model, "zero_optimization_stage", None)
    return ((stage is None or stage() < 3) and accepts_logits_to_keep(model)
            and cache_unsupported(module) is None)


def first_scored(loss_mask: torch.Tensor) -> int:
    """The `start` of forward_logprobs for a (B, T) loss mask: the position before its first scored token
    (0: score every token)."""
    cols = (loss_mask > 0).any(0).nonzero()
    return max(int(cols[0, 0]) - 1, 0) if len(cols) else 0


def shared_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """Length of the longest prefix of real tokens that every row of a right-padded (B, T) batch starts
    with, at most `limit` (0 for a single row: nothing to share)."""
    if input_ids.shape[0] < 2 or limit < 1:
        return 0
    n = min(limit, int(attention_mask.sum(-1).min()))
    if n < 1 or not bool(attention_mask[:, :n].all()):
        return 0
    return common_prefix(input_ids[:, :n])


def prefix_to_share(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor) -> int:
    """The prefix, before the first scored token, that every row starts with, when long enough to be worth
    reading once (MIN_SHARED_PREFIX); else 0."""
    n = shared_prefix(input_ids, attention_mask, first_scored(loss_mask))
    return n if n >= MIN_SHARED_PREFIX else 0


@dataclass
class Context:
    """Keys and values (per layer, (1, heads, length, head_dim)) of a prefix that every row of a mini-batch
    starts with (a system prompt), computed once for all its micro-batches (see `prefix_context`). Under
    autograd the micro-batches read detached copies, whose gradients `context_loss` sends back through the
    one prefix pass."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    source: list[torch.Tensor] | None = None  # the prefix pass's keys then values, in its graph


def prefix_context(model, ids: torch.Tensor) -> Context:
    """One pass over `ids` (1, L): the Context of that prefix. (The pass runs on the module itself, outside
    a DeepSpeed engine's output hooks: its gradient arrives through `context_loss`.)"""
    model = getattr(model, "module", model)
    ids = ids.to(device())
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
    cache = returned_cache(out)
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    if not torch.is_grad_enabled():
        return Context(ids.shape[1], keys, values)
    return Context(ids.shape[1], [k.detach().requires_grad_() for k in keys],
                   [v.detach().requires_grad_() for v in values], keys + values)


def context_loss(context: Context) -> torch.Tensor | None:
    """A scalar whose gradient is what the micro-batches' losses sent into the context's keys and values,
    carried through the prefix pass (its backward adds the prefix's share of every gradient)."""
    leaves = context.keys + context.values
    terms = [(src * leaf.grad).sum() for src, leaf in zip(context.source or [], leaves, strict=True)
             if leaf.grad is not None]
    return torch.stack(terms).sum() if terms else None


def _prefix_forward(model, ids: torch.Tensor, attn: torch.Tensor, prefix: int, keep: int,
                    context: Context | None) -> torch.Tensor:
    """The logits of the last `keep` positions, reading the `prefix` tokens every row starts with once: a
    pass over one row's prefix (from the end of `context`, when given) keeps its keys and values, with their
    gradient, and every row's rest attends to them. Same logits (and gradients) as one pass over the full
    rows."""
    from transformers import DynamicCache

    cache = DynamicCache(config=getattr(model, "module", model).config)
    done = 0
    if context is not None:
        for i, (k, v) in enumerate(zip(context.keys, context.values, strict=True)):
            cache.update(k, v, i)
        done = context.length
    if prefix > done:
        model(input_ids=ids[:1, done:prefix], attention_mask=attn[:1, :prefix], **cache_kwargs(model, cache),
              use_cache=True, logits_to_keep=1)
    for layer in cache.layers:  # a view per row: the gradients of the rows add up in the prefix pass
        layer.keys = layer.keys.expand(ids.shape[0], -1, -1, -1)
        layer.values = layer.values.expand(ids.shape[0], -1, -1, -1)
    return model(input_ids=ids[:, prefix:], attention_mask=attn, **cache_kwargs(model, cache), use_cache=True,
                 logits_to_keep=keep).logits


def _shared(ids: torch.Tensor, attn: torch.Tensor, start: int, share_prefix: bool,
            context: Context | None) -> tuple[int, Context | None]:
    """The prefix of up to `start` tokens that every row starts with, and the Context to start from (None:
    the prefix is not held, or does not cover it); (0, None) without `share_prefix`."""
    if context is not None and ids.shape[0] == 1:  # a lone row shares everything with itself
        return start, context
    prefix = shared_prefix(ids, attn, start) if share_prefix else 0
    return prefix, context if context is not None and prefix >= context.length else None


def _packs(model, ids: torch.Tensor, attn: torch.Tensor, start: int, prefix: int, context: Context | None) -> bool:
    """Whether the packed pass computes less than the padded one the other paths would run (see
    `_logits`) for these rows, sharing `prefix` tokens (after `context`)."""
    if ids.shape[0] < 2 or not can_share_prefix(model):
        return False
    held = context.length if context is not None else 0
    costs = pass_costs(getattr(getattr(model, "module", model), "config", None))
    shared = prefix if context is not None or prefix >= MIN_SHARED_PREFIX else 0
    lengths = attn.sum(-1).tolist()
    return packed_cost(lengths, prefix, held, costs) < padded_cost(len(lengths), ids.shape[1], shared, held, costs)


def _packed_logits(model, ids: torch.Tensor, attn: torch.Tensor, start: int, prefix: int,
                   context: Context | None) -> tuple[torch.Tensor, Packed]:
    """The logits (N, V) of the N scoring positions of one packed pass over the rows (train/packing.py),
    from the end of `context` when given, and the packing (which row and column each one scores)."""
    from transformers import DynamicCache

    module = getattr(model, "module", model)
    held = context.length if context is not None else 0
    packed = pack_rows(ids, attn.sum(-1).tolist(), prefix, start, held)
    dev = ids.device
    cache = None
    if context is not None:
        cache = DynamicCache(config=module.config)
        for i, (k, v) in enumerate(zip(context.keys, context.values, strict=True)):
            cache.update(k, v, i)
    mask = packed_mask(packed.segments, held, module.dtype).to(dev)
    out = model(input_ids=packed.ids.to(dev), attention_mask=mask, position_ids=packed.positions.to(dev),
                **cache_kwargs(model, cache), use_cache=cache is not None, logits_to_keep=packed.scored.to(dev))
    return out.logits[0], packed


def _logits(model, ids: torch.Tensor, attn: torch.Tensor, start: int, prefix: int,
            context: Context | None) -> torch.Tensor:
    """The logits that score the tokens after position `start`, (B, T - start - 1, V), by the path the
    arguments and the model allow (see the module docstring)."""
    if not start:  # plain
        return model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
    keep = ids.shape[1] - start
    if context is not None:  # shared prefix, from the mini-batch's context
        logits = _prefix_forward(model, ids, attn, prefix, keep, context)
    elif prefix >= MIN_SHARED_PREFIX and can_share_prefix(model):  # shared prefix
        logits = _prefix_forward(model, ids, attn, prefix, keep, None)
    else:  # kept
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=keep).logits
    return logits[:, -keep:-1]


def _scores(logits: torch.Tensor, labels: torch.Tensor, temperature: float, entropy: bool,
            entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `labels` (...) under `logits` (..., V) / temperature, and with `entropy` the entropies
    (differentiable with `entropy_grad`, else a metric: `entropy_metric`)."""
    if temperature != 1.0:
        logits = logits / temperature
    lp, lse = log_probs_and_logsumexp(logits, labels)
    if not entropy:
        return lp, None
    if entropy_grad and torch.is_grad_enabled():
        return lp, entropy_from_logits(logits)
    return lp, entropy_metric(logits, lse.detach())


def forward_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                     entropy: bool = False, start: int = 0, share_prefix: bool = False,
                     context: Context | None = None,
                     entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of each token given the ones before it, (B, T), 0 at position 0 (no token before it); with
    `entropy`, the entropy of the distribution each token was drawn from, (B, T). Logits are divided by the
    sampling `temperature`, as the sampler did.

    `start` > 0: only the tokens after position `start` are scored (the caller masks the others, e.g. the
    first prompt), so a model that takes `logits_to_keep` computes logits from position `start` on only;
    the log-probs and entropies of positions 0..start are then 0 (and, on the packed path, those of the
    padding). `share_prefix` (with `start`): a prefix of up to `start` tokens that every row starts with (a
    GRPO group's prompt) is read once for all rows, when `can_share_prefix(model)`, and the rows may be
    packed into one; `context`: the Context of a prefix every row starts with (of at most `start` tokens),
    from which that pass starts. `entropy_grad` False: the entropy is a metric only."""
    dev = device()
    ids, attn = input_ids.to(dev), attention_mask.to(dev)
    start = start if 0 < start < ids.shape[1] - 1 and accepts_logits_to_keep(model) else 0
    prefix, context = _shared(ids, attn, start, share_prefix, context) if start else (0, None)
    if start and share_prefix and _packs(model, ids, attn, start, prefix, context):
        logits, packed = _packed_logits(model, ids, attn, start, prefix, context)
        rows, cols = packed.rows.to(dev), packed.cols.to(dev)
        lp, ent = _scores(logits, ids[rows, cols], temperature, entropy, entropy_grad)
        out = torch.zeros(ids.shape, dtype=lp.dtype, device=dev).index_put((rows, cols), lp)
        if ent is not None:
            ent = torch.zeros(ids.shape, dtype=ent.dtype, device=dev).index_put((rows, cols), ent)
        return out, ent
    logits = _logits(model, ids, attn, start, prefix, context)
    lp, ent = _scores(logits, ids[:, start + 1:], temperature, entropy, entropy_grad)
    return F.pad(lp, (start + 1, 0)), None if ent is None else F.pad(ent, (start + 1, 0))


def forward_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The critic's values, (B, T), aligned with the log-probs (see engine.ValueModel)."""
    dev = device()
    return critic(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev))
