"""Bit-exact replay of a train step (train/reproduce.py, `trajlake train --replay RUN --step N`): a step is
recomputed from its start checkpoint, optimizer state, episodes (episodes_where at snapshot_read), spec and
seed, and equals the stored checkpoint bit for bit; a changed checkpoint is reported with its largest
difference; every refusal names what is missing; nothing is written."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import small_cfg, tiny_model_dir, varied_spec
from trajlake.cli import main
from trajlake.store import Lake
from trajlake.train.loop import train
from trajlake.train.reproduce import ReplayError, replay_step

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """GRPO (3 iterations: adaptive KL against a reference, fresh rollouts plus replayed groups from the
    second on) and PPO (2 iterations: a critic), both with their optimizer state; and a GRPO run without."""
    folder = tmp_path_factory.mktemp("reproduce")
    model = tiny_model_dir(tmp_path_factory)
    spec = varied_spec(folder)
    uri = str(folder / "lake")
    with Lake.open(uri) as lake:
        _train_runs(lake, model, spec, folder)
    return uri, folder


def _train_runs(lake, model, spec, folder):
    common = dict(tasks=2, samples=2, minibatch_size=2, micro_batch=2, reward_spec=spec, lr=1e-3, grad_clip=1.0,
                  checkpoint_dir=str(folder / "ckpt"), save_optimizer=True)
    train(small_cfg(model, run_id="g", iterations=3, kl_coef=0.05, kl_controller="adaptive", kl_target=0.01,
                    kl_horizon=100, replay_ratio=0.5, old_logprobs="behaviour", epochs=2, **common), lake)
    train(small_cfg(model, run_id="p", algo="ppo", iterations=2, **common), lake)
    train(small_cfg(model, run_id="nostate", iterations=2, **{**common, "save_optimizer": False}), lake)


@pytest.fixture
def lake(runs):
    with Lake.open(runs[0]) as lake:
        yield lake


def test_every_grpo_step_replays_bit_for_bit(lake):
    before = lake.snapshots().height
    for step in (1, 2, 3):
        report = replay_step(lake, "g", step)
        assert report.bit_exact, report.describe()
        assert report.tensors > 0 and report.max_abs_diff == 0.0 and "bit for bit" in report.describe()
        assert report.recorded == report.machine  # the checkpoint records what it ran with
    replayed = lake.query("SELECT metrics->>'replayed' AS r FROM train_steps WHERE run_id = 'g' AND step = 3")
    assert float(replayed["r"][0]) > 0, "step 3 mixed replayed groups into its fresh ones"
    assert lake.snapshots().height == before, "a replay writes nothing"


def test_ppo_step_with_its_critic_replays_bit_for_bit(lake):
    report = replay_step(lake, "p", 2)
    assert report.bit_exact, report.describe()


def test_a_changed_checkpoint_is_reported_with_its_largest_difference(runs, capsys):
    uri, folder = runs
    path = folder / "ckpt" / "g" / "step-2" / "model.safetensors"
    original = path.read_bytes()
    weights = load_file(path)
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    save_file(weights, path, metadata={"format": "pt"})
    try:
        with Lake.open(uri) as lake:
            report = replay_step(lake, "g", 2)
        assert not report.bit_exact and report.differing == 1 and report.worst == name
        assert report.max_abs_diff == pytest.approx(1e-3, rel=0.05)
        assert "checkpoint was changed" in report.describe()
        assert main(["--lake", uri, "train", "--replay", "g", "--step", "2"]) == 1
        assert "1 of" in capsys.readouterr().out
        assert main(["--lake", uri, "train", "--replay", "g", "--step", "2", "--atol", "0.01"]) == 0
    finally:
        path.write_bytes(original)
    assert main(["--lake", uri, "train", "--replay", "g", "--step", "2"]) == 0
    assert "bit for bit" in capsys.readouterr().out


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_another_thread_count_is_named_when_weights_differ(lake):
    torch.set_num_threads(2)
    try:
        report = replay_step(lake, "g", 3)
    finally:
        torch.set_num_threads(1)
    assert report.recorded["threads"] == 1 and report.machine["threads"] == 2
    if not report.bit_exact:  # the tiny model's sums may well come out the same: then there is nothing to name
        assert "threads 1" in report.describe() and "threads 2" in report.describe()


@pytest.mark.parametrize("run_id, step, message", [
    ("nope", 1, "no run 'nope'"),
    ("g/it-1", 1, "is a collect run"),
    ("g", 0, "--step must be 1 or more"),
    ("g", 9, "has no checkpointed step 9 (its steps: 1 to 3)"),
    ("nostate", 2, "holds no optimizer state"),
])
def test_refusals_name_what_is_missing(lake, run_id, step, message):
    before = lake.snapshots().height
    with pytest.raises(ReplayError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replay_step(lake, run_id, step)
    assert lake.snapshots().height == before


def test_a_run_without_optimizer_state_still_replays_its_first_step(lake):
    assert replay_step(lake, "nostate", 1).bit_exact


def test_cli_replay_options_go_together_and_alone(runs, capsys):
    uri, _ = runs
    assert main(["--lake", uri, "train", "--replay", "g"]) == 2
    assert "--replay RUN_ID and --step N go together" in capsys.readouterr().err
    assert main(["--lake", uri, "train", "--replay", "g", "--step", "1", "--config", "x.toml"]) == 2
    assert "drop --config" in capsys.readouterr().err
    assert main(["--lake", uri, "train"]) == 2
    assert "Missing option '--config' (or --replay" in capsys.readouterr().err
