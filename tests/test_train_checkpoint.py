"""A checkpoint's DeepSpeed state leaves out the actor's weights (its safetensors hold them), and a resume still
restores weights and optimizer state exactly, from such a checkpoint and from one that holds the weights."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import small_cfg, synthetic, tiny_model_dir
from trajlake.train import checkpoint as CK
from trajlake.train import engine as E
from trajlake.train.algos import make_kl_controller
from trajlake.train.steps import iteration_update


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


def _trained(model):
    cfg = small_cfg(model, lr=1e-3)
    eng = E.build_engines(cfg, str(model))
    iteration_update(eng, synthetic(8, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1]), cfg,
                     make_kl_controller("fixed", 0.0), 0)
    return cfg, eng


def _same_state(a, b) -> bool:
    sa, sb = a.actor.optimizer.state_dict()["state"], b.actor.optimizer.state_dict()["state"]
    moments = all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in ("exp_avg", "exp_avg_sq"))
    weights = all(torch.equal(p, q) for p, q in zip(a.actor.module.parameters(), b.actor.module.parameters(),
                                                     strict=True))
    return bool(sa) and moments and weights


@pytest.mark.parametrize("with_module", [False, True])
def test_resume_restores_weights_and_optimizer(model, tmp_path, monkeypatch, with_module):
    cfg, eng = _trained(model)
    if with_module:  # a checkpoint written before the weights were left out
        monkeypatch.setattr(CK, "_save_without_module",
                            lambda e, folder, tag: e.save_checkpoint(str(folder), tag=tag, save_latest=False))
    CK.save(eng, tmp_path / "step-1", state={"step": 1}, save_optimizer=True)
    # DeepSpeed's own state file, written by this test just above (DeepSpeed pickles its config in it, so
    # weights_only cannot read it); trajlake itself never loads a pickle: its weights are safetensors
    saved = torch.load(next((tmp_path / "step-1" / CK.DS_DIR / "actor").glob("*model_states.pt")),
                       weights_only=False)
    assert bool(saved["module"]) is with_module and saved["optimizer"]["state"]
    resumed = E.build_engines(cfg, str(tmp_path / "step-1"))
    assert CK.load_state(resumed, tmp_path / "step-1") == {"step": 1}
    assert _same_state(eng, resumed)
