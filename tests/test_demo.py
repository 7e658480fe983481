"""The demo end to end at a tiny size: every stage runs on real parts, the results table is printed from the
store, the report is written, and a second run resumes (nothing is played or trained again)."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import tiny_model_dir
from trajlake.core.errors import TrajlakeError
from trajlake.recipes.demo import PRESETS, STAGE_CONFIGS, DemoConfig, evaluate_policies, main
from trajlake.recipes.stages import layered
from trajlake.store import Lake

SMALL = ["--demos", "64", "--sft-steps", "4", "--sft-every", "2", "--iterations", "2", "--tasks", "4", "--samples", "2",
         "--micro-batch", "8", "--eval-tasks", "4"]


@pytest.mark.slow
def test_demo_runs_every_stage_and_resumes(tmp_path, tmp_path_factory, capsys):
    models = tmp_path / "models"
    shutil.copytree(tiny_model_dir(tmp_path_factory), models / "tiny")
    data = tmp_path / "no-data"
    args = ["--lake", str(tmp_path / "lake"), "--models", str(models), "--data", str(data),
            "--report", str(tmp_path / "report"), "--checkpoints", str(tmp_path / "ckpt"), *SMALL]
    assert main(args) == 0
    out = capsys.readouterr().out
    for text in ("scripted:doors?noise=0.9", "SFT plateau", "GRPO", "held-out greedy success", "learning curve",
                 "val_success", "report:", "demo finished"):
        assert text in out, text
    assert (tmp_path / "report" / "index.html").is_file()
    events = list((tmp_path / "ckpt" / "demo-grpo" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and "tensorboard --logdir" in out, "the GRPO run's curves go to TensorBoard"
    with Lake.open(str(tmp_path / "lake")) as lake:
        kinds = dict(lake.query("SELECT kind, count(*) AS n FROM runs GROUP BY kind").iter_rows())
        # an eval run per policy and split: the two SFT checkpoints on val, the start, the plateau and GRPO on test
        # (the start's test run is played once and read back in the final table), and GRPO's own val evals
        # (before its first iteration and after its last); sft and grpo trained
        assert kinds["eval"] == 7 and kinds["train"] == 2
        val = lake.query("SELECT DISTINCT e.policy_id FROM episodes e JOIN runs r USING (run_id) "
                         "WHERE r.kind = 'eval' AND r.run_id LIKE '%-val-%' ORDER BY 1")["policy_id"].to_list()
        assert val == ["demo-sft/step-2", "demo-sft/step-4"]
        expert = lake.query("SELECT DISTINCT policy_id FROM episodes WHERE run_id = 'demo-expert'").item()
        assert expert == "scripted:doors?noise=0.9"
        steps = lake.query("SELECT count(*) FROM train_steps WHERE run_id = 'demo-grpo' AND policy_id IS NOT NULL")
        assert steps.item() == 2
        before = (lake.count("episodes"), lake.count("train_steps"), lake.count("policies"))
    assert main(args) == 0  # everything is stored: the second run only reads it back
    assert "held-out greedy success" in capsys.readouterr().out
    with Lake.open(str(tmp_path / "lake")) as lake:
        assert (lake.count("episodes"), lake.count("train_steps"), lake.count("policies")) == before


def test_demo_config_errors():
    with pytest.raises(TrajlakeError, match="unknown model 'gpt'"):
        DemoConfig(model="gpt")
    with pytest.raises(TrajlakeError, match=r"^demo: the grpo stage's iterations must be >= 1, got 0$"):
        DemoConfig(grpo={"iterations": 0})
    with pytest.raises(TrajlakeError, match=r"checkpoint_every \(200\) must be <= its sft_steps \(100\)"):
        DemoConfig(**layered({"sft_steps": 100, "sft_every": 200}))
    with pytest.raises(TrajlakeError, match=r"^demo: the sft stage: .*sft-doors-noisy\.toml: unknown key\(s\) lrr"):
        DemoConfig(sft={"lrr": 1e-3})
    with pytest.raises(TrajlakeError, match=r"^demo: the sft stage: train config: micro_batch must be >= 1, got 0$"):
        DemoConfig(**layered({"micro_batch": 0}))
    with pytest.raises(TrajlakeError, match="expert_noise must be between 0 and 1, got 1.5"):
        DemoConfig(expert_noise=1.5)
    with pytest.raises(TrajlakeError, match="difficulty of doors must be one of 1, 2, 3, 4, got 9"):
        DemoConfig(difficulty=9)
    with pytest.raises(TrajlakeError, match="demo: unknown env 'nosuch'; valid envs: .*doors"):
        DemoConfig(env="nosuch")
    assert DemoConfig(env="maze", difficulty=1, expert_noise=0).expert == "scripted:maze"
    with pytest.raises(TrajlakeError, match=r"val_tasks must be >= 1 \(or unset: eval_tasks\), got 0"):
        DemoConfig(val_tasks=0)


def test_a_recipe_holds_only_what_it_changes_of_its_stages_configs():
    """Each stage's settings have one default, in its train config file: the demo's SFT and GRPO stages are those
    files as they are, a preset or a flag changes only what it names, and the flags merge into the stages."""
    from trajlake.train.config import CONFIGS_DIR, load_config

    cfg = DemoConfig()
    for stage, file in STAGE_CONFIGS.items():
        assert cfg.stage_config(stage) == load_config(CONFIGS_DIR / file, checkpoint_dir=str(
            cfg.checkpoints.absolute()), seed=0, progress=True).replace(**cfg.rollout)
    smol = DemoConfig(**layered(PRESETS["smollm2"], {"iterations": 3, "micro_batch": 4}))
    grpo, sft = smol.stage_config("grpo"), smol.stage_config("sft")
    assert (grpo.run.iterations, grpo.optim.lr, grpo.optim.micro_batch, grpo.rollout.task_selector) == (
        3, 1e-6, 4, "learnable")
    assert (sft.sft.steps, sft.optim.lr, sft.optim.micro_batch, sft.optim.minibatch_size) == (
        40, 2e-5, 4, 16)  # the file's batch


def test_val_tasks_sizes_the_choices_on_val_and_not_the_test(tmp_path, tmp_path_factory):
    """Val evaluations (SFT checkpoints, the sweep, GRPO's) play val_tasks; the held-out test plays eval_tasks."""
    model = tiny_model_dir(tmp_path_factory)
    cfg = DemoConfig(lake=str(tmp_path / "lake"), eval_tasks=3, val_tasks=2, progress=False)
    assert DemoConfig(eval_tasks=3).val_eval_tasks == 3
    with Lake.open(cfg.lake) as lake:
        test = evaluate_policies(cfg, lake, [f"hf:{model}"], model)
        val = evaluate_policies(cfg, lake, [f"hf:{model}"], model, split="val")
    assert (test["tasks"][0], val["tasks"][0]) == (3, 2)


def test_demo_reports_errors_in_one_line(tmp_path, capsys):
    assert main(["--lake", str(tmp_path / "x"), "--iterations", "0"]) == 1
    assert "iterations must be >= 1" in capsys.readouterr().err


def test_the_grpo_curve_reads_each_steps_metrics_as_the_viewer_does(tmp_path):
    """The curve the recipes print: the first iteration, every `every`-th and each evaluated one; a metric a step
    lacks (or holds as text) shows '-' or its default, as view.train_data.metric reads it."""
    from trajlake.recipes.demo import grpo_curve
    from trajlake.schemas.records import Run, TrainStep

    metrics = {0: {"eval_success": 0.1}, 1: {"success_mean": 0.5, "kl": 0.00012345, "sampling_rounds": 2},
               2: {"success_mean": "0.7"}, 3: {"success_mean": 0.75, "eval_success": 0.25}, 4: {"success_mean": 1}}
    with Lake.open(str(tmp_path / "lake")) as lake:
        lake.append({"runs": [Run("g", "train", status="finished")],
                     "train_steps": [TrainStep("g", s, None, 1, m) for s, m in metrics.items()]}, stage="test",
                    run_id="g")
        curve = grpo_curve(lake, "g", every=4)
        assert curve["iteration"].to_list() == [1, 3, 4]  # the first, the evaluated one, every 4th
        assert curve["sampled_success"].to_list() == [0.5, 0.75, 1.0]
        assert curve["greedy_val_success"].to_list() == ["-", "0.25", "-"]
        assert curve["kl_to_start"].to_list() == ["0.00012", "-", "-"] and curve["rounds"].to_list() == [2, 1, 1]
        assert grpo_curve(lake, "g", metrics=("success_mean",))["sampled_success"].to_list() == [0.5, None, 0.75, 1.0]
