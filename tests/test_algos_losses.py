"""train/algos losses (policy, value), KL estimators and controllers, aggregation modes, entropy, and the
registries: hand-computed values, gradients, and one signature per registry."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given

from tests.algos_helpers import QUICK, T64, batch_shapes, random_batch, t
from trajlake.train import algos as A

# ----------------------------------------------------------------------------------------- policy losses


def ratios_batch(ratios, advs):
    old = torch.zeros(1, len(ratios), dtype=T64)
    lp = torch.log(t([ratios])).requires_grad_(True)
    return dict(log_probs=lp, old_log_probs=old, advantages=t([advs]), mask=torch.ones(1, len(ratios), dtype=T64))


def test_ppo_clip_golden_with_clip_higher():
    ratios = [0.5, 0.9, 1.0, 1.1, 1.25, 1.5] * 2
    advs = [1.0] * 6 + [-1.0] * 6
    kw = ratios_batch(ratios, advs)
    loss, m = A.POLICY_LOSSES["ppo_clip"](**kw, clip_low=0.2, clip_high=0.28)
    # A = +1: -min(r, clip(r)) -> only 1.5 is clipped (to 1.28); 1.25 is inside the high clip 0.28
    # A = -1: max(r, clip(r)) -> only 0.5 is clipped (to 0.8)
    per_tok = [-0.5, -0.9, -1.0, -1.1, -1.25, -1.28, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5]
    assert float(loss.detach()) == pytest.approx(sum(per_tok) / 12)
    assert float(m["pg_clipfrac"]) == pytest.approx(2 / 12)
    loss.backward()
    g = kw["log_probs"].grad[0]
    # clipped tokens get no gradient; others get -A * r / N
    for i, (r, a) in enumerate(zip(ratios, advs, strict=True)):
        clipped = (a > 0 and r > 1.28) or (a < 0 and r < 0.8)
        assert float(g[i]) == pytest.approx(0.0 if clipped else -a * r / 12)
    # symmetric 0.2 clips 1.25 as well
    _, m2 = A.ppo_clip_loss(**ratios_batch(ratios, advs), clip_low=0.2, clip_high=0.2)
    assert float(m2["pg_clipfrac"]) == pytest.approx(3 / 12)


def test_dual_clip_golden():
    kw = ratios_batch([5.0, 2.0, 5.0, 0.5], [-1.0, -2.0, 1.0, -1.0])
    loss, m = A.POLICY_LOSSES["dual_clip"](**kw, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    # A=-1, r=5: ppo 5, bounded by 3; A=-2, r=2: ppo 4 < 6; A=+1, r=5: -1.28; A=-1, r=.5: .8
    assert float(loss.detach()) == pytest.approx((3.0 + 4.0 - 1.28 + 0.8) / 4)
    assert float(m["pg_clipfrac_lower"]) == pytest.approx(1 / 4)
    loss.backward()
    g = kw["log_probs"].grad[0]
    assert float(g[0]) == 0.0 and float(g[2]) == 0.0 and float(g[3]) == 0.0
    assert float(g[1]) == pytest.approx(2.0 * 2.0 / 4)
    ppo, _ = A.ppo_clip_loss(**ratios_batch([5.0, 2.0, 5.0, 0.5], [-1.0, -2.0, 1.0, -1.0]), clip_high=0.28)
    assert float(ppo.detach()) == pytest.approx((5.0 + 4.0 - 1.28 + 0.8) / 4)
    with pytest.raises(ValueError):
        A.dual_clip_loss(**ratios_batch([1.0], [1.0]), clip_c=1.0)


def test_gspo_sequence_ratio_and_gradient():
    g = torch.Generator().manual_seed(0)
    B, T = 4, 7
    mask = (torch.rand(B, T, generator=g) < 0.7).to(T64)
    mask[:, 0] = 1
    old = torch.randn(B, T, generator=g, dtype=T64)
    lp0 = old + 0.05 * torch.randn(B, T, generator=g, dtype=T64)
    adv = torch.randn(B, 1, generator=g, dtype=T64).expand(B, T) * mask
    lp = lp0.clone().requires_grad_(True)
    loss, m = A.POLICY_LOSSES["gspo"](log_probs=lp, old_log_probs=old, advantages=adv, mask=mask,
                                      clip_low=0.9, clip_high=100.0)
    loss.backward()
    # reference: the sequence-level GSPO objective, mean over sequences of -A_i * s_i
    lp2 = lp0.clone().requires_grad_(True)
    seq_lr = ((lp2 - old) * mask).sum(-1) / mask.sum(-1)
    ref = (-adv[:, 0] * torch.exp(seq_lr)).mean()
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()))
    torch.testing.assert_close(lp.grad, lp2.grad)
    assert float(m["seq_ratio_mean"]) == pytest.approx(float(torch.exp(seq_lr.detach()).mean()))


def test_gspo_clips_whole_sequences():
    # seq 0: mean log-ratio .5 (s = e^.5 > 1 + .28), A > 0 -> whole sequence clipped, no gradient;
    # seq 1: the same tokens' log-ratios but mean 0 -> inside, gets gradient at every agent token
    lp = t([[1.0, 0.0, 0.5, 9.0], [1.0, -1.0, 0.0, 9.0]]).requires_grad_(True)
    mask = t([[1, 1, 1, 0], [1, 1, 1, 0]])
    adv = torch.ones(2, 4, dtype=T64)
    loss, m = A.gspo_loss(log_probs=lp, old_log_probs=torch.zeros(2, 4, dtype=T64), advantages=adv, mask=mask,
                          clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert torch.all(lp.grad[0] == 0)
    torch.testing.assert_close(lp.grad[1], t([-1 / 6, -1 / 6, -1 / 6, 0.0]))
    assert float(m["pg_clipfrac"]) == pytest.approx(0.5)
    assert float(loss.detach()) == pytest.approx((-1.28 - 1.0) / 2)


@pytest.mark.parametrize("name", ["ppo_clip", "dual_clip", "gspo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@QUICK
@given(shape=batch_shapes)
def test_masked_tokens_get_no_gradient(name, agg, shape):
    seed, B, T = shape
    g, _, _, mask = random_batch(seed, B, T)
    old = torch.randn(B, T, generator=g, dtype=T64) - 1
    lp0 = old + 0.3 * torch.randn(B, T, generator=g, dtype=T64)
    adv = torch.randn(B, T, generator=g, dtype=T64)
    off = mask == 0
    # garbage at masked positions: huge / inf / nan in every input
    lp0[off] = 50.0
    old[off] = -math.inf
    adv[off] = math.nan
    lp = lp0.clone().requires_grad_(True)
    w = torch.rand(B, T, generator=g, dtype=T64)
    w[off] = math.nan
    loss, metrics = A.POLICY_LOSSES[name](log_probs=lp, old_log_probs=old, advantages=adv, mask=mask,
                                          agg_mode=agg, is_weights=w)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in metrics.values())
    loss.backward()
    assert torch.all(torch.isfinite(lp.grad))
    assert torch.all(lp.grad[off] == 0)


def test_policy_loss_empty_mask_and_is_weights():
    kw = ratios_batch([1.1, 0.9], [1.0, -1.0])
    kw["mask"] = torch.zeros(1, 2, dtype=T64)
    for name in ("ppo_clip", "dual_clip", "gspo"):
        loss, _ = A.compute_policy_loss(name, **kw)
        assert float(loss.detach()) == 0.0
    base, _ = A.ppo_clip_loss(**ratios_batch([1.1, 0.9], [1.0, -1.0]))
    weighted, _ = A.ppo_clip_loss(**ratios_batch([1.1, 0.9], [1.0, -1.0]), is_weights=t([[2.0, 2.0]]))
    assert float(weighted.detach()) == pytest.approx(2 * float(base.detach()))


# -------------------------------------------------------------------------------------------- value loss


def test_value_loss_golden():
    v = t([[1.5, 1.1, 0.5, 2.5, 1.5, 99.0]]).requires_grad_(True)
    v_old = t([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    R = t([[2.0, 2.0, 0.0, 2.0, 1.3, 0.0]])
    mask = t([[1, 1, 1, 1, 1, 0]])
    loss, m = A.VALUE_LOSSES["clipped"](values=v, old_values=v_old, returns=R, mask=mask, clip_eps=0.2)
    # 0.5*max((v-R)^2, (clip(v, .8, 1.2)-R)^2): .32 (clipped), .405, .32 (clipped), .32 (clipped), .02
    assert float(loss.detach()) == pytest.approx((0.32 + 0.405 + 0.32 + 0.32 + 0.02) / 5)
    assert float(m["vf_clipfrac"]) == pytest.approx(3 / 5)
    loss.backward()
    # clipped terms: the clipped value is a constant -> no gradient; others: (v - R) / N
    torch.testing.assert_close(v.grad, t([[0.0, -0.9 / 5, 0.0, 0.0, 0.2 / 5, 0.0]]))
    mse, _ = A.VALUE_LOSSES["mse"](values=v.detach(), returns=R, mask=mask)
    assert float(mse) == pytest.approx(0.5 * (0.25 + 0.81 + 0.25 + 0.25 + 0.04) / 5)


# ---------------------------------------------------------------------------------------------------- KL


P = t([0.5, 0.3, 0.2])
Q = t([0.2, 0.3, 0.5])
KL_PQ = float((P * (P / Q).log()).sum())


def test_kl_estimators_golden_values():
    lp, lq = t([[math.log(0.5)]]), t([[math.log(0.2)]])
    assert float(A.KL_ESTIMATORS["k1"](lp, lq)) == pytest.approx(math.log(2.5))
    assert float(A.KL_ESTIMATORS["k2"](lp, lq)) == pytest.approx(0.5 * math.log(2.5) ** 2)
    assert float(A.KL_ESTIMATORS["k3"](lp, lq)) == pytest.approx(0.4 - math.log(0.4) - 1)
    assert float(A.KL_ESTIMATORS["abs"](lq, lp)) == pytest.approx(math.log(2.5))
    assert A.KL_ESTIMATORS["kl"] is A.kl_k1 and A.KL_ESTIMATORS["mse"] is A.kl_k2
    assert A.KL_ESTIMATORS["low_var_kl"] is A.kl_k3


def test_kl_estimators_expectations_on_known_distributions():
    # exact expectation under pi = P over the three outcomes
    lp, lq = P.log()[None], Q.log()[None]
    for name in ("k1", "k3"):  # unbiased for KL(P || Q)
        assert float((P * A.KL_ESTIMATORS[name](lp, lq)[0]).sum()) == pytest.approx(KL_PQ)
    k2 = float((P * A.KL_ESTIMATORS["k2"](lp, lq)[0]).sum())
    assert k2 == pytest.approx(0.5 * float((P * (P / Q).log() ** 2).sum()))
    # the sign convention matters: k3 with the arguments swapped estimates something else
    assert float((P * A.kl_k3(lq, lp)[0]).sum()) != pytest.approx(KL_PQ, rel=1e-3)
    # Monte Carlo from samples of P
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(P, 40_000, replacement=True, generator=g)
    k1 = A.kl_k1(P.log()[x], Q.log()[x])
    k3 = A.kl_k3(P.log()[x], Q.log()[x])
    assert float(k1.mean()) == pytest.approx(KL_PQ, abs=0.02)
    assert float(k3.mean()) == pytest.approx(KL_PQ, abs=0.02)
    assert float(k3.var()) < float(k1.var()) and torch.all(k3 >= 0)


def test_apply_kl_penalty_and_kl_loss():
    rew = t([[0.0, 1.0, 5.0], [2.0, 0.0, 0.0]])
    lp = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    ref = t([[-1.5, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 0]])
    out, m = A.apply_kl_penalty(rew, lp, ref, mask, coef=0.1, estimator="k1")
    torch.testing.assert_close(out, t([[-0.05, 1.0, 5.0], [1.95, 0.05, 0.0]]))
    assert m["kl"] == pytest.approx(((0.5 + 0.0) / 2 + (0.5 - 0.5) / 2) / 2)
    assert m["kl_coef"] == 0.1
    lpg = lp.clone().requires_grad_(True)
    kl = A.kl_penalty(lpg, ref, mask, "k2")
    A.aggregate(kl, mask, "token-mean").backward()
    assert torch.all(lpg.grad[mask == 0] == 0)


def test_kl_controllers():
    c = A.make_kl_controller("adaptive", kl_coef=0.1, target_kl=1.0, horizon=10)
    c.update(current_kl=2.0, n_steps=5)  # error clipped to .2: *= 1 + .2 * 5 / 10
    assert c.value == pytest.approx(0.11)
    c.update(current_kl=0.9, n_steps=5)  # error -.1: *= 0.95
    assert c.value == pytest.approx(0.11 * 0.95)
    c2 = A.KL_CONTROLLERS["adaptive"](0.5, 1.0, 1.0)
    c2.load_state_dict(c.state_dict())
    assert c2.value == c.value
    f = A.make_kl_controller("fixed", kl_coef=0.2)
    f.update(100.0, 64)
    assert f.value == 0.2
    with pytest.raises(ValueError):
        A.make_kl_controller("adaptive", kl_coef=0.1)


# ------------------------------------------------------------------------------------------- aggregation


def test_aggregation_modes_golden():
    loss = t([[1.0, 2.0, 3.0, math.nan], [4.0, 0.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
    mask = t([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert float(A.aggregate(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(A.aggregate(loss, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(A.aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(A.aggregate(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx((6 / 4 + 4 / 4) / 2)
    assert float(A.aggregate(loss, mask, "seq-mean-token-sum-norm", norm_constant=10)) == pytest.approx(0.5)
    assert float(A.aggregate(loss, mask, "token-mean", denominator=20)) == pytest.approx(0.5)
    assert float(A.aggregate(loss, mask, "seq-mean-token-mean", denominator=6)) == pytest.approx(1.0)
    for mode in A.AGG_MODES.names():
        assert float(A.aggregate(loss, torch.zeros_like(mask), mode)) == 0.0


def test_aggregation_denominator_accumulates_micro_batches():
    g, loss, _, mask = random_batch(5, 8, 6)
    mask[:, 0] = 1
    for mode, den in (("token-mean", mask.sum()), ("seq-mean-token-mean", 8), ("seq-mean-token-sum", 8)):
        full = A.aggregate(loss, mask, mode)
        parts = sum(A.aggregate(loss[i:i + 3], mask[i:i + 3], mode, denominator=float(den)) for i in (0, 3, 6))
        assert float(parts) == pytest.approx(float(full))


def test_masked_helpers():
    x = t([[1.0, 2.0, math.inf], [3.0, math.nan, 5.0]])
    m = t([[1, 1, 0], [1, 0, 1]])
    assert float(A.masked_mean(x, m)) == pytest.approx(11 / 4)
    torch.testing.assert_close(A.masked_mean(x, m, dim=-1), t([1.5, 4.0]))
    assert float(A.masked_sum(x, m)) == 11.0
    assert float(A.masked_var(x, m)) == pytest.approx(float(t([1.0, 2.0, 3.0, 5.0]).var()))
    w = A.masked_whiten(x, m)
    assert w[0, 2] == 0 and w[1, 1] == 0
    torch.testing.assert_close(w[m.bool()], (t([1.0, 2.0, 3.0, 5.0]) - 2.75) / t([1.0, 2.0, 3.0, 5.0]).std(),
                               rtol=1e-6, atol=1e-6)
    assert float(A.masked_mean(x, torch.zeros_like(m))) == 0.0


# ----------------------------------------------------------------------------------------------- entropy


def test_entropy_from_logits():
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(2, 5, 11, generator=g)
    ref = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(A.entropy_from_logits(logits), ref)
    torch.testing.assert_close(A.entropy_from_logits(logits, chunk_size=3), ref)
    assert A.entropy_from_logits(logits).shape == (2, 5)
    # huge logits and -inf (masked vocabulary): finite values and gradients
    big = logits.clone() * 1e4
    big[..., :4] = -math.inf
    big.requires_grad_(True)
    e = A.entropy_from_logits(big)
    assert torch.all(torch.isfinite(e)) and torch.all(e >= -1e-6)
    e.sum().backward()
    assert torch.all(torch.isfinite(big.grad))
    uni = torch.zeros(1, 1, 8)
    assert float(A.entropy_from_logits(uni)) == pytest.approx(math.log(8))
    assert A.entropy_from_logits(logits.bfloat16()).dtype == torch.float32


def test_log_probs_from_logits():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 4, 9, generator=g)
    labels = torch.randint(0, 9, (3, 4), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(A.log_probs_from_logits(logits, labels), ref)


# ---------------------------------------------------------------------------------------- registries


@pytest.mark.parametrize("reg", [A.ADVANTAGES, A.POLICY_LOSSES, A.VALUE_LOSSES, A.KL_ESTIMATORS, A.AGG_MODES,
                                 A.KL_CONTROLLERS])
def test_unknown_name_lists_valid_ones(reg):
    with pytest.raises(KeyError) as ei:
        reg["no-such-thing"]
    msg = str(ei.value)
    assert "no-such-thing" in msg and all(n in msg for n in reg.names())
    with pytest.raises(ValueError, match="valid names"):
        reg["no-such-thing"]


def test_registry_contents_and_uniform_signatures():
    assert {"gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "gigpo", "turn_reinforce",
            "turn_gae"} <= set(A.ADVANTAGES.names())
    assert {"ppo_clip", "dual_clip", "gspo"} <= set(A.POLICY_LOSSES.names())
    assert {"k1", "k2", "k3", "abs"} <= set(A.KL_ESTIMATORS.names())
    assert {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"} <= set(A.AGG_MODES.names())
    with pytest.raises(UnknownName := A.UnknownNameError):
        A.aggregate(torch.zeros(1, 1), torch.ones(1, 1), "mean")
    assert issubclass(UnknownName, KeyError)
    with pytest.raises(KeyError, match="k1"):
        A.kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), estimator="k9")
    # one kwargs dict serves every advantage estimator; the turn-level ones also get the inputs they declare
    _, r, v, m = random_batch(0, 4, 5)
    kw = dict(token_level_rewards=r, values=v, mask=m, group_ids=[0, 0, 1, 1], gamma=0.9, lam=0.95, eps=1e-6)
    turn_inputs = dict(turn_index=A.turns.turn_index_from_mask(m), step_keys=torch.zeros(4, 5, dtype=torch.long))
    assert {"gigpo", "turn_reinforce", "turn_gae"} == {n for n, e in A.ADVANTAGES.items() if e.turn_level}
    for name in A.ADVANTAGES.names():
        extra = {k: turn_inputs[k] for k in A.ADVANTAGES[name].turn_inputs}
        adv, ret = A.compute_advantages(name, **kw, **extra)
        assert adv.shape == ret.shape == (4, 5) and torch.all(adv[m == 0] == 0)
    with pytest.raises(TypeError):
        A.ADVANTAGES["grpo"](**kw, gamme=1.0)
    # and every policy loss
    lp = torch.zeros(4, 5, dtype=T64, requires_grad=True)
    for name in A.POLICY_LOSSES.names():
        loss, met = A.compute_policy_loss(name, log_probs=lp, old_log_probs=lp.detach() - 0.1, advantages=r,
                                          mask=m, agg_mode="token-mean", clip_low=0.2, clip_high=0.28, clip_c=3.0)
        assert loss.dim() == 0 and {"pg_loss", "pg_clipfrac", "ppo_kl"} <= set(met)


def test_agg_modes_carry_their_denominators_and_losses_their_settings():
    """A new token-level mode is counted per token wherever the trainer divides; a loss gets exactly the config
    fields it declares; its summed metrics are declared, not guessed from their names."""
    from dataclasses import dataclass

    from trajlake.train.algos.core import register_agg_mode

    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert float(A.AGG_MODES["token-mean"].count(mask)) == 3
    assert float(A.AGG_MODES["seq-mean-token-mean"].count(mask)) == 2
    saved = dict(A.AGG_MODES._entries)
    try:
        register_agg_mode("token-sum-half", per="token")(lambda m, k, denominator=None, norm_constant=None: m.sum())
        assert float(A.AGG_MODES["token-sum-half"].count(mask)) == 3
        with pytest.raises(ValueError, match="already registered"):
            register_agg_mode("token-mean", per="token")(lambda *a, **k: 0)
        with pytest.raises(ValueError, match="per token or per sequence"):
            register_agg_mode("per-row", per="row")(lambda *a, **k: 0)
    finally:
        A.AGG_MODES._entries = saved

    @dataclass
    class Cfg:
        clip_low: float = 0.1
        clip_high: float = 0.3
        clip_c: float = 4.0
        value_clip: float = 0.7

        def value(self, name):  # TrainConfig's read by flat name
            return getattr(self, name)

    assert A.POLICY_LOSSES["ppo_clip"].settings(Cfg()) == {"clip_low": 0.1, "clip_high": 0.3}
    assert A.POLICY_LOSSES["dual_clip"].settings(Cfg()) == {"clip_low": 0.1, "clip_high": 0.3, "clip_c": 4.0}
    assert A.VALUE_LOSSES["clipped"].settings(Cfg()) == {"clip_eps": 0.7}
    assert A.VALUE_LOSSES["mse"].settings(Cfg()) == {}
    assert all(A.POLICY_LOSSES[n].summed == ("pg_loss",) for n in A.POLICY_LOSSES.names())
    # every field a loss declares exists in TrainConfig
    from trajlake.train.config import LEAVES

    fields = set(LEAVES)  # by flat name
    for reg in (A.POLICY_LOSSES, A.VALUE_LOSSES):
        for n in reg.names():
            assert set(reg[n].params.values()) <= fields, n
    # both KL controllers are made the same way
    for kind in A.KL_CONTROLLERS.names():
        c = A.KL_CONTROLLERS[kind].from_settings(0.1, target_kl=1.0, horizon=10.0)
        c.update(2.0, 4)
        c.load_state_dict(c.state_dict())

