"""Tensor helpers shared by the algos tests (no tests here): literal tensors, random token batches, and
random multi-turn episodes laid out as the store's turns are."""

from __future__ import annotations

import math
import random

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from trajlake.train.algos import turns as AT

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUICK = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T64 = torch.float64


def t(x, dtype=T64):
    return torch.tensor(x, dtype=dtype)


def random_batch(seed: int, B: int, T: int, p_agent: float = 0.6):
    """Random rewards, values and an agent mask (B, T) from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < p_agent).to(T64)
    rewards = torch.randn(B, T, generator=g, dtype=T64)
    values = torch.randn(B, T, generator=g, dtype=T64)
    return g, rewards, values, mask


batch_shapes = st.tuples(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 12))


# ------------------------------------------------------------------------------------------ random episodes
#
# An episode is a group number and a list of turns; a turn has a prompt length p, a reply length a (agent
# tokens), a reward r (dyadic, so that sums are exact in any order and "all equal" means the same in the
# loops and in the tensors), an anchor key (a small alphabet so that states repeat; None = unknown) and a
# value v. Laid out as the store's turns are: per turn, p prompt tokens then a agent tokens.

REWARDS = [0.0, 0.0, 1.0, -0.5, 0.25, 2.0]


def random_episodes(seed: int, group_sizes: list[int], max_turns: int = 4, n_states: int = 3,
                    empty_replies: bool = False) -> list[dict]:
    rng = random.Random(seed)
    eps = []
    for g, size in enumerate(group_sizes):
        for _ in range(size):
            turns = [dict(p=rng.randint(1, 3), a=rng.randint(0 if empty_replies and k else 1, 3),
                          r=rng.choice(REWARDS), key=None if rng.random() < 0.1 else f"s{rng.randrange(n_states)}",
                          v=rng.choice([-1.0, 0.0, 0.5, 1.5]) + rng.random())
                     for k in range(rng.randint(1, max_turns))]
            eps.append(dict(group=f"g{g}", turns=turns))
    rng.shuffle(eps)  # groups interleaved
    return eps


def layout(eps: list[dict], seed: int = 0, pad: int = 2):
    """Tensors for `eps`: each turn's reward on one of its agent tokens (the last), its value on its first
    agent token, and noise everywhere else (prompt and padding positions, other agent tokens' values)."""
    g = torch.Generator().manual_seed(seed)
    ti = AT.turn_index_from_lengths([[x["p"] for x in e["turns"]] for e in eps],
                                    [[x["a"] for x in e["turns"]] for e in eps])
    ti = torch.cat([ti, torch.full((len(eps), pad), -1, dtype=torch.long)], dim=1)
    B, T = ti.shape
    mask = (ti >= 0).to(T64)
    rewards = torch.where(mask.bool(), torch.zeros(B, T, dtype=T64), 50 * torch.randn(B, T, generator=g, dtype=T64))
    values = 50 * torch.randn(B, T, generator=g, dtype=T64)
    for b, e in enumerate(eps):
        for k, x in enumerate(e["turns"]):
            pos = (ti[b] == k).nonzero()[:, 0].tolist()
            if pos:
                rewards[b, pos[-1]] = x["r"]
                values[b, pos[0]] = x["v"]
    return dict(token_level_rewards=rewards, mask=mask, values=values, turn_index=ti,
                group_ids=[e["group"] for e in eps], step_keys=[[x["key"] for x in e["turns"]] for e in eps])


def broadcast_ref(per_turn: list[dict[int, float]], ti: torch.Tensor) -> torch.Tensor:
    """Per-row {turn: value} -> (B, T): each agent token (turn_index >= 0) gets its turn's value."""
    out = torch.zeros(ti.shape, dtype=T64)
    for b, row in enumerate(per_turn):
        for i in range(ti.shape[1]):
            k = int(ti[b, i])
            if k >= 0:
                out[b, i] = row[k]
    return out


def valid_turns(e: dict, include_empty: bool = False) -> list[tuple[int, dict]]:
    """(turn number, turn) of the turns that count: those with agent tokens (the default turn_mask)."""
    return [(k, x) for k, x in enumerate(e["turns"]) if x["a"] > 0 or include_empty]


def returns_ref(turns: list[tuple[int, dict]], gamma: float) -> dict[int, float]:
    out, run = {}, 0.0
    for k, x in reversed(turns):
        run = x["r"] + gamma * run
        out[k] = run
    return out


def center_ref(x: float, pop: list[float], norm: bool, eps: float) -> float:
    """x minus the population's mean, over its unbiased std + eps when norm and the std is > 0; a population
    of equal values has exactly that value as mean and std 0."""
    if len(set(pop)) == 1:
        mean, std = pop[0], 0.0
    else:
        mean = sum(pop) / len(pop)
        std = math.sqrt(sum((p - mean) ** 2 for p in pop) / (len(pop) - 1))
    a = x - mean
    return a / (std + eps) if norm and std > 0 else a


