"""train/algos/turns.py: turn-level advantages (gigpo, turn_reinforce, turn_gae) against plain-Python loops,
hand-computed golden values, invariances (masked positions and absent turns change nothing), errors and
gradients; and the helpers that build turn_index and step_keys."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.algos_helpers import FAST, T64, broadcast_ref, center_ref, layout, random_episodes, returns_ref, valid_turns
from trajlake.train import algos as A
from trajlake.train.algos import turns as AT

# ------------------------------------------------------------------------------------------ reference loops


def gigpo_ref(eps_list, gamma, norm, eps, weight, episode_stats="episodes", scores=None, include_empty=False):
    turns = [valid_turns(e, include_empty) for e in eps_list]
    R = [sum(x["r"] for _, x in ts) for ts in turns] if scores is None else list(scores)
    G = [returns_ref(ts, gamma) for ts in turns]
    pops: dict[str, list[float]] = {}
    for b, e in enumerate(eps_list):
        pops.setdefault(e["group"], []).extend([R[b]] * (len(turns[b]) if episode_stats == "turns" else 1))
    step_groups: dict[tuple, list[float]] = {}
    for b, e in enumerate(eps_list):
        for k, x in turns[b]:
            key = (e["group"], x["key"]) if x["key"] is not None else ("unknown", b, k)
            step_groups.setdefault(key, []).append(G[b][k])
    out = []
    for b, e in enumerate(eps_list):
        a_ep = center_ref(R[b], pops[e["group"]], norm, eps)
        row = {}
        for k, x in turns[b]:
            key = (e["group"], x["key"]) if x["key"] is not None else ("unknown", b, k)
            row[k] = a_ep + weight * center_ref(G[b][k], step_groups[key], norm, eps)
        out.append(row)
    return out


def turn_reinforce_ref(eps_list, gamma, baseline, norm, eps):
    turns = [valid_turns(e) for e in eps_list]
    G = [returns_ref(ts, gamma) for ts in turns]
    out = []
    for b, e in enumerate(eps_list):
        same = [c for c in range(len(eps_list)) if eps_list[c]["group"] == e["group"]]
        row = {}
        for k, _ in turns[b]:
            if baseline == "none":
                row[k] = G[b][k]
            elif baseline == "turn":
                row[k] = center_ref(G[b][k], [G[c][k] for c in same if k in G[c]], norm, eps)
            else:  # episode: each episode's return from its first turn
                row[k] = center_ref(G[b][k], [G[c][turns[c][0][0]] for c in same if turns[c]], norm, eps)
        out.append(row)
    return out, G


def turn_gae_ref(eps_list, gamma, lam):
    adv, ret = [], []
    for e in eps_list:
        ts = valid_turns(e)
        a_row, r_row, next_v, next_a = {}, {}, 0.0, 0.0
        for k, x in reversed(ts):
            delta = x["r"] + gamma * next_v - x["v"]
            next_a = delta + gamma * lam * next_a
            next_v = x["v"]
            a_row[k], r_row[k] = next_a, next_a + x["v"]
        adv.append(a_row)
        ret.append(r_row)
    return adv, ret


groups_strategy = st.lists(st.integers(1, 4), min_size=1, max_size=4)  # group sizes (1 = a singleton group)


# ---------------------------------------------------------------------------------------- loops vs tensors


@FAST
@given(st.integers(0, 10_000), groups_strategy, st.integers(1, 5), st.sampled_from([1.0, 0.9, 0.5]),
       st.booleans(), st.sampled_from([1.0, 0.5]), st.sampled_from(["episodes", "turns"]))
def test_gigpo_matches_loop(seed, sizes, max_turns, gamma, norm, weight, stats):
    eps_list = random_episodes(seed, sizes, max_turns)
    kw = layout(eps_list, seed)
    adv, ret = A.ADVANTAGES["gigpo"](**kw, gamma=gamma, norm_by_std=norm, step_advantage_weight=weight,
                                     episode_stats=stats)
    ref = broadcast_ref(gigpo_ref(eps_list, gamma, norm, 1e-6, weight, stats), kw["turn_index"])
    torch.testing.assert_close(adv, ref)
    assert torch.equal(ret, adv) and adv.dtype == T64


@FAST
@given(st.integers(0, 10_000), groups_strategy, st.integers(1, 5), st.sampled_from([1.0, 0.75, 0.5]),
       st.sampled_from(AT.TURN_BASELINES), st.booleans())
def test_turn_reinforce_matches_loop(seed, sizes, max_turns, gamma, baseline, norm):
    eps_list = random_episodes(seed, sizes, max_turns)
    kw = layout(eps_list, seed)
    adv, ret = A.ADVANTAGES["turn_reinforce"](**kw, gamma=gamma, baseline=baseline, norm_by_std=norm)
    ref, G = turn_reinforce_ref(eps_list, gamma, baseline, norm, 1e-6)
    torch.testing.assert_close(adv, broadcast_ref(ref, kw["turn_index"]))
    torch.testing.assert_close(ret, broadcast_ref(G, kw["turn_index"]))
    white, _ = A.ADVANTAGES["turn_reinforce"](**kw, gamma=gamma, baseline=baseline, norm_by_std=norm, whiten=True)
    torch.testing.assert_close(white, A.masked_whiten(adv, kw["mask"]))


@FAST
@given(st.integers(0, 10_000), groups_strategy, st.integers(1, 5), st.sampled_from([1.0, 0.9, 0.5]),
       st.sampled_from([1.0, 0.95, 0.5, 0.0]))
def test_turn_gae_matches_loop(seed, sizes, max_turns, gamma, lam):
    eps_list = random_episodes(seed, sizes, max_turns)
    kw = layout(eps_list, seed)
    adv, ret = A.ADVANTAGES["turn_gae"](**kw, gamma=gamma, lam=lam)
    a_ref, r_ref = turn_gae_ref(eps_list, gamma, lam)
    torch.testing.assert_close(adv, broadcast_ref(a_ref, kw["turn_index"]))
    torch.testing.assert_close(ret, broadcast_ref(r_ref, kw["turn_index"]))
    white, ret2 = A.ADVANTAGES["turn_gae"](**kw, gamma=gamma, lam=lam, whiten=True)
    torch.testing.assert_close(white, A.masked_whiten(adv, kw["mask"]))
    assert torch.equal(ret2, ret)  # returns from the unwhitened advantages
    # turn_values (B, K) instead of values (B, T): the same
    K = int(kw["turn_index"].max()) + 1
    tv = torch.full((len(eps_list), K), math.nan, dtype=T64)
    for b, e in enumerate(eps_list):
        for k, x in enumerate(e["turns"]):
            tv[b, k] = x["v"]
    adv2, ret3 = AT.compute_turn_gae(**{**kw, "values": None}, turn_values=tv, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret3, ret)


@FAST
@given(st.integers(0, 10_000), groups_strategy, st.sampled_from([1.0, 0.5]))
def test_empty_replies_are_skipped_and_explicit_turn_mask_counts_them(seed, sizes, gamma):
    # turns with an empty reply have no agent token: by default they are not turns at all (their reward,
    # key and value are ignored; the store's allocation drops their process rewards likewise) ...
    eps_list = random_episodes(seed, sizes, 5, empty_replies=True)
    kw = layout(eps_list, seed)
    adv, _ = AT.compute_gigpo(**kw, gamma=gamma)
    torch.testing.assert_close(adv, broadcast_ref(gigpo_ref(eps_list, gamma, True, 1e-6, 1.0), kw["turn_index"]))
    adv, _ = AT.compute_turn_gae(**kw, gamma=gamma, lam=0.9)
    torch.testing.assert_close(adv, broadcast_ref(turn_gae_ref(eps_list, gamma, 0.9)[0], kw["turn_index"]))
    # ... and with an explicit turn_mask and turn_rewards they count (discounted over, grouped by key)
    K = max(len(e["turns"]) for e in eps_list)
    tm = torch.zeros(len(eps_list), K, dtype=torch.bool)
    tr = torch.full((len(eps_list), K), math.nan, dtype=T64)  # NaN on absent turns: ignored
    for b, e in enumerate(eps_list):
        for k, x in enumerate(e["turns"]):
            tm[b, k], tr[b, k] = True, x["r"]
    adv, _ = AT.compute_gigpo(**kw, gamma=gamma, turn_mask=tm, turn_rewards=tr)
    ref = gigpo_ref(eps_list, gamma, True, 1e-6, 1.0, include_empty=True)
    torch.testing.assert_close(adv, broadcast_ref(ref, kw["turn_index"]))


# -------------------------------------------------------------------------------- agreement with algos.py


@pytest.mark.parametrize("seed", range(4))
def test_one_token_turns_reduce_to_the_token_level_estimators(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    mask = (torch.rand(B, T, generator=g) < 0.6).to(T64)
    mask[:, 0] = 1
    r = torch.randn(B, T, generator=g, dtype=T64)
    v = torch.randn(B, T, generator=g, dtype=T64)
    ti = torch.where(mask.bool(), torch.cumsum(mask, -1).long() - 1, -1)  # every agent token its own turn
    kw = dict(token_level_rewards=r, mask=mask, values=v, turn_index=ti, gamma=0.9, lam=0.8)
    for whiten in (False, True):
        torch.testing.assert_close(AT.compute_turn_gae(**kw, whiten=whiten),
                                   A.compute_gae(token_level_rewards=r, mask=mask, values=v, gamma=0.9, lam=0.8,
                                                 whiten=whiten))
    ret = AT.compute_turn_reinforce(**kw)[1]
    torch.testing.assert_close(ret, A.compute_reinforce_plus_plus(token_level_rewards=r, mask=mask, gamma=0.9)[1])
    torch.testing.assert_close(AT.compute_turn_reinforce(**kw, whiten=True)[0],
                               A.compute_reinforce_plus_plus(token_level_rewards=r, mask=mask, gamma=0.9)[0])


@pytest.mark.parametrize("seed", range(4))
def test_gigpo_without_step_credit_is_grpo(seed):
    eps_list = random_episodes(seed, [3, 1, 4, 2])
    kw = layout(eps_list, seed)
    grpo, _ = A.compute_grpo(token_level_rewards=kw["token_level_rewards"], mask=kw["mask"],
                             group_ids=kw["group_ids"])
    torch.testing.assert_close(AT.compute_gigpo(**kw, step_advantage_weight=0.0)[0], grpo)
    # every anchor unknown: every step group is a singleton, step advantages are exactly 0
    unknown = [[None] * len(e["turns"]) for e in eps_list]
    torch.testing.assert_close(AT.compute_gigpo(**kw | {"step_keys": unknown})[0], grpo)
    # as integer ids, negative = unknown
    ints = -torch.ones(len(eps_list), 5, dtype=torch.long)
    torch.testing.assert_close(AT.compute_gigpo(**kw | {"step_keys": ints})[0], grpo)
    # explicit scores replace the summed turn rewards at the episode level
    s = torch.arange(len(eps_list), dtype=T64)
    grpo_s, _ = A.compute_grpo(token_level_rewards=kw["token_level_rewards"], mask=kw["mask"],
                               group_ids=kw["group_ids"], scores=s)
    torch.testing.assert_close(AT.compute_gigpo(**kw, scores=s, step_advantage_weight=0.0)[0], grpo_s)


def test_step_keys_as_texts_ints_and_numpy_agree():
    import numpy as np

    eps_list = random_episodes(7, [4, 3], 4)
    kw = layout(eps_list, 7)
    K = max(len(e["turns"]) for e in eps_list)
    texts = [[x["key"] for x in e["turns"]] for e in eps_list]
    ints = AT.step_keys_from_observations(texts)
    assert ints.shape == (len(eps_list), K) and ints.dtype == torch.long
    ref, _ = AT.compute_gigpo(**kw)
    torch.testing.assert_close(AT.compute_gigpo(**kw | {"step_keys": ints})[0], ref)
    torch.testing.assert_close(AT.compute_gigpo(**kw | {"step_keys": ints.numpy()})[0], ref)
    obj = np.empty((len(eps_list), K), dtype=object)  # a numpy array of texts is a table of hashables
    for b, row in enumerate(texts):
        obj[b, :len(row)] = row
    torch.testing.assert_close(AT.compute_gigpo(**kw | {"step_keys": obj})[0], ref)


