"""The turn structure of stored episodes, as the turn-level estimators (train/algos/turns.py) read it.

train/batch.py lays a row out as, for each turn in order, its prompt ids then its response ids; these build
each response token's turn number (`turn_index`, -1 elsewhere) and an id of the observation each turn
answered (`step_keys`, GiGPO's anchor state) from what the store keeps per turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

__all__ = ["observation_key", "step_keys_from_observations", "turn_index_from_lengths", "turn_index_from_mask"]


def turn_index_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Each maximal run of agent tokens in a row is one turn: mask (B, T) -> turn_index (B, T) long.

    The k-th run (0-based) of non-zero entries of a row gets k; positions outside the mask get -1.
    Two turns with nothing between them (an empty prompt) become one run, and a turn with an empty reply
    has no run, so later turns shift: use :func:`turn_index_from_lengths` where that can happen.
    """
    m = mask != 0  # any non-zero entry is an agent token, as everywhere in train/algos.py
    start = m.clone()
    start[..., 1:] &= ~m[..., :-1]
    run = torch.cumsum(start.long(), dim=-1) - 1
    return torch.where(m, run, torch.full_like(run, -1))


def turn_index_from_lengths(prompt_lengths: Sequence[Sequence[int]], response_lengths: Sequence[Sequence[int]],
                            width: int | None = None, device=None) -> torch.Tensor:
    """turn_index (B, T) long for sequences laid out as the store's turns are (train/batch.py): for each
    turn in order, its prompt ids then its response ids.

    ``prompt_lengths[b][k]``, ``response_lengths[b][k]``: the token counts of turn k of row b (the turns
    table's num_prompt_tokens / num_response_tokens). The response tokens of turn k get k; every other
    position (prompts, padding) gets -1. ``width``: T (default: the longest row).
    """
    if len(prompt_lengths) != len(response_lengths):
        raise ValueError(f"{len(prompt_lengths)} rows of prompt lengths, {len(response_lengths)} of response lengths")
    vals: list[int] = []  # per turn: -1 (its prompt) then k (its reply) ...
    reps: list[int] = []  # ... repeated this many times
    lens: list[int] = []
    for b, (ps, rs) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        if len(ps) != len(rs):
            raise ValueError(f"row {b}: {len(ps)} prompt lengths for {len(rs)} turns")
        n = 0
        for k, (p, r) in enumerate(zip(ps, rs, strict=True)):
            p, r = int(p), int(r)
            if p < 0 or r < 0:
                raise ValueError(f"row {b} turn {k}: negative token count")
            vals += (-1, k)
            reps += (p, r)
            n += p + r
        lens.append(n)
    B = len(lens)
    T = max(lens, default=0) if width is None else int(width)
    if lens and max(lens) > T:
        b = max(range(B), key=lens.__getitem__)
        raise ValueError(f"row {b} has {lens[b]} tokens, more than width {T}")
    flat = torch.tensor(vals, dtype=torch.long).repeat_interleave(torch.tensor(reps, dtype=torch.long))
    length = torch.tensor(lens, dtype=torch.long)
    rows = torch.arange(B).repeat_interleave(length)
    cols = torch.arange(flat.numel()) - (torch.cumsum(length, 0) - length).repeat_interleave(length)
    out = torch.full((B, T), -1, dtype=torch.long)
    out[rows, cols] = flat
    return out if device is None else out.to(device)


def observation_key(text: str | None) -> int:
    """A stable integer id of an observation text, for ``step_keys``: the first 63 bits of its BLAKE2b
    digest (the same in every process and run, unlike ``hash``); -1 for None (unknown)."""
    if text is None:
        return -1
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def step_keys_from_observations(observations: Sequence[Sequence[str | None]], device=None) -> torch.Tensor:
    """``step_keys`` (B, K) int64 from each row's per-turn observation texts (the turns table's
    ``observation``: the observation the turn's reply answered), padded with -1 to the longest row."""
    K = max((len(o) for o in observations), default=0)
    out = torch.full((len(observations), K), -1, dtype=torch.long, device=device)
    for b, obs in enumerate(observations):
        if obs:
            out[b, :len(obs)] = torch.tensor([observation_key(o) for o in obs], dtype=torch.long)
    return out
