"""train/algos/turns.py: hand-computed golden values, invariances, gradients and dtypes, and errors of the
turn-level estimators (their loop references are in test_algos_turns.py)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.algos_helpers import T64, layout, random_episodes, t
from trajlake.train import algos as A
from trajlake.train.algos import turns as AT

# ------------------------------------------------------------------------------------------ golden values
#
# One group of two episodes, gamma = 0.5, anchor states A, B, C:
#   ep0: A -> B -> C, rewards 0, 0, 1 (success on turn 2); returns G = 0.25, 0.5, 1;   R0 = 1
#   ep1: A -> B -> A -> B, rewards 0, 0, 0, 0 (goes in circles);   returns G = 0, 0, 0, 0;   R1 = 0
# Token layout (p = prompt, a = agent): ep0 = p p a a | p a | p a a a;  ep1 = p a | p a a | p a | p a a
# Step groups: A = {ep0 t0: .25, ep1 t0: 0, ep1 t2: 0}, B = {ep0 t1: .5, ep1 t1: 0, ep1 t3: 0}, C = {ep0 t2: 1}

GOLD_TI = t([[-1, -1, 0, 0, -1, 1, -1, 2, 2, 2, -1],
             [-1, 0, -1, 1, 1, -1, 2, -1, 3, 3, -1]], dtype=torch.long)
GOLD_M = (GOLD_TI >= 0).to(T64)
GOLD_R = torch.where(GOLD_M.bool(), 0.0, 7.0).to(T64)  # 7 on prompt/padding positions: must be ignored
GOLD_R[0, 9] = 1.0
GOLD_KEYS = [["A", "B", "C"], ["A", "B", "A", "B"]]
GOLD = dict(token_level_rewards=GOLD_R, mask=GOLD_M, turn_index=GOLD_TI, group_ids=["g", "g"], gamma=0.5, eps=0.0)


def per_turn(adv: torch.Tensor, ti: torch.Tensor = GOLD_TI) -> list[list[float]]:
    """The advantage of each turn of each row (0.0 for a turn without tokens), checking it is constant over
    the turn's tokens."""
    out = []
    for b in range(ti.shape[0]):
        row = []
        for k in range(int(ti[b].max()) + 1):
            vals = adv[b][ti[b] == k]
            assert torch.all(vals == vals[0]) if len(vals) else True
            row.append(float(vals[0]) if len(vals) else 0.0)
        out.append(row)
        assert torch.all(adv[b][ti[b] < 0] == 0)
    return out


def approx(rows):
    return [pytest.approx(r, abs=1e-12) for r in rows]


def test_gigpo_golden_mean_norm():
    adv, _ = AT.compute_gigpo(**GOLD, step_keys=GOLD_KEYS, norm_by_std=False)
    # episode: R = 1, 0, mean .5 -> +-.5
    # A: mean .25/3 = 1/12 -> ep0 t0: 1/4 - 1/12 = 1/6; ep1 t0, t2: -1/12
    # B: mean .5/3 = 1/6 -> ep0 t1: 1/2 - 1/6 = 1/3; ep1 t1, t3: -1/6
    # C: a singleton -> 0
    assert per_turn(adv) == approx([[0.5 + 1 / 6, 0.5 + 1 / 3, 0.5],
                                    [-0.5 - 1 / 12, -0.5 - 1 / 6, -0.5 - 1 / 12, -0.5 - 1 / 6]])
    # episode statistics over turns (verl-agent's default): population {1, 1, 1, 0, 0, 0, 0}, mean 3/7
    adv, _ = AT.compute_gigpo(**GOLD, step_keys=GOLD_KEYS, norm_by_std=False, episode_stats="turns",
                             step_advantage_weight=2.0)
    assert per_turn(adv) == approx([[4 / 7 + 2 / 6, 4 / 7 + 2 / 3, 4 / 7],
                                    [-3 / 7 - 2 / 12, -3 / 7 - 2 / 6, -3 / 7 - 2 / 12, -3 / 7 - 2 / 6]])


def test_gigpo_golden_mean_std_norm():
    adv, ret = AT.compute_gigpo(**GOLD, step_keys=GOLD_KEYS)
    # episode: {1, 0}: mean .5, unbiased std sqrt(.5) -> +-.5 / sqrt(.5) = +-1/sqrt(2)
    # A: {1/4, 0, 0}: deviations 1/6, -1/12, -1/12; var = (1/36 + 2/144) / 2 = 1/48 -> std 1/sqrt(48)
    #    -> (1/6) sqrt(48) = 2/sqrt(3); -(1/12) sqrt(48) = -1/sqrt(3). B = 2 x A: the same. C: 0.
    e, up, down = 1 / math.sqrt(2), 2 / math.sqrt(3), 1 / math.sqrt(3)
    assert per_turn(adv) == approx([[e + up, e + up, e], [-e - down, -e - down, -e - down, -e - down]])
    assert torch.equal(ret, adv)


def test_turn_reinforce_golden():
    kw = dict(GOLD, group_ids=["g", "g"])
    adv, ret = AT.compute_turn_reinforce(**kw)
    assert per_turn(adv) == approx([[0.25, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert per_turn(ret) == per_turn(adv)
    # baseline per turn number: t0 {.25, 0}, t1 {.5, 0}, t2 {1, 0}: +- half; t3 {0}: a singleton, 0
    adv, ret = AT.compute_turn_reinforce(**kw, baseline="turn", norm_by_std=False)
    assert per_turn(adv) == approx([[0.125, 0.25, 0.5], [-0.125, -0.25, -0.5, 0.0]])
    assert per_turn(ret) == approx([[0.25, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0]])
    # ... over the std: {x, 0} has std x / sqrt(2): +-1/sqrt(2) on turns 0-2
    adv, _ = AT.compute_turn_reinforce(**kw, baseline="turn")
    h = 1 / math.sqrt(2)
    assert per_turn(adv) == approx([[h, h, h], [-h, -h, -h, 0.0]])
    # baseline the episode returns {.25, 0}: mean .125, std .25 / sqrt(2)
    adv, _ = AT.compute_turn_reinforce(**kw, baseline="episode", norm_by_std=False)
    assert per_turn(adv) == approx([[0.125, 0.375, 0.875], [-0.125] * 4])
    adv, _ = AT.compute_turn_reinforce(**kw, baseline="episode")
    s = 0.25 / math.sqrt(2)
    assert per_turn(adv) == approx([[0.125 / s, 0.375 / s, 0.875 / s], [-0.125 / s] * 4])


def test_turn_gae_golden():
    # one episode, turns p p a a | p a a a | p a, rewards 0, 0, 1, values at the turns' first agent tokens
    # .5, .2, .8 (other agent tokens hold 9s: never read); gamma = lam = .5
    ti = t([[-1, -1, 0, 0, -1, 1, 1, 1, -1, 2]], dtype=torch.long)
    m = (ti >= 0).to(T64)
    r = t([[0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0]])
    v = t([[9, 9, 0.5, 9, 9, 0.2, 9, 9, 9, 0.8]])
    adv, ret = AT.compute_turn_gae(token_level_rewards=r, mask=m, values=v, turn_index=ti, gamma=0.5, lam=0.5)
    # t2: delta = 1 + 0 - .8 = .2, A = .2, R = 1
    # t1: delta = 0 + .5 * .8 - .2 = .2, A = .2 + .25 * .2 = .25, R = .45 = .5 (.5 * .8 + .5 * 1)
    # t0: delta = 0 + .5 * .2 - .5 = -.4, A = -.4 + .25 * .25 = -.3375, R = .1625 = .5 (.5 * .2 + .5 * .45)
    assert per_turn(adv, ti) == approx([[-0.3375, 0.25, 0.2]])
    assert per_turn(ret, ti) == approx([[0.1625, 0.45, 1.0]])


@pytest.mark.parametrize("value", [0.1, 1 / 3, -2.7])
def test_equal_values_give_exactly_zero(value):
    # three episodes of one group with the same (non-dyadic) per-turn rewards and anchors: the means carry no
    # rounding noise, every advantage is exactly 0 whether or not it is divided by a std
    ti = t([[0, 1, 1, 2]] * 3, dtype=torch.long)
    m = torch.ones(3, 4, dtype=T64)
    r = t([[value, 0.0, value, value]] * 3)
    kw = dict(token_level_rewards=r, mask=m, turn_index=ti, group_ids=[5, 5, 5], step_keys=[["a", "b", "c"]] * 3,
              gamma=0.9)
    for norm in (True, False):
        assert torch.all(AT.compute_gigpo(**kw, norm_by_std=norm)[0] == 0)
        for baseline in ("turn", "episode"):
            adv = AT.compute_turn_reinforce(**kw, baseline=baseline, norm_by_std=norm)[0]
            G = AT.compute_turn_reinforce(**kw)[0]
            assert torch.equal(adv, G - G[:, :1]) if baseline == "episode" else torch.all(adv == 0)


def test_episode_baseline_uses_each_episodes_first_turn():
    # row 0's first turn with agent tokens is turn 1 (turn 0 had an empty reply): its episode return is G_1
    ti = t([[-1, -1, 1, 1], [0, -1, 1, -1]], dtype=torch.long)
    m = (ti >= 0).to(T64)
    r = t([[0.0, 0.0, 0.0, 3.0], [1.0, 0.0, 1.0, 0.0]])
    adv, ret = AT.compute_turn_reinforce(token_level_rewards=r, mask=m, turn_index=ti, group_ids=[0, 0], gamma=0.5,
                                         baseline="episode", norm_by_std=False)
    # G: row 0 turn 1: 3; row 1: turn 1: 1, turn 0: 1 + .5 * 1 = 1.5. Episode returns {3, 1.5}, mean 2.25
    assert per_turn(ret, ti) == [[0.0, 3.0], [1.5, 1.0]]  # (row 0 has no turn 0 token: reported as 0)
    assert per_turn(adv, ti) == approx([[0.0, 0.75], [-0.75, -1.25]])


# --------------------------------------------------------------------------------------------- invariance


@pytest.mark.parametrize("name", ["gigpo", "turn_reinforce", "turn_gae"])
@pytest.mark.parametrize("seed", range(3))
def test_masked_positions_and_absent_turns_change_nothing(name, seed):
    eps_list = random_episodes(seed, [3, 2, 1, 4], 4)
    kw = layout(eps_list, seed)
    extra = {"baseline": "turn"} if name == "turn_reinforce" else {}
    adv, ret = A.ADVANTAGES[name](**kw, gamma=0.9, lam=0.7, **extra)
    off = kw["mask"] == 0
    g = torch.Generator().manual_seed(seed + 100)
    noisy = dict(kw)
    noisy["token_level_rewards"] = torch.where(off, math.nan, kw["token_level_rewards"])
    noisy["values"] = torch.where(off, math.inf, kw["values"])
    noisy["turn_index"] = torch.where(off, torch.randint(-9, 99, off.shape, generator=g), kw["turn_index"])
    adv2, ret2 = A.ADVANTAGES[name](**noisy, gamma=0.9, lam=0.7, **extra)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    # values at agent tokens other than a turn's first never matter to turn_gae
    if name == "turn_gae":
        firsts = AT.turn_first_positions(kw["turn_index"], kw["mask"])
        other = kw["mask"].bool().clone()
        for b in range(other.shape[0]):
            other[b, firsts[b][firsts[b] >= 0]] = False
        v3 = torch.where(other, 1e6, kw["values"])
        assert torch.equal(AT.compute_turn_gae(**kw | {"values": v3}, gamma=0.9, lam=0.7)[0], adv)
    # explicit turn inputs: what is stored at absent turns (no agent token, outside turn_mask) is ignored
    K = int(kw["turn_index"].max()) + 1
    tm = torch.zeros(len(eps_list), K + 2, dtype=torch.bool)
    tr = torch.full((len(eps_list), K + 2), -1e9, dtype=T64)
    keys = torch.randint(0, 3, (len(eps_list), K + 2), generator=g)
    for b, e in enumerate(eps_list):
        for k, x in enumerate(e["turns"]):
            tm[b, k], tr[b, k] = True, x["r"]
            keys[b, k] = -1 if x["key"] is None else int(x["key"][1:])
    explicit = dict(kw, turn_mask=tm, turn_rewards=tr)
    if name == "gigpo":
        explicit["step_keys"] = keys
    adv3, ret3 = A.ADVANTAGES[name](**explicit, gamma=0.9, lam=0.7, **extra)
    torch.testing.assert_close(adv3, adv)
    torch.testing.assert_close(ret3, ret)


def test_turn_rewards_default_is_the_per_turn_sum_of_token_rewards():
    eps_list = random_episodes(3, [3, 3], 4)
    kw = layout(eps_list, 3)
    # spread each turn's reward over all its agent tokens: the same per-turn sums, the same advantages
    spread = torch.where(kw["mask"].bool(), 0.0, kw["token_level_rewards"])
    K = int(kw["turn_index"].max()) + 1
    tr = torch.zeros(len(eps_list), K, dtype=T64)
    for b, e in enumerate(eps_list):
        for k, x in enumerate(e["turns"]):
            pos = kw["turn_index"][b] == k
            spread[b][pos] = x["r"] / int(pos.sum())
            tr[b, k] = x["r"]
    for name in ("gigpo", "turn_reinforce", "turn_gae"):
        ref = A.ADVANTAGES[name](**kw, gamma=0.9)
        torch.testing.assert_close(A.ADVANTAGES[name](**kw | {"token_level_rewards": spread}, gamma=0.9), ref)
        # turn_rewards given: token rewards are not read
        zeros = torch.zeros_like(spread)
        torch.testing.assert_close(A.ADVANTAGES[name](**kw | {"token_level_rewards": zeros}, turn_rewards=tr,
                                                      gamma=0.9), ref)


# --------------------------------------------------------------------------------------- gradients, dtypes


@pytest.mark.parametrize("name", ["gigpo", "turn_reinforce", "turn_gae"])
def test_advantages_are_detached(name):
    kw = layout(random_episodes(1, [2, 3]), 1)
    r = kw["token_level_rewards"].clone().float().requires_grad_(True)
    v = kw["values"].clone().float().requires_grad_(True)
    tr = torch.ones(5, 4, requires_grad=True)
    adv, ret = A.ADVANTAGES[name](**kw | {"token_level_rewards": r, "values": v}, gamma=0.9)
    assert not adv.requires_grad and not ret.requires_grad
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    adv, ret = A.ADVANTAGES[name](**kw | {"token_level_rewards": r, "values": v},
                                  turn_rewards=tr[:, :int(kw["turn_index"].max()) + 1], gamma=0.9)
    assert not adv.requires_grad and not ret.requires_grad
    # used in a loss, they pass no gradient back to rewards or values
    lp = torch.zeros_like(r, requires_grad=True)
    loss, _ = A.ppo_clip_loss(log_probs=lp, old_log_probs=lp.detach(), advantages=adv, mask=kw["mask"])
    loss.backward()
    assert r.grad is None and v.grad is None and tr.grad is None


def test_empty_batch_and_rows_without_agent_tokens():
    for name in ("gigpo", "turn_reinforce", "turn_gae"):
        z = torch.zeros(2, 4, dtype=T64)
        adv, ret = A.ADVANTAGES[name](token_level_rewards=z, mask=z, values=z, group_ids=[0, 0], turn_index=z.long(),
                                      step_keys=[[], []])
        assert adv.shape == (2, 4) and torch.all(adv == 0) and torch.all(ret == 0)
    kw = layout(random_episodes(2, [3]), 2)
    m = kw["mask"].clone()
    m[1] = 0  # the second episode has no agent token: zero advantages, the others still finite
    adv, _ = AT.compute_gigpo(**kw | {"mask": m})
    assert torch.all(adv[1] == 0) and torch.all(torch.isfinite(adv))


# ------------------------------------------------------------------------------------------------- errors


def test_missing_inputs_are_named():
    kw = layout(random_episodes(0, [2]), 0)
    base = dict(token_level_rewards=kw["token_level_rewards"], mask=kw["mask"], values=kw["values"],
                group_ids=kw["group_ids"])
    with pytest.raises(ValueError, match=r"gigpo needs turn_index .* and step_keys"):
        A.ADVANTAGES["gigpo"](**base)
    with pytest.raises(ValueError, match=r"gigpo needs step_keys") as ei:
        A.ADVANTAGES["gigpo"](**base, turn_index=kw["turn_index"])
    assert "turn_index" not in str(ei.value)
    with pytest.raises(ValueError, match=r"gigpo needs group_ids"):
        A.ADVANTAGES["gigpo"](**base | {"group_ids": None}, turn_index=kw["turn_index"], step_keys=kw["step_keys"])
    with pytest.raises(ValueError, match=r"turn_reinforce needs turn_index"):
        A.ADVANTAGES["turn_reinforce"](**base)
    with pytest.raises(ValueError, match=r"turn_reinforce needs group_ids"):
        A.ADVANTAGES["turn_reinforce"](**base | {"group_ids": None}, turn_index=kw["turn_index"], baseline="turn")
    A.ADVANTAGES["turn_reinforce"](**base | {"group_ids": None}, turn_index=kw["turn_index"])  # no baseline: fine
    with pytest.raises(ValueError, match=r"turn_gae needs turn_index .* and values"):
        A.ADVANTAGES["turn_gae"](**base | {"values": None})
    for name, estimator in A.ADVANTAGES.items():
        if not estimator.turn_level:
            continue
        with pytest.raises(ValueError, match="turn_index"):
            estimator(**base)
        assert estimator.turn_inputs[0] == "turn_index", name


def test_bad_inputs_and_unknown_names():
    kw = layout(random_episodes(0, [3], 3), 0)
    with pytest.raises(ValueError, match="baseline 'mean'.*none, turn, episode"):
        AT.compute_turn_reinforce(**kw, baseline="mean")
    with pytest.raises(ValueError, match="episode_stats 'steps'.*episodes, turns"):
        AT.compute_gigpo(**kw, episode_stats="steps")
    with pytest.raises(KeyError) as ei:
        A.ADVANTAGES["gigpo_v2"]
    assert all(n in str(ei.value) for n in ("gigpo", "turn_reinforce", "turn_gae", "grpo"))
    bad = kw["turn_index"].clone()
    bad[tuple(kw["mask"].bool().nonzero()[0].tolist())] = -1
    with pytest.raises(ValueError, match=">= 0 on agent tokens"):
        AT.compute_turn_gae(**kw | {"turn_index": bad})
    with pytest.raises(ValueError, match="integer tensor"):
        AT.compute_turn_gae(**kw | {"turn_index": kw["turn_index"].double()})
    K = int(kw["turn_index"].max()) + 1
    with pytest.raises(ValueError, match="only 1 turns"):
        AT.compute_turn_reinforce(**kw, turn_rewards=torch.zeros(3, 1))
    with pytest.raises(ValueError, match="disagree"):
        AT.compute_turn_reinforce(**kw, turn_rewards=torch.zeros(3, K), turn_mask=torch.ones(3, K + 1))
    with pytest.raises(ValueError, match="outside turn_mask"):
        AT.compute_turn_reinforce(**kw, turn_mask=torch.zeros(3, K))
    with pytest.raises(ValueError, match="pass turn_values"):
        AT.compute_turn_gae(**kw, turn_mask=torch.ones(3, K + 1))
    with pytest.raises(ValueError, match="step_keys row"):
        AT.compute_gigpo(**kw | {"step_keys": [[], [], []]})
    with pytest.raises(ValueError, match="3 entries|group_ids"):
        AT.compute_gigpo(**kw | {"group_ids": [0, 0]})
    with pytest.raises(ValueError, match="scores"):
        AT.compute_gigpo(**kw, scores=torch.zeros(2))


# ------------------------------------------------------------------------------------------------ helpers


def test_registry_holds_the_turn_estimators_whichever_module_is_imported_first():
    # a fresh process that imports the turn estimators' module first gets the whole registry too
    import subprocess
    import sys

    code = ("import trajlake.train.algos.turns as T; from trajlake.train.algos import ADVANTAGES, turns; "
            "assert turns is T and {'gigpo', 'turn_reinforce', 'turn_gae', 'grpo'} <= set(ADVANTAGES)")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert {"gigpo", "turn_reinforce", "turn_gae"} <= set(A.ADVANTAGES) and A.turns is AT

