"""The update's fast paths give what the plain ones give: logits only from the first scored token on, a
prompt shared by a micro-batch's rows read once, and pi_old taken from the update itself when the iteration
is a single optimizer step (no recompute pass)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.helpers import flat_params, small_cfg, tiny_model_dir
from trajlake.lm.prefix import MIN_SHARED_PREFIX
from trajlake.train import engine as E
from trajlake.train import forward as FW
from trajlake.train import steps as S
from trajlake.train.algos import make_kl_controller
from trajlake.train.batch import EpisodeSeq, collate, micro_batches


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def grouped(n_groups: int, group_size: int, *, seed: int = 0, prompt: int = 40, vocab: int = 500,
            behaviour: bool = True, scores=None) -> list[EpisodeSeq]:
    """GRPO-like episodes: a system prompt shared by all, a task prompt shared by a group's samples, then
    each sample's own reply; the score as a reward on the last token."""
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(prompt)]
    out = []
    for g in range(n_groups):
        task = system + [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 9))]
        for k in range(group_size):
            i = g * group_size + k
            reply = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 10))]
            ids, mask = task + reply, [0] * len(task) + [1] * len(reply)
            score = float(scores[i]) if scores is not None else rng.random()
            rewards = [0.0] * len(ids)
            rewards[-1] = score
            beh = [rng.uniform(-8, -6) if m and behaviour else float("nan") for m in mask]
            out.append(EpisodeSeq(f"ep{i:03d}", f"g{g}", score > 0.5, ids, mask, beh, rewards, score))
    return out


def test_shared_prefix_and_kept_logits_match_the_full_pass(model):
    cfg = small_cfg(model)
    eng = E.build_engines(cfg, str(model))
    assert FW.can_share_prefix(eng.actor)
    net = eng.actor.module  # the module itself: its gradients read directly
    b = collate(grouped(1, 4), eng.pad_id)
    start = FW.first_scored(b.loss_mask)
    assert start > MIN_SHARED_PREFIX and FW.shared_prefix(b.input_ids, b.attention_mask, start) == start
    mask = b.loss_mask
    net.train()
    results = []
    # the plain pass, logits kept from `start` on, the shared prefix read once, and that read from a Context
    for kw in ({}, {"start": start}, {"start": start, "share_prefix": True}, {"start": start, "context": 20}):
        net.zero_grad()
        if "context" in kw:  # the keys and values of the first 20 tokens, computed beforehand
            kw = {**kw, "share_prefix": True, "context": FW.prefix_context(net, b.input_ids[:1, :kw["context"]])}
        lp, ent = FW.forward_logprobs(net, b.input_ids, b.attention_mask, temperature=0.7, entropy=True, **kw)
        ((lp + 0.1 * ent) * mask).sum().backward()
        if "context" in kw:  # the prefix's share of the gradient, through its own pass
            FW.context_loss(kw["context"]).backward()
        grads = torch.cat([p.grad.reshape(-1).clone() for p in net.parameters()])
        results.append((lp.detach() * mask, ent.detach() * mask, grads))
    (lp0, ent0, g0) = results[0]
    for lp, ent, g in results[1:]:
        assert torch.allclose(lp, lp0, atol=1e-5) and torch.allclose(ent, ent0, atol=1e-5)
        assert torch.allclose(g, g0, atol=1e-5, rtol=1e-4)
    net.zero_grad()


def test_shared_prefix_length():
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 9], [5, 6, 7, 8, 1]])
    attn = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert FW.shared_prefix(ids, attn, 10) == 3
    assert FW.shared_prefix(ids, attn, 2) == 2
    assert FW.shared_prefix(ids[:1], attn[:1], 10) == 0  # one row: nothing to share
    assert FW.shared_prefix(ids[[0, 2]], attn[[0, 2]], 10) == 4  # up to the shorter row's end
    assert FW.first_scored(torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]])) == 1
    assert FW.first_scored(torch.zeros(2, 5)) == 0


def test_micro_batches_by_key_keep_groups_together():
    lengths = [10, 30, 12, 28, 11, 29, 13, 27]
    keys = ["a", "b"] * 4
    assert micro_batches(lengths, list(range(8)), 4) == [[1, 5, 3, 7], [6, 2, 4, 0]]
    assert micro_batches(lengths, list(range(8)), 4, keys=keys) == [[1, 5, 3, 7], [6, 2, 4, 0]]
    keys = ["a", "a", "b", "b", "c", "c", "d", "d"]
    got = micro_batches(lengths, list(range(8)), 2, count=5, keys=keys)
    assert got == [[1, 0], [5, 4], [3, 2], [7, 6], []]


def _step(cfg, model, seqs, monkeypatch=None, *, fast: bool):
    if monkeypatch is not None and not fast:
        monkeypatch.setattr(S, "old_logprobs_from_update", lambda *a: False)
        for module in (FW, S):  # forward.py's own check and the update's
            monkeypatch.setattr(module, "can_share_prefix", lambda m: False)
    eng = E.build_engines(cfg, str(model))
    kl = make_kl_controller("fixed", 0.0)
    prep, m1 = S.prepare(eng, collate(seqs, eng.pad_id), cfg, kl)
    m2 = S.rl_update(eng, prep, cfg, kl, seed=0)
    if monkeypatch is not None:
        monkeypatch.undo()
    return prep, {**m1, **m2}, flat_params(eng.actor.module)


@pytest.mark.parametrize("drop", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_one_step_iteration_matches_the_recompute(model, monkeypatch, drop):
    # 4 groups of 4; with drop_zero_advantage the two all-equal groups are not trained, and pi_old of those
    # rows is still computed for the behaviour_kl metric
    scores = [0, 1, 0, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0]
    seqs = grouped(4, 4, scores=scores, seed=1)
    cfg = small_cfg(model, minibatch_size=16, micro_batch=4, lr=1e-3, drop_zero_advantage=drop,
                    entropy_coef=0.01)
    prep, fast, p_fast = _step(cfg, model, seqs, fast=True)
    assert prep.on_policy
    _, slow, p_slow = _step(cfg, model, seqs, monkeypatch, fast=False)
    for k in ("loss", "pg_loss", "grad_norm", "entropy", "behaviour_kl", "actor_sequences", "adv_mean"):
        assert fast[k] == pytest.approx(slow[k], rel=1e-4, abs=1e-5), k
    assert fast["ppo_kl"] == 0.0 and abs(slow["ppo_kl"]) < 1e-5
    assert torch.allclose(p_fast, p_slow, atol=1e-4)  # Adam amplifies rounding of tiny gradients


def test_several_steps_still_recompute(model):
    seqs = grouped(2, 4, seed=2)
    for kw in (dict(epochs=2), dict(minibatch_size=4), dict(is_cap=2.0)):
        cfg = small_cfg(model, micro_batch=4, **kw)
        eng = E.build_engines(cfg, str(model))
        prep, _ = S.prepare(eng, collate(seqs, eng.pad_id), cfg, make_kl_controller("fixed", 0.0))
        assert not prep.on_policy and prep.old_logprobs.abs().sum() > 0, kw


def test_prefix_of_the_whole_minibatch_is_read_once(model, monkeypatch):
    # the system prompt every row starts with is one Context for all micro-batches; the gradient is the same
    seqs = grouped(4, 4, scores=[0, 1, 0, 1] * 4, seed=3)
    cfg = small_cfg(model, minibatch_size=16, micro_batch=4, lr=1e-3)
    made, read = [], []
    monkeypatch.setattr(S, "prefix_context", lambda *a, _f=FW.prefix_context: made.append(1) or _f(*a))
    for path in ("_prefix_forward", "_packed_logits"):  # the padded and the packed pass
        monkeypatch.setattr(FW, path, lambda *a, _f=getattr(FW, path): read.append(a[-1] is not None) or _f(*a))
    _, fast, p_fast = _step(cfg, model, seqs, fast=True)
    assert made == [1] and read == [True] * 4  # one prefix pass, four micro-batches starting from it
    monkeypatch.undo()
    _, slow, p_slow = _step(cfg, model, seqs, monkeypatch, fast=False)
    for k in ("loss", "pg_loss", "grad_norm", "entropy"):
        assert fast[k] == pytest.approx(slow[k], rel=1e-4, abs=1e-5), k
    assert torch.allclose(p_fast, p_slow, atol=1e-4)


def test_sft_step_with_shared_prefixes_matches(model, monkeypatch):
    seqs = grouped(3, 2, seed=4)
    results = []
    for fast in (True, False):
        if not fast:
            for module in (FW, S):
                monkeypatch.setattr(module, "can_share_prefix", lambda m: False)
        cfg = small_cfg(model, algo="sft", minibatch_size=6, micro_batch=2, lr=1e-3)
        eng = E.build_engines(cfg, str(model))
        m = S.sft_update(eng, collate(seqs, eng.pad_id), list(range(6)), cfg)
        results.append((m, flat_params(eng.actor.module)))
    (fast, p_fast), (slow, p_slow) = results
    assert fast["nll"] == pytest.approx(slow["nll"], rel=1e-5) and fast["grad_norm"] == pytest.approx(slow["grad_norm"])
    assert torch.allclose(p_fast, p_slow, atol=1e-4)
