"""The packed forward pass (train/packing.py) gives what the padded one gives: the same per-token log-probs
and entropies and the same gradients, with a shared prefix, from a mini-batch's Context, and for rows that
share nothing; the layout and mask it builds; when it is taken; and the update's other cheap paths (the
entropy metric, the weights' finiteness check, the fused AdamW)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.helpers import flat_params, small_cfg, tiny_model_dir
from trajlake.train import engine as E
from trajlake.train import forward as FW
from trajlake.train import steps as S
from trajlake.train.algos import entropy_from_logits, entropy_metric, make_kl_controller
from trajlake.train.batch import EpisodeSeq, collate
from trajlake.train.finite import weights_finite
from trajlake.train.packing import PassCosts, pack_rows, packed_cost, packed_mask, padded_cost, pass_costs


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def test_pack_rows_layout():
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [1, 2, 3, 6, 7, 8]])
    p = pack_rows(ids, [5, 6], prefix=3, start=3)
    assert p.ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert p.positions.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5]]
    assert p.segments.tolist() == [-1, -1, -1, 0, 0, 1, 1, 1]
    # position 3 of row 0 scores column 4; positions 3..4 of row 1 score columns 4..5
    assert p.rows.tolist() == [0, 1, 1] and p.cols.tolist() == [4, 4, 5]
    assert p.scored.tolist() == [3, 5, 6]
    assert p.ids[0, p.scored].tolist() == [4, 6, 7]  # the token before each scored one
    # two tokens held as a context: the packed row starts after them
    c = pack_rows(ids, [5, 6], prefix=3, start=3, context=2)
    assert c.ids.tolist() == [[3, 4, 5, 6, 7, 8]] and c.positions.tolist() == [[2, 3, 4, 3, 4, 5]]
    assert c.scored.tolist() == [1, 3, 4] and c.rows.tolist() == p.rows.tolist()
    # nothing shared: the rows one after the other
    n = pack_rows(ids, [5, 6], prefix=0, start=3)
    assert n.ids.tolist() == [[1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 8]] and n.segments.tolist() == [0] * 5 + [1] * 6
    assert n.scored.tolist() == [3, 8, 9]
    with pytest.raises(ValueError):
        pack_rows(ids, [5, 6], prefix=4, start=3)
    with pytest.raises(ValueError):
        pack_rows(ids, [4, 6], prefix=3, start=3)  # row 0 has nothing after column 3


def test_packed_mask_is_causal_within_each_row():
    seg = torch.tensor([-1, -1, 0, 0, 1])
    m = packed_mask(seg, context=1, dtype=torch.float32)[0, 0]
    seen = (m == 0).int().tolist()
    assert seen == [[1, 1, 0, 0, 0, 0],
                    [1, 1, 1, 0, 0, 0],
                    [1, 1, 1, 1, 0, 0],
                    [1, 1, 1, 1, 1, 0],
                    [1, 1, 1, 0, 0, 1]]  # row 1's token sees the context, the prefix and itself
    assert float(m.min()) == torch.finfo(torch.float32).min


def test_packing_is_taken_where_it_computes_less(model):
    from trajlake.lm.load import load_model

    costs = pass_costs(load_model(str(model)).config)
    assert 0 < costs.pair < 0.01 and costs.call > 0
    assert pass_costs(object()) == PassCosts(0.0, 0.0)
    # short rows of unequal lengths: packing saves padding and the prefix's own pass
    assert packed_cost([160, 120, 100, 150], 110, 90, costs) < padded_cost(4, 160, 110, 90, costs)
    # long rows sharing a short prefix: the dense mask of the packed row costs more than the padding
    assert packed_cost([3000, 2900, 3000, 2950], 20, 0, costs) > padded_cost(4, 3000, 20, 0, costs)


def rows(n_groups: int, group_size: int, *, seed: int, shared: int = 30, vocab: int = 500) -> list[EpisodeSeq]:
    """Episodes of unequal lengths (so the padded pass pads): a prefix shared by all, a prompt per group,
    then replies of 3 to 20 tokens, some with a second prompt and reply (a prompt token in the middle)."""
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(shared)]
    out = []
    for g in range(n_groups):
        task = system + [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 9))]
        for k in range(group_size):
            reply = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 20))]
            ids, mask = task + reply, [0] * len(task) + [1] * len(reply)
            if k % 2:
                more = [rng.randrange(3, vocab) for _ in range(rng.randrange(2, 6))]
                ids, mask = ids + more + [5, 6, 7], mask + [0] * len(more) + [1, 1, 1]
            out.append(EpisodeSeq(f"ep{g}-{k}", f"g{g}", False, ids, mask, [float("nan")] * len(ids)))
    return out


def _forward(net, b, monkeypatch, *, packed: bool, context: int | None = None, **kw):
    """Log-probs, entropies (both masked) and the gradient of a loss on both, by the packed or the padded pass."""
    monkeypatch.setattr(FW, "_packs", lambda *a: packed)
    net.zero_grad()
    start = FW.first_scored(b.loss_mask)
    ctx = FW.prefix_context(net, b.input_ids[:1, :context]) if context else None
    lp, ent = FW.forward_logprobs(net, b.input_ids, b.attention_mask, start=start, share_prefix=True,
                                  context=ctx, entropy=True, **kw)
    ((lp + 0.1 * ent) * b.loss_mask).sum().backward()
    if ctx is not None:
        FW.context_loss(ctx).backward()
    grads = torch.cat([p.grad.reshape(-1).clone() for p in net.parameters()])
    monkeypatch.undo()
    return lp.detach() * b.loss_mask, ent.detach() * b.loss_mask, grads


@pytest.mark.parametrize("case", ["shared prefix", "context", "nothing shared", "temperature"])
def test_packed_pass_matches_the_padded_one(model, monkeypatch, case):
    eng = E.build_engines(small_cfg(model), str(model))
    net = eng.actor.module
    net.train()
    seqs = rows(1, 4, seed=1) if case != "nothing shared" else rows(4, 1, seed=2, shared=0)
    b = collate(seqs, eng.pad_id)
    kw = {"context": 20} if case == "context" else {}
    kw |= {"temperature": 0.7} if case == "temperature" else {}
    lp0, ent0, g0 = _forward(net, b, monkeypatch, packed=False, **kw)
    lp1, ent1, g1 = _forward(net, b, monkeypatch, packed=True, **kw)
    assert int(b.attention_mask.sum()) < b.attention_mask.numel()  # the padded pass pads
    assert torch.allclose(lp1, lp0, atol=1e-5) and torch.allclose(ent1, ent0, atol=1e-5)
    assert torch.allclose(g1, g0, atol=1e-5, rtol=1e-4)
    assert lp0.abs().sum() > 0 and g0.abs().sum() > 0


def _step(cfg, model, seqs):
    eng = E.build_engines(cfg, str(model))
    kl = make_kl_controller("fixed", 0.0)
    prep, m1 = S.prepare(eng, collate(seqs, eng.pad_id), cfg, kl)
    return {**m1, **S.rl_update(eng, prep, cfg, kl, seed=0)}, flat_params(eng.actor.module)


def test_the_update_packs_and_its_step_matches_the_padded_one(model, monkeypatch):
    seqs = rows(4, 4, seed=3)
    for i, s in enumerate(seqs):  # a score per row, so the update has a gradient
        s.rewards = [0.0] * (len(s) - 1) + [float(i % 3)]
        s.score = float(i % 3)
    cfg = small_cfg(model, minibatch_size=16, micro_batch=4, lr=1e-3)
    packed = []
    monkeypatch.setattr(FW, "_packed_logits", lambda *a, _f=FW._packed_logits: packed.append(1) or _f(*a))
    fast, p_fast = _step(cfg, model, seqs)
    assert len(packed) == 4  # every micro-batch
    monkeypatch.setattr(FW, "_packs", lambda *a: False)
    slow, p_slow = _step(cfg, model, seqs)
    monkeypatch.undo()
    for k in ("loss", "pg_loss", "grad_norm", "entropy"):
        assert fast[k] == pytest.approx(slow[k], rel=1e-4, abs=1e-5), k
    assert slow["grad_norm"] > 0 and torch.allclose(p_fast, p_slow, atol=1e-4)  # Adam amplifies rounding


def test_entropy_metric_matches_entropy_from_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 50, generator=g) * 4
    logits[0, 1, :10] = -math.inf  # a masked vocabulary: computed the stable way
    lse = torch.logsumexp(logits, -1)
    got, ref = entropy_metric(logits, lse), entropy_from_logits(logits)
    assert got.shape == (3, 5) and not got.requires_grad
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all()


def test_weights_finite_with_one_norm_and_its_fallback():
    net = torch.nn.Linear(4, 3)
    assert weights_finite(net)
    with torch.no_grad():
        net.weight[0, 0] = 1e25  # finite, but its square overflows float32: checked element by element
    assert weights_finite(net)
    for bad in (math.nan, math.inf):
        with torch.no_grad():
            net.weight[1, 1] = bad
        assert not weights_finite(net)


def test_the_optimizer_is_torch_adamw_fused_on_cpu(model):
    eng = E.build_engines(small_cfg(model), str(model))
    opt = eng.actor.optimizer
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True


def test_one_process_skips_deepspeeds_all_reduce_and_steps_the_same(model, monkeypatch):
    cfg = small_cfg(model, micro_batch=4, lr=1e-3)
    seqs = rows(2, 4, seed=5)
    for i, s in enumerate(seqs):
        s.rewards = [0.0] * (len(s) - 1) + [float(i % 2)]
        s.score = float(i % 2)
    m_skip, p_skip = _step(cfg, model, seqs)
    assert E.build_engines(cfg, str(model)).actor.enable_backward_allreduce is False
    real = E.make_engine
    monkeypatch.setattr(E, "make_engine", lambda *a, **k: _with_allreduce(real(*a, **k)))
    m_all, p_all = _step(cfg, model, seqs)  # DeepSpeed's all-reduce on: the same weights, bit for bit
    assert m_skip["grad_norm"] > 0 and torch.equal(p_skip, p_all)


def _with_allreduce(engine):
    engine.enable_backward_allreduce = True
    return engine
