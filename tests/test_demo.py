"""The demo end to end at a tiny size: every stage runs on real parts, the results table is printed from the
store, the report is written, and a second run resumes (nothing is played or trained again)."""

from __future__ import annotations

import shutil

import pytest

from tests.test_rollout import tiny_model_dir
from trajlake.demo import DemoConfig, main
from trajlake.store import Lake, TrajlakeError

SMALL = ["--expert-tasks", "32", "--sft-steps", "4", "--iterations", "2", "--tasks", "4", "--samples", "2",
         "--micro-batch", "8", "--eval-tasks", "4"]


def test_demo_runs_every_stage_and_resumes(tmp_path, tmp_path_factory, capsys):
    models = tmp_path / "models"
    shutil.copytree(tiny_model_dir(tmp_path_factory), models / "tiny")
    data = tmp_path / "no-data"
    args = ["--lake", str(tmp_path / "lake"), "--models", str(models), "--data", str(data),
            "--report", str(tmp_path / "report"), *SMALL]
    assert main(args) == 0
    out = capsys.readouterr().out
    for text in ("scripted-expert", "SFT warm start", "GRPO", "held-out greedy success", "learning curve",
                 "report:", "demo finished"):
        assert text in out, text
    assert (tmp_path / "report" / "index.html").is_file()
    with Lake.open(str(tmp_path / "lake")) as lake:
        kinds = dict(lake.query("SELECT kind, count(*) AS n FROM runs GROUP BY kind").iter_rows())
        assert kinds["eval"] == 3 and kinds["train"] == 2  # start, SFT and GRPO evaluated; sft + grpo trained
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
    with pytest.raises(TrajlakeError, match="iterations must be >= 1"):
        DemoConfig(iterations=0)


def test_demo_reports_errors_in_one_line(tmp_path, capsys):
    assert main(["--lake", str(tmp_path / "x"), "--iterations", "0"]) == 1
    assert "iterations must be >= 1" in capsys.readouterr().err
