"""Outcome first: a GRPO group whose samples all won or all lost carries no outcome gradient, and an update on such
groups alone does not move the weights (defect 2 and 3 of the TextCraft run, where shaping noise of std 0.04 got
a win's weight after the group-std division and every update moved 89% of the weights)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import flat_params, small_cfg, synthetic, tiny_model_dir
from trajlake.train import engine as E
from trajlake.train.algos import GROUP_FILTERS, compute_grpo, make_kl_controller, outcome_groups
from trajlake.train.batch import collate
from trajlake.train.config import ConfigError, config_from_dict
from trajlake.train.steps import prepare, rl_update

#: two groups of 4 that never won, told apart only by progress terms (the TextCraft iteration measured), one mixed
NOISE = [0.01, 0.03, 0.0, 0.02, 0.04, 0.0, 0.01, 0.0]
MIXED = [1.02, 0.01, 0.03, 0.0]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def test_outcome_groups_golden():
    success = torch.tensor([0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1], dtype=torch.bool)
    ids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    rows, differ, groups = outcome_groups(success, ids)
    assert rows.tolist() == [False] * 4 + [True] * 4 + [False] * 4 and (differ, groups) == (1, 3)
    assert GROUP_FILTERS["outcome_differs"](success=success, group_ids=ids).tolist() == rows.tolist()
    assert GROUP_FILTERS["all"](success=success, group_ids=ids).all()
    # a group of one never differs; order of groups does not matter
    rows, differ, groups = outcome_groups(torch.tensor([True, False, True]), ["x", "y", "x"])
    assert rows.tolist() == [False, False, False] and (differ, groups) == (0, 2)


def test_std_normalised_noise_gets_a_wins_weight_unless_filtered():
    """The old behaviour, kept as a fact: grpo divides progress noise by its tiny std, so no-win groups get
    advantages as large as a win's. The default filter zeroes them."""
    seqs = synthetic(12, group_size=4, scores=NOISE + MIXED)
    batch = collate(seqs, 0)
    adv, _ = compute_grpo(token_level_rewards=batch.token_rewards, mask=batch.loss_mask, group_ids=batch.group_ids)
    per_seq = adv.abs().amax(-1)
    assert per_seq[:8].mean() > 0.7  # noise at full size
    keep = GROUP_FILTERS["outcome_differs"](success=batch.success, group_ids=batch.group_ids)
    assert keep.tolist() == [False] * 8 + [True] * 4
    assert (per_seq * keep)[:8].sum() == 0  # no outcome, no advantage
    # where there is an outcome difference, the win dominates the shaping terms
    win = adv[8].abs().amax() * torch.sign(adv[8][batch.loss_mask[8] > 0][0])
    assert win > 1.0 and all(adv[i][batch.loss_mask[i] > 0][0] < 0 for i in (9, 10, 11))


def _update(cfg, model, scores):
    eng = E.build_engines(cfg, str(model), ref=cfg.kl.coef > 0)
    before = flat_params(eng.actor.module)
    kl = make_kl_controller(cfg.kl.controller, cfg.kl.coef, cfg.kl.target, cfg.kl.horizon)
    batch = collate(synthetic(len(scores), group_size=4, scores=scores), eng.pad_id)
    prep, m1 = prepare(eng, batch, cfg, kl)
    m = {**m1, **rl_update(eng, prep, cfg, kl, seed=0)}
    return before, flat_params(eng.actor.module), m


def test_an_update_on_groups_without_an_outcome_difference_does_not_move_the_weights(model):
    # the defaults: outcome_differs, a KL anchor to the start (k3), lr 1e-6
    defaults = config_from_dict(dict(model="m"))
    cfg = small_cfg(model, kl_coef=defaults.kl.coef, lr=defaults.optim.lr, group_filter=None)
    assert cfg.group_filter_name == "outcome_differs" and cfg.kl.coef > 0 and cfg.optim.lr == 1e-6
    before, after, m = _update(cfg, model, NOISE)
    assert torch.equal(before, after)
    assert m["outcome_groups"] == 0.0 and m["groups"] == 2 and m["groups_kept"] == 0 and m["actor_sequences"] == 0
    # the old behaviour (every group kept) moved every weight on the same noise
    before, after, m = _update(cfg.replace(group_filter="all"), model, NOISE)
    assert not torch.equal(before, after) and m["actor_sequences"] == 8


def test_groups_with_an_outcome_difference_are_trained_on(model):
    cfg = small_cfg(model, group_filter=None)
    before, after, m = _update(cfg, model, NOISE + MIXED)
    assert not torch.equal(before, after)
    assert m["outcome_groups"] == pytest.approx(1 / 3) and m["groups_kept"] == 1 and m["actor_sequences"] == 4


def test_the_kl_anchor_bounds_the_drift_from_the_start(model):
    """Several updates on the same winning group: with the anchor the policy stays closer to the start."""
    def drift(kl_coef: float) -> float:
        cfg = small_cfg(model, kl_coef=kl_coef, lr=1e-3, epochs=8, minibatch_size=4, micro_batch=4)
        before, after, _ = _update(cfg, model, MIXED)
        return float((after - before).norm())

    free, anchored = drift(0.0), drift(5.0)
    assert 0 < anchored < free


def test_lr_warmup_rises_linearly(model):
    cfg = small_cfg(model, lr=1e-3, lr_warmup_steps=4)
    eng = E.build_engines(cfg, str(model))
    lrs = []  # the lr of each optimizer step: the scheduler steps after each one
    for _ in range(6):
        lrs.append(eng.actor.optimizer.param_groups[0]["lr"])
        eng.actor.lr_scheduler.step()
    assert lrs == pytest.approx([1e-3 * f for f in (0.25, 0.25, 0.4375, 0.625, 0.8125, 1.0)])
    plain = E.build_engines(small_cfg(model, lr=1e-3), str(model)).actor
    assert plain.lr_scheduler is None and plain.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_group_filter_config_rules():
    with pytest.raises(ConfigError, match=r"unknown group_filter 'best'; valid: all, outcome_differs"):
        config_from_dict(dict(model="m", group_filter="best"))
    with pytest.raises(ConfigError, match=r"group_filter outcome_differs .* samples must be >= 2, got 1"):
        config_from_dict(dict(model="m", advantage="reinforce_plus_plus", samples=1, group_filter="outcome_differs"))
    # a token-level estimator compares no group: it keeps every one by default, and may play one sample per task
    assert config_from_dict(dict(model="m", advantage="reinforce_plus_plus", samples=1)).group_filter_name == "all"
    assert config_from_dict(dict(model="m", algo="ppo", samples=1)).group_filter_name == "all"  # ppo's default
    # a run stored before the filter existed kept every group: resumed as it was, refused under the new default
    stored = {k: v for k, v in config_from_dict(dict(model="m")).to_dict().items() if k != "group_filter"}
    assert config_from_dict(dict(model="m", group_filter="all")).differences(stored) == []
    assert config_from_dict(dict(model="m")).differences(stored) == [("group_filter", "all", "outcome_differs")]
