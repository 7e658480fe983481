"""No poisoned checkpoints: a step whose loss, gradient norm or updated weights are not finite stops the run in
one line naming the step and what was not finite, stores no checkpoint, policy or train_steps row for it, and
leaves the run marked failed. Real engines on the tiny model; the NaNs and infs come from learning rates the
config accepts (finite, but far too large: the next forward pass overflows) and, for the gradient norm, from a
loss whose value is finite and whose gradient is not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers import expert_lake, small_cfg, synthetic, tiny_model_dir, varied_spec
from trajlake.cli import main
from trajlake.store import Lake
from trajlake.train import engine as E
from trajlake.train.batch import collate
from trajlake.train.finite import NonFiniteError, weights_finite
from trajlake.train.loop import train
from trajlake.train.steps import Meter, minibatch_step

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: The largest lr the config accepts: AdamW's first step leaves weights of about 1e31 (finite), whose logits
#: overflow in the next step (a NaN gradient norm, or loss)
HUGE_LR = 1e30


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture
def lake(tmp_path, model):
    """A lake holding 4 scripted-expert episodes (run `expert`), the SFT data."""
    lk = expert_lake(tmp_path / "lake", model)
    yield lk
    lk.close()


def sft_cfg(model, tmp_path, **kw):
    return small_cfg(model, algo="sft", sft_filter="success", minibatch_size=4, micro_batch=4,
                     checkpoint_dir=str(tmp_path / "ckpt"), **kw)


def stored(lake: Lake, run_id: str) -> tuple:
    """(status, policies' steps, train_steps' steps) of a run; its lease was released (store/lease.py)."""
    assert lake.query("SELECT count(*) FROM run_leases WHERE run_id = ?", [run_id])[0, 0] == 0
    status = lake.query("SELECT status FROM runs WHERE run_id = ?", [run_id])["status"].to_list()
    policies = lake.query("SELECT step FROM policies WHERE run_id = ? AND step IS NOT NULL ORDER BY step",
                          [run_id])["step"].to_list()
    steps = lake.query("SELECT step FROM train_steps WHERE run_id = ? ORDER BY step", [run_id])["step"].to_list()
    return status, policies, steps


def test_sft_step_that_overflows_stops_the_run_storing_nothing_of_the_step(lake, model, tmp_path):
    cfg = sft_cfg(model, tmp_path, run_id="boom", lr=HUGE_LR, sft_steps=3)
    with pytest.raises(NonFiniteError) as e:
        train(cfg, lake)
    assert re.fullmatch(
        r"train run boom stopped at step 2: the (loss|gradient norm) was not finite \((nan|inf)\); nothing of that "
        r"step was stored \(no checkpoint, no policy\) and the run is marked failed: lower lr \(it is 1e\+30\) or set "
        r"grad_clip, and start again under a new --run-id", str(e.value)), str(e.value)
    assert stored(lake, "boom") == (["failed"], [], [])
    assert not (tmp_path / "ckpt" / "boom").exists()


def test_checkpoints_before_the_step_stay_and_are_finite(lake, model, tmp_path):
    """Step 1 leaves huge but finite weights (stored: they are what the user asked for); step 2 stores nothing."""
    cfg = sft_cfg(model, tmp_path, run_id="diverge", lr=HUGE_LR, sft_steps=3, checkpoint_every=1)
    with pytest.raises(NonFiniteError, match=r"^train run diverge stopped at step 2: the (loss|gradient norm) was "
                                             r"not finite"):
        train(cfg, lake)
    assert stored(lake, "diverge") == (["failed"], [1], [1])
    assert not (tmp_path / "ckpt" / "diverge" / "step-2").exists()
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "ckpt" / "diverge" / "step-1" / "model.safetensors"))
    assert all(bool(torch.isfinite(t).all()) for t in weights.values())


def test_grpo_iteration_that_overflows_stores_no_checkpoint(lake, model, tmp_path):
    """Two epochs over the iteration's batch: the second reads the weights the first made huge."""
    cfg = small_cfg(model, run_id="g-boom", tasks=2, samples=2, iterations=2, minibatch_size=4, micro_batch=2,
                    epochs=2, lr=HUGE_LR, reward_spec=varied_spec(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(NonFiniteError, match=r"^train run g-boom stopped at iteration 1: the (loss|gradient "
                                             r"norm) was not finite \((nan|inf)\); nothing of that step was stored"):
        train(cfg, lake)
    assert stored(lake, "g-boom") == (["failed"], [], [])
    assert lake.query("SELECT count(*) FROM episodes WHERE run_id = 'g-boom/it-1'")[0, 0] == 4  # its rollouts stay
    assert not (tmp_path / "ckpt" / "g-boom").exists()


def test_ppo_critic_that_diverges_names_the_critic(lake, model, tmp_path):
    cfg = small_cfg(model, algo="ppo", run_id="p-boom", tasks=2, samples=2, iterations=1, minibatch_size=2,
                    micro_batch=2, epochs=2, critic_lr=HUGE_LR, checkpoint_dir=str(tmp_path / "ckpt"))
    with pytest.raises(NonFiniteError, match=r"^train run p-boom stopped at iteration 1: the critic loss was "
                                             r"not finite .* lower critic_lr \(it is 1e\+30\)"):
        train(cfg, lake)
    assert stored(lake, "p-boom") == (["failed"], [], [])


def test_a_finite_loss_with_a_non_finite_gradient_is_caught(model):
    """sqrt(|w - w|) is 0 with a NaN gradient: the loss passes, the gradient norm stops the step (and the
    weights, which the step made NaN, are reported only after it)."""
    cfg = small_cfg(model, algo="sft", minibatch_size=4, micro_batch=4)
    engines = E.build_engines(cfg, str(model))
    batch = collate(synthetic(4), engines.pad_id)
    weight = next(p for p in engines.actor.module.parameters() if p.requires_grad)

    def micro_loss(sub, idx, denom, context=None):
        return torch.sqrt((weight[0, 0] - weight[0, 0].detach()).abs()), {}

    with pytest.raises(NonFiniteError) as e:
        minibatch_step(engines.actor, batch, list(range(4)), cfg, engines, micro_loss, Meter())
    assert e.value.what == "gradient norm" and str(e.value) == "the gradient norm was not finite (nan)"
    assert not weights_finite(engines.actor)  # the step had applied it: the run must stop, not checkpoint


def test_cli_train_with_an_overflowing_lr_exits_1_in_one_line(lake, model, tmp_path, capsys):
    """`lr = inf` once exited 0 with a checkpoint of NaN weights; inf is refused now, and a finite lr whose
    update overflows stops the run in one line, exit 1."""
    lake.close()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'model = "{model}"\nalgo = "sft"\nsft_steps = 2\nminibatch_size = 4\nmicro_batch = 4\n'
                   f'progress = false\nsave_optimizer = false\ncheckpoint_dir = "{tmp_path / "ckpt"}"\n'
                   f'lr = {HUGE_LR}\n')
    capsys.readouterr()
    assert main(["--lake", str(tmp_path / "lake"), "train", "--config", str(cfg), "--run-id", "cli-boom"]) == 1
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert re.match(r"error: train run cli-boom stopped at step 2: the (loss|gradient norm) was not finite",
                    err[-1]), err
    assert not any("Traceback" in line for line in err)
    with Lake.open(str(tmp_path / "lake")) as lk:
        assert stored(lk, "cli-boom") == (["failed"], [], [])
    assert not Path(tmp_path / "ckpt" / "cli-boom" / "step-2").exists()
