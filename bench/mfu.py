"""Model FLOPs utilisation (MFU) of a GRPO iteration, for bench/train.py: the model's parameters, this machine's
fp32 matmul peak measured on the same cores and threads, and the share of it an iteration's tokens per second
stand for."""

from __future__ import annotations

import math
import time
from pathlib import Path

#: model FLOPs per sequence token (prompt and reply) of a GRPO iteration, per parameter: 2 to generate it (one
#: forward, in the prefill or a decode step), 6 to train on it (forward and backward). Attention's own FLOPs are
#: left out (sequences of about a hundred tokens), as PaLM's MFU leaves out recomputation: the work either side
#: must do, over the time it took.
FLOPS_PER_PARAM_TOKEN = 8
#: of those, the update's: a forward and a backward pass over every sequence token
UPDATE_FLOPS_PER_PARAM_TOKEN = 6


def count_params(model_dir: str) -> int:
    """The model's parameters, from its safetensors files' headers (nothing loaded; a tied matrix counts once)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                total += math.prod(f.get_slice(name).get_shape())
    return total


def matmul_peak(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """This machine's fp32 matmul speed, FLOP/s (best of `repeats` n x n products) at `threads` torch threads (0:
    as they are): the peak the MFU is a share of, measured on the same cores as the sides."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        return 2 * n**3 / best
    finally:
        torch.set_num_threads(before)


def mfu(summary: dict, prompt_tokens: int, params: int, peak: float, *, update: bool = False) -> float:
    """The share of `peak` a side's timed iterations used: FLOPS_PER_PARAM_TOKEN * params * (prompt and reply
    tokens) per second. `prompt_tokens`: an iteration's prompt tokens (every prompt once per sample). `update`:
    the update's share of those FLOPs (UPDATE_FLOPS_PER_PARAM_TOKEN) over its own time (the mean `update_s`)."""
    tokens = summary["iterations"] * prompt_tokens + summary["tokens"]
    if update:
        return UPDATE_FLOPS_PER_PARAM_TOKEN * params * tokens / (summary["update_s"] * summary["iterations"]) / peak
    return FLOPS_PER_PARAM_TOKEN * params * tokens / summary["seconds"] / peak
