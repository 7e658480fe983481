"""train/algos advantages (GAE, the group estimators, REINFORCE++) against plain loops and hand-computed
values; losses, KL and aggregation are in test_algos_losses.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.algos_helpers import FAST, T64, batch_shapes, random_batch, t
from trajlake.train import algos as A

# -------------------------------------------------------------------------------------- reference loops


def gae_reference(rewards, values, mask, gamma, lam):
    """Textbook GAE on each row's agent tokens, compacted in order (plain Python floats)."""
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=T64)
    for b in range(B):
        idx = [i for i in range(T) if mask[b, i] != 0]
        last = 0.0
        for k in reversed(range(len(idx))):
            i = idx[k]
            next_v = float(values[b, idx[k + 1]]) if k + 1 < len(idx) else 0.0
            delta = float(rewards[b, i]) + gamma * next_v - float(values[b, i])
            last = delta + gamma * lam * last
            adv[b, i] = last
    return adv


def returns_to_go_reference(rewards, mask, gamma):
    B, T = rewards.shape
    out = torch.zeros(B, T, dtype=T64)
    for b in range(B):
        run = 0.0
        for i in reversed(range(T)):
            if mask[b, i] != 0:
                run = float(rewards[b, i]) + gamma * run
                out[b, i] = run
    return out


# ----------------------------------------------------------------------------------------------------- GAE


@FAST
@given(batch_shapes, st.sampled_from([0.0, 0.5, 0.9, 1.0]), st.sampled_from([0.0, 0.7, 0.95, 1.0]))
def test_gae_matches_reference_loop(shape, gamma, lam):
    seed, B, T = shape
    _, r, v, m = random_batch(seed, B, T)
    adv, ret = A.ADVANTAGES["gae"](token_level_rewards=r, values=v, mask=m, gamma=gamma, lam=lam)
    ref = gae_reference(r, v, m, gamma, lam)
    assert adv.shape == ret.shape == (B, T)
    torch.testing.assert_close(adv, ref)
    torch.testing.assert_close(ret, (ref + v) * m)
    assert torch.all(adv[m == 0] == 0) and torch.all(ret[m == 0] == 0)


@FAST
@given(batch_shapes, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_ignores_values_and_rewards_at_masked_tokens(shape, gamma, lam):
    seed, B, T = shape
    g, r, v, m = random_batch(seed, B, T)
    adv, ret = A.compute_gae(token_level_rewards=r, values=v, mask=m, gamma=gamma, lam=lam)
    noise_v = torch.where(m.bool(), v, 100 * torch.randn(B, T, generator=g, dtype=T64))
    noise_r = torch.where(m.bool(), r, 100 * torch.randn(B, T, generator=g, dtype=T64))
    adv2, ret2 = A.compute_gae(token_level_rewards=noise_r, values=noise_v, mask=m, gamma=gamma, lam=lam)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    # even NaN / inf stored at environment tokens changes nothing
    bad = torch.where(m.bool(), v, torch.full_like(v, math.nan))
    bad[..., ::2] = torch.where(m[..., ::2].bool(), bad[..., ::2], math.inf)
    adv3, _ = A.compute_gae(token_level_rewards=r, values=bad, mask=m, gamma=gamma, lam=lam)
    assert torch.equal(adv, adv3)


def test_gae_environment_tokens_neither_carry_nor_break():
    # the same agent tokens with or without environment tokens between them: identical advantages
    r, v = t([[0.0, 1.0, 0.0, 2.0]]), t([[0.3, 0.1, 0.4, 0.2]])
    m = torch.ones(1, 4, dtype=T64)
    a, _ = A.compute_gae(token_level_rewards=r, values=v, mask=m, gamma=0.9, lam=0.8)
    r2 = t([[9.0, 0.0, 1.0, 5.0, 5.0, 0.0, 2.0, 7.0]])
    v2 = t([[9.0, 0.3, 0.1, 5.0, 5.0, 0.4, 0.2, 7.0]])
    m2 = t([[0, 1, 1, 0, 0, 1, 1, 0]])
    a2, _ = A.compute_gae(token_level_rewards=r2, values=v2, mask=m2, gamma=0.9, lam=0.8)
    torch.testing.assert_close(a2[0, [1, 2, 5, 6]], a[0])


GOLD_R = t([[0.0, 0.0, 1.0, 0.0, 2.0]])
GOLD_V = t([[9.0, 0.5, 1.0, 7.0, 2.0]])
GOLD_M = t([[0, 1, 1, 0, 1]])


def test_gae_golden_gamma_lam_1():
    adv, ret = A.compute_gae(token_level_rewards=GOLD_R, values=GOLD_V, mask=GOLD_M, gamma=1.0, lam=1.0)
    # with gamma = lam = 1: A_t = (sum of rewards from t on) - V_t
    torch.testing.assert_close(adv, t([[0.0, 2.5, 2.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, t([[0.0, 3.0, 3.0, 0.0, 2.0]]))


def test_gae_golden_gamma_lam_half():
    adv, ret = A.compute_gae(token_level_rewards=GOLD_R, values=GOLD_V, mask=GOLD_M, gamma=0.5, lam=0.5)
    # t4: 2 - 2 = 0; t2: delta = 1 + .5*2 - 1 = 1, A = 1; t1: delta = 0 + .5*1 - .5 = 0, A = .25 * 1
    torch.testing.assert_close(adv, t([[0.0, 0.25, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, t([[0.0, 0.75, 2.0, 0.0, 2.0]]))


def test_gae_whiten_flag_and_dtype():
    _, r, v, m = random_batch(3, 4, 9)
    raw, ret = A.compute_gae(token_level_rewards=r, values=v, mask=m, gamma=0.9, lam=0.9)
    w, ret_w = A.compute_gae(token_level_rewards=r, values=v, mask=m, gamma=0.9, lam=0.9, whiten=True)
    torch.testing.assert_close(w, A.masked_whiten(raw, m))
    torch.testing.assert_close(ret_w, ret)  # returns are from the unwhitened advantages
    assert abs(float(A.masked_mean(w, m))) < 1e-9
    assert abs(float(A.masked_var(w, m)) - 1) < 1e-6
    a32, _ = A.compute_gae(token_level_rewards=r.float(), values=v.bfloat16(), mask=m.bool(), gamma=0.9, lam=0.9)
    assert a32.dtype == torch.float32
    with pytest.raises(ValueError, match="values"):
        A.compute_gae(token_level_rewards=r, mask=m)


# -------------------------------------------------------------------------------------- group estimators

# groups interleaved: a = rows 0, 2, 3, 5 (scores 1, 0, 1, 0); b = rows 1, 4 (scores 2, 4)
GROUPS = ["a", "b", "a", "a", "b", "a"]
SCORES = t([1.0, 2.0, 0.0, 1.0, 4.0, 0.0])
GMASK = t([[1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [0, 0, 1], [1, 1, 0]])
GREW = torch.zeros(6, 3, dtype=T64)


def seq_adv(adv, mask):
    """The per-sequence advantage of a (B, T) broadcast one, checking it is constant on the mask."""
    out = []
    for row, mrow in zip(adv, mask, strict=True):
        vals = row[mrow != 0]
        assert torch.all(vals == vals[0]) and torch.all(row[mrow == 0] == 0)
        out.append(float(vals[0]))
    return t(out)


def test_grpo_golden_two_groups():
    adv, ret = A.ADVANTAGES["grpo"](token_level_rewards=GREW, mask=GMASK, scores=SCORES, group_ids=GROUPS, eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # group a: mean .5, unbiased std sqrt(1/3)
    b = 1 / math.sqrt(2)  # group b: mean 3, unbiased std sqrt(2)
    torch.testing.assert_close(seq_adv(adv, GMASK), t([a, -b, -a, a, b, -a]))
    assert torch.equal(ret, adv)


def test_grpo_scores_from_token_rewards_and_int_groups():
    # the same scores, put as token rewards (summed over the mask; off-mask rewards ignored)
    rew = torch.zeros(6, 3, dtype=T64)
    last = [1, 2, 0, 2, 2, 1]
    for i, j in enumerate(last):
        rew[i, j] = SCORES[i]
    rew[0, 2] = 100.0  # off the mask
    adv, _ = A.compute_grpo(token_level_rewards=rew, mask=GMASK, group_ids=torch.tensor([0, 1, 0, 0, 1, 0]), eps=0.0)
    ref, _ = A.compute_grpo(token_level_rewards=GREW, mask=GMASK, scores=SCORES, group_ids=GROUPS, eps=0.0)
    torch.testing.assert_close(adv, ref)


def test_grpo_no_std_and_dr_grpo_and_rloo_golden():
    kw = dict(token_level_rewards=GREW, mask=GMASK, scores=SCORES, group_ids=GROUPS)
    expect = t([0.5, -1.0, -0.5, 0.5, 1.0, -0.5])
    torch.testing.assert_close(seq_adv(A.compute_grpo(**kw, norm_by_std=False)[0], GMASK), expect)
    torch.testing.assert_close(seq_adv(A.ADVANTAGES["dr_grpo"](**kw)[0], GMASK), expect)
    # rloo: group a: 1 - (2 - 1)/3 = 2/3, 0 - 2/3; group b: 2 - 4, 4 - 2
    rloo = seq_adv(A.ADVANTAGES["rloo"](**kw)[0], GMASK)
    torch.testing.assert_close(rloo, t([2 / 3, -2.0, -2 / 3, 2 / 3, 2.0, -2 / 3]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("value", [0.1, 1.0, -3.7, 0.0])
@pytest.mark.parametrize("dtype", [torch.float32, T64])
def test_constant_group_gives_zero(name, value, dtype):
    scores = torch.full((5,), value, dtype=dtype)
    scores = torch.cat([scores, torch.tensor([1.0, 2.0], dtype=dtype)])
    mask = torch.ones(7, 4, dtype=dtype)
    adv, _ = A.ADVANTAGES[name](token_level_rewards=torch.zeros(7, 4, dtype=dtype), mask=mask, scores=scores,
                                group_ids=[7] * 5 + [8, 8])
    assert torch.all(adv[:5] == 0)
    assert torch.all(adv[5:] != 0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_singleton_group_gives_zero_and_group_id_errors(name):
    adv, _ = A.ADVANTAGES[name](token_level_rewards=GREW, mask=GMASK, scores=SCORES, group_ids=[0, 1, 2, 3, 4, 4])
    assert torch.all(adv[:4] == 0) and torch.all(adv[4:][GMASK[4:] != 0] != 0)
    with pytest.raises(ValueError, match="group_ids"):
        A.ADVANTAGES[name](token_level_rewards=GREW, mask=GMASK)
    with pytest.raises(ValueError):
        A.ADVANTAGES[name](token_level_rewards=GREW, mask=GMASK, group_ids=[0, 1])


@FAST
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 5))
def test_group_estimators_match_loops(seed, n_groups, size):
    g = torch.Generator().manual_seed(seed)
    B = n_groups * size
    ids = torch.randperm(B, generator=g) % n_groups
    scores = torch.randint(0, 3, (B,), generator=g).to(T64) + 0.25 * torch.randn(B, generator=g, dtype=T64)
    mask = torch.ones(B, 2, dtype=T64)
    kw = dict(token_level_rewards=torch.zeros(B, 2, dtype=T64), mask=mask, scores=scores, group_ids=ids)
    grpo, rloo, dr = (seq_adv(A.ADVANTAGES[n](**kw)[0], mask) for n in ("grpo", "rloo", "dr_grpo"))
    for i in range(B):
        grp = [float(scores[j]) for j in range(B) if ids[j] == ids[i]]
        s = float(scores[i])
        if len(grp) == 1 or len(set(grp)) == 1:
            assert grpo[i] == rloo[i] == dr[i] == 0
            continue
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (len(grp) - 1))
        assert grpo[i] == pytest.approx((s - mean) / (std + 1e-6), rel=1e-9, abs=1e-9)
        assert dr[i] == pytest.approx(s - mean, abs=1e-9)
        assert rloo[i] == pytest.approx(s - (sum(grp) - s) / (len(grp) - 1), abs=1e-9)


# ------------------------------------------------------------------------------------------ REINFORCE++


@FAST
@given(batch_shapes, st.sampled_from([0.5, 0.99, 1.0]))
def test_reinforce_plus_plus(shape, gamma):
    seed, B, T = shape
    _, r, v, m = random_batch(seed, B, T)
    adv, ret = A.ADVANTAGES["reinforce++"](token_level_rewards=r, mask=m, gamma=gamma)
    ref = returns_to_go_reference(r, m, gamma)
    torch.testing.assert_close(ret, ref)
    torch.testing.assert_close(adv, A.masked_whiten(ref, m))
    assert torch.all(adv[m == 0] == 0)
    if m.sum() > 1:
        assert abs(float(A.masked_mean(adv, m))) < 1e-9
    # a critic's values, if passed, change nothing
    adv2, _ = A.ADVANTAGES["reinforce_plus_plus"](token_level_rewards=r, mask=m, gamma=gamma, values=v)
    assert torch.equal(adv, adv2)


def test_reinforce_plus_plus_golden():
    r = t([[0.0, 1.0, 0.0, 2.0]])
    m = t([[1, 1, 0, 1]])
    _, ret = A.compute_reinforce_plus_plus(token_level_rewards=r, mask=m, gamma=0.5)
    torch.testing.assert_close(ret, t([[1.0, 2.0, 0.0, 2.0]]))  # 0 + .5*(1 + .5*2), 1 + .5*2, -, 2


