"""Reading a prefix once for the rows that share it: how long a prefix rows share, and whether a model's
attention lets its keys and values be kept and reused. The sampler (collect/policies/hf.py: episodes' KV
caches, prompts shared by new episodes) and the trainer (train/forward.py: a prompt shared by a micro-batch's
rows) both use these."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch

#: rows share a prefix when that saves reading at least this many tokens (below, the extra pass costs more)
MIN_SHARED_PREFIX = 16

_ATTENTIONS = ("sdpa", "eager")


def common_prefix(rows: Sequence[Sequence[int]] | torch.Tensor) -> int:
    """Length of the longest prefix every row starts with: `rows` are id lists (of any lengths), or the
    rows of a 2-D tensor of ids. 0 for no rows."""
    if isinstance(rows, torch.Tensor):
        if rows.shape[0] == 0:
            return 0
        differs = (rows != rows[:1]).any(0).nonzero()
        return int(differs[0, 0]) if len(differs) else rows.shape[1]
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows)
    for row in rows[1:]:
        if first[:n] == row[:n]:
            continue
        lo, hi = 0, n  # first[:lo] == row[:lo] and first[:hi] != row[:hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if first[:mid] == row[:mid]:
                lo = mid
            else:
                hi = mid
        n = lo
    return n


def cache_unsupported(model) -> str | None:
    """Why the keys and values of `model`'s attention cannot be kept and reused as the sampler's cached
    decoder and the trainer's shared-prefix pass do (None when they can): they need full attention (no
    sliding windows, no linear attention) computed by sdpa or eager, in a decoder-only model."""
    config = getattr(model, "config", None)
    if config is None:
        return "the model has no config"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in _ATTENTIONS:
        return f"attention implementation {impl!r} (supported: {', '.join(_ATTENTIONS)})"
    types = getattr(config, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return f"layer types {sorted(set(types))} (only full attention is supported)"
    if not types and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    return None


@functools.cache
def _cache_name(model_class: type) -> str:
    """The keyword `model_class.forward` takes its KV cache by: `cache` in transformers >= 5.2x, which still
    accepts the old `past_key_values` but warns on every call (FutureWarning), `past_key_values` before."""
    try:
        params = inspect.signature(model_class.forward).parameters
    except (TypeError, ValueError):  # no signature to read: the old name, which every version accepts
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """`{name: cache}` for a forward call of `model` (a DeepSpeed engine's or torch.compile's wrapper
    included), under the name its transformers version takes the KV cache by (see `_cache_name`)."""
    module = getattr(model, "module", model)
    module = getattr(module, "_orig_mod", module)
    return {_cache_name(type(module)): cache}


def returned_cache(output):
    """The KV cache a forward pass returned: `output.cache` in transformers >= 5.2x (where reading
    `output.past_key_values` logs a deprecation each time), `output.past_key_values` before."""
    if "cache" in getattr(type(output), "__dataclass_fields__", {}):
        return output.cache
    return output.past_key_values
