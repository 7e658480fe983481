"""A checkpoint's DeepSpeed state leaves out the actor's weights (its safetensors hold them), and a resume still
restores weights and optimizer state exactly, from such a checkpoint and from one that holds the weights. Written
in the background (the RL loop, train/checkpoint_writer.py), a checkpoint is the same files, and a folder whose
writes had not ended is not one a run resumes from."""

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
                            lambda e, folder, tag, writer=None: e.save_checkpoint(str(folder), tag=tag,
                                                                                  save_latest=False))
    CK.save(eng, tmp_path / "step-1", state={"step": 1}, save_optimizer=True)
    # DeepSpeed's own state file, written by this test just above (DeepSpeed pickles its config in it, so
    # weights_only cannot read it); trajlake itself never loads a pickle: its weights are safetensors
    saved = torch.load(next((tmp_path / "step-1" / CK.DS_DIR / "actor").glob("*model_states.pt")),
                       weights_only=False)
    assert bool(saved["module"]) is with_module and saved["optimizer"]["state"]
    resumed = E.build_engines(cfg, str(tmp_path / "step-1"))
    assert CK.load_state(resumed, tmp_path / "step-1") == {"step": 1}
    assert _same_state(eng, resumed)


def test_a_checkpoint_written_in_the_background_is_the_same_and_whole_only_once_written(model, tmp_path):
    import threading

    from trajlake.train.checkpoint_writer import PARTIAL, BackgroundWriter

    cfg, eng = _trained(model)
    CK.save(eng, tmp_path / "now", state={"step": 1}, save_optimizer=True)
    writer, gate = BackgroundWriter(), threading.Event()
    writer.submit(gate.wait)  # the disk is busy: the checkpoint's writes queue behind this
    CK.save(eng, tmp_path / "later", state={"step": 1}, save_optimizer=True, writer=writer)
    assert (tmp_path / "later" / "config.json").is_file()  # the weights are written before save returns
    assert not CK.is_complete(tmp_path / "later") and CK.is_complete(tmp_path / "now")
    assert not list((tmp_path / "later").rglob("*.pt")) and not list((tmp_path / "later").rglob(f"*{PARTIAL}"))
    gate.set()
    writer.close()
    assert CK.is_complete(tmp_path / "later") and not list((tmp_path / "later").rglob(f"*{PARTIAL}"))
    files = sorted(p.relative_to(tmp_path / "now") for p in (tmp_path / "now").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "later") for p in (tmp_path / "later").rglob("*") if p.is_file())
    # the same bytes as the synchronous save's (DeepSpeed's state files included: compared as bytes, never
    # unpickled)
    assert all((tmp_path / "now" / f).read_bytes() == (tmp_path / "later" / f).read_bytes() for f in files)
    resumed = E.build_engines(cfg, str(tmp_path / "later"))
    assert CK.load_state(resumed, tmp_path / "later") == {"step": 1} and _same_state(eng, resumed)


def test_a_failed_background_write_is_raised_where_the_loop_waits(model, tmp_path):
    from trajlake.train.checkpoint_writer import BackgroundWriter

    _, eng = _trained(model)
    writer = BackgroundWriter()
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / CK.STATE_FILE).mkdir()  # a folder where the state file goes: its write fails
    CK.save(eng, tmp_path / "step-1", state={"step": 1}, save_optimizer=True, writer=writer)
    with pytest.raises(OSError):
        writer.wait()
    writer.close()  # the failure was raised once; the writer closes cleanly


def test_a_run_resumes_from_the_last_whole_checkpoint(model, tmp_path, lake):
    """The run stopped while step 2's optimizer state was being written: its rows are stored, its folder has no
    trainer_state.json, and the run resumes from step 1 (step 2 is trained again, the same on the same machine)."""
    _, eng = _trained(model)
    for step in (1, 2):
        path = tmp_path / f"step-{step}"
        CK.save(eng, path, state={"step": step}, save_optimizer=True)
        CK.commit(lake, run_id="r", step=step, metrics={}, snapshot_read=None,
                  policy=CK.policy_row(run_id="r", step=step, path=path, base_model="tiny", parent=None))
    assert CK.last_checkpoint(lake, "r").step == 2
    (tmp_path / "step-2" / CK.STATE_FILE).unlink()
    assert CK.last_checkpoint(lake, "r").step == 1
