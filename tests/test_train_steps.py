"""One update per algorithm on the tiny model, one process: parameters move when they should and only then;
masked tokens get no gradient; gradient accumulation does not change the step."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import flat_params, small_cfg, synthetic, tiny_model_dir
from trajlake.core.errors import TrajlakeError
from trajlake.train import engine as E
from trajlake.train import forward as FW
from trajlake.train.algos import make_kl_controller
from trajlake.train.batch import collate
from trajlake.train.steps import _old_logprobs, actor_loss_terms, prepare, rl_update, sft_update


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def _engines(cfg, model, **kw):
    return E.build_engines(cfg, str(model), **kw)


def _run(cfg, engines, seqs, seed=0):
    kl = make_kl_controller(cfg.kl.controller, cfg.kl.coef, cfg.kl.target, cfg.kl.horizon)
    batch = collate(seqs, engines.pad_id)
    prep, m1 = prepare(engines, batch, cfg, kl)
    return prep, {**m1, **rl_update(engines, prep, cfg, kl, seed=seed)}


def test_grpo_step_changes_parameters(model):
    cfg = small_cfg(model)
    eng = _engines(cfg, model)
    before = flat_params(eng.actor.module)
    prep, m = _run(cfg, eng, synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 0]))
    assert not torch.equal(before, flat_params(eng.actor.module))
    for k in ("pg_loss", "pg_clipfrac", "entropy", "grad_norm", "loss", "train_tokens_per_s", "ppo_kl"):
        assert k in m, k
    assert m["grad_norm"] > 0
    assert prep.advantages[prep.batch.loss_mask == 0].abs().sum() == 0


def test_grpo_identical_rewards_in_a_group_give_no_update(model):
    # kl and entropy terms off; every sequence kept in the update: zero advantage, zero gradient
    cfg = small_cfg(model, epochs=2, drop_zero_advantage=False)
    eng = _engines(cfg, model)
    before = flat_params(eng.actor.module)
    prep, m = _run(cfg, eng, synthetic(8, group_size=4, scores=[1, 1, 1, 1, 0, 0, 0, 0]))
    assert prep.advantages.abs().sum() == 0
    assert m["grad_norm"] == 0.0 and m["pg_loss"] == 0.0
    assert torch.equal(before, flat_params(eng.actor.module))
    # by default such groups are left out of the update (no optimizer step on them at all)
    cfg = small_cfg(model)
    eng = _engines(cfg, model)
    _, m = _run(cfg, eng, synthetic(8, group_size=4, scores=[1, 1, 1, 1, 0, 0, 0, 0]))
    assert m["actor_sequences"] == 0 and "grad_norm" not in m
    assert torch.equal(before, flat_params(eng.actor.module))
    _, m = _run(cfg, eng, synthetic(8, group_size=4, scores=[1, 1, 1, 1, 0, 1, 0, 0]))
    assert m["actor_sequences"] == 4 and m["grad_norm"] > 0


def test_masked_tokens_get_no_gradient(model):
    cfg = small_cfg(model, entropy_coef=0.1, kl_coef=0.5, kl_estimator="k3")
    seqs = synthetic(4, group_size=2)
    b = collate(seqs, 0)
    B, T = b.input_ids.shape
    logits = torch.randn(B, T, 600, requires_grad=True)

    class Fake:  # a "model" whose logits are a leaf tensor, so their gradient can be read
        def __call__(self, **_):
            return type("Out", (), {"logits": logits})()

    lp, ent = FW.forward_logprobs(Fake(), b.input_ids, b.attention_mask, temperature=0.7, entropy=True)
    mask = b.loss_mask
    garbage = torch.where(mask > 0, torch.zeros(B, T), torch.full((B, T), float("nan")))
    loss, _ = actor_loss_terms(lp, ent, mask, cfg, make_kl_controller("fixed", 0.5), None,
                               old_logprobs=lp.detach() - 0.1 + garbage, advantages=torch.randn(B, T) + garbage,
                               ref_logprobs=lp.detach() + 0.3 + garbage)
    assert torch.isfinite(loss)
    loss.backward()
    g = logits.grad.abs().sum(-1)  # logits at t - 1 score the token at t
    scored = torch.zeros(B, T, dtype=torch.bool)
    scored[:, :-1] = mask[:, 1:] > 0
    assert g[~scored].sum() == 0
    assert (g[scored] > 0).all()


def test_sft_step_learns_response_tokens_only(model):
    cfg = small_cfg(model, algo="sft", lr=3e-3)
    eng = _engines(cfg, model)
    seqs = synthetic(8)
    batch = collate(seqs, eng.pad_id)
    before = flat_params(eng.actor.module)
    nll = [sft_update(eng, batch, list(range(8)), cfg)["nll"] for _ in range(4)]
    assert not torch.equal(before, flat_params(eng.actor.module))
    assert nll[-1] < nll[0]
    # only response tokens are targets: a batch without any gives no gradient at all
    for s in seqs:
        s.mask = [0] * len(s.mask)
    m = sft_update(eng, collate(seqs, eng.pad_id), list(range(8)), cfg)
    assert m["grad_norm"] == 0.0 and m["loss"] == 0.0


def test_ppo_step_trains_actor_and_critic(model):
    cfg = small_cfg(model, algo="ppo", critic_lr=1e-2, samples=1)
    eng = _engines(cfg, model, critic=True)
    actor0, critic0 = flat_params(eng.actor.module), flat_params(eng.critic.module)
    prep, m = _run(cfg, eng, synthetic(8, group_size=1))
    assert prep.values is not None and prep.values.abs().sum() == 0  # zero-initialised value head
    assert not torch.equal(actor0, flat_params(eng.actor.module))
    assert not torch.equal(critic0, flat_params(eng.critic.module))
    assert m["critic_vf_loss"] > 0 and m["critic_grad_norm"] > 0
    _, m2 = _run(cfg, eng, synthetic(8, group_size=1), seed=1)
    assert "critic_vf_loss" in m2


def test_behaviour_logprobs_as_old(model):
    cfg = small_cfg(model, old_logprobs="behaviour")
    eng = _engines(cfg, model)
    seqs = synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1])
    prep, m = _run(cfg, eng, seqs)
    beh = torch.nan_to_num(prep.batch.behaviour_logprobs) * prep.batch.loss_mask
    assert torch.allclose(prep.old_logprobs, beh)
    assert m["pg_clipfrac"] > 0  # random behaviour logprobs: ratios far from 1
    seqs[0].behaviour = [float("nan")] * len(seqs[0].ids)  # a text policy's episode
    with pytest.raises(TrajlakeError, match="recompute"):
        _run(cfg, eng, seqs)
    capped = small_cfg(model, is_cap=2.0)
    _, m = _run(capped, _engines(capped, model), synthetic(8, group_size=4))
    assert 0 < m["is_weight_mean"] <= 2.0


def test_behaviour_kl_is_measured_against_the_current_policy(model):
    """With old_logprobs behaviour the ratio needs no pi_old, but behaviour_kl still says how far the policy
    is from the one that played: mean(behaviour - current log-prob) over agent tokens."""
    cfg = small_cfg(model, old_logprobs="behaviour")
    eng = _engines(cfg, model)
    seqs = synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1])
    batch = collate(seqs, eng.pad_id)
    prep, m = prepare(eng, batch, cfg, make_kl_controller("fixed", 0.0))
    current = _old_logprobs(eng, batch, cfg)  # the actor's log-probs of the batch, no gradient
    mask = batch.loss_mask > 0
    want = float((torch.nan_to_num(batch.behaviour_logprobs) - current)[mask].mean())
    assert m["behaviour_kl"] == pytest.approx(want, rel=1e-5) and abs(want) > 0.1


def test_advantage_floor_raises_only_what_is_below_it(model):
    """advantage_floor 0: the negative advantages become 0 (those sequences then leave the update, having no
    gradient), the positive ones are untouched; None leaves every advantage as the estimator gave it."""
    seqs = synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1])
    eng = _engines(small_cfg(model), model)
    batch = collate(seqs, eng.pad_id)
    kl = make_kl_controller("fixed", 0.0)
    plain, _ = prepare(eng, batch, small_cfg(model), kl)
    floored, m = prepare(eng, batch, small_cfg(model, advantage_floor=0.0), kl)
    mask = batch.loss_mask > 0
    assert (plain.advantages[mask] < 0).any() and m["adv_floored"] == 0.5  # half the samples scored 0
    assert torch.equal(floored.advantages, torch.where(mask & (plain.advantages < 0), 0.0, plain.advantages))
    _, m = _run(small_cfg(model, advantage_floor=0.0), eng, seqs)
    assert m["signal_rows"] == 0.5  # the update trains on the 4 better samples only


def test_kl_loss_and_reward_penalty(model):
    cfg = small_cfg(model, kl_coef=0.1, kl_estimator="k3", epochs=2)
    eng = _engines(cfg, model, ref=True)
    _, m = _run(cfg, eng, synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1]))
    assert m["kl"] > 0 and m["kl_coef"] == pytest.approx(0.1)  # the second epoch moved away from the ref
    cfg = small_cfg(model, kl_coef=0.1, kl_mode="reward", kl_estimator="k1", kl_controller="adaptive",
                    kl_target=1e-6, kl_horizon=10)
    eng.actor.module.requires_grad_(True)
    kl = make_kl_controller("adaptive", 0.1, 1e-6, 10)
    batch = collate(synthetic(8, group_size=4), eng.pad_id)
    prep, m = prepare(eng, batch, cfg, kl)
    assert m["kl"] != 0 and kl.value != 0.1  # the controller moved
    assert not torch.equal(prep.token_rewards, batch.token_rewards)


def test_gradient_accumulation_gives_the_same_step(model):
    seqs = synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1])
    results = []
    for micro in (8, 2):
        cfg = small_cfg(model, minibatch_size=8, micro_batch=micro, lr=1e-3)
        eng = _engines(cfg, model)
        _, m = _run(cfg, eng, seqs)
        results.append((m["loss"], m["grad_norm"], flat_params(eng.actor.module)))
    (l1, g1, p1), (l2, g2, p2) = results
    assert l1 == pytest.approx(l2, rel=1e-4, abs=1e-6) and g1 == pytest.approx(g2, rel=1e-4)
    # Adam divides by |g|: where a gradient is at rounding level, summation order moves the step a little
    # (1.2e-5 on 2 of 1M parameters on one CPU); a wrong accumulation moves whole steps of lr = 1e-3
    assert torch.allclose(p1, p2, atol=1e-4)


def test_a_tied_embedding_takes_sparse_rows_and_the_step_is_the_same(model):
    """The embedding's gradient rows taken sparse (as the engine takes a large tied embedding's): the summed
    gradient the optimizer gets is dense, and the step equals the dense one's."""
    seqs = synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1])
    cfg = small_cfg(model, lr=1e-3)
    params, grads = [], []
    for sparse in (True, False):
        eng = _engines(cfg, model)
        emb = eng.actor.module.get_input_embeddings()
        assert emb.weight is eng.actor.module.get_output_embeddings().weight
        emb.sparse = sparse
        grad_of_shared = []
        emb.weight.register_post_accumulate_grad_hook(lambda p, out=grad_of_shared: out.append(p.grad.clone()))
        _run(cfg, eng, seqs)
        assert grad_of_shared and all(g.layout == torch.strided for g in grad_of_shared)
        params.append(flat_params(eng.actor.module))
        grads.append(torch.stack(grad_of_shared))
    assert torch.allclose(grads[0], grads[1], atol=1e-7)
    assert torch.allclose(params[0], params[1], atol=1e-6)


def test_which_embeddings_take_sparse_rows(model):
    """A tied embedding of 32 MiB or more (SmolLM2's 113 MB) does; a small one (the tiny model's 1 MB: nothing to
    save, and its runs round as they did), an untied one, a frozen one and one under ZeRO-3 do not."""
    from trajlake.lm.load import load_model

    tied = load_model(model)
    assert tied.get_input_embeddings().weight.nbytes < E.SPARSE_EMBEDDING_MIN_BYTES
    assert not E.sparse_tied_embedding(tied, zero_stage=0) and not tied.get_input_embeddings().sparse
    assert not E.sparse_tied_embedding(tied, zero_stage=3, min_bytes=0)
    assert E.sparse_tied_embedding(tied, zero_stage=0, min_bytes=0) and tied.get_input_embeddings().sparse
    untied = load_model(model)
    untied.get_output_embeddings().weight = torch.nn.Parameter(untied.get_input_embeddings().weight.detach().clone())
    assert not E.sparse_tied_embedding(untied, zero_stage=0, min_bytes=0) and not untied.get_input_embeddings().sparse
    frozen = load_model(model)
    frozen.requires_grad_(False)
    assert not E.sparse_tied_embedding(frozen, zero_stage=0, min_bytes=0)
    assert not E.build_engines(small_cfg(model), str(model)).actor.module.get_input_embeddings().sparse
