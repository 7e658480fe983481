"""`make demo > log` reads cleanly: the demo at a tiny size with stdout and stderr piped (as in a log file) prints
no third-party warning, no line of a table or of prose wrapped or cut, and its progress as whole lines; the
imported episodes, which carry no success flag, say so instead of NULL."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import tiny_model_dir
from trajlake.store import Lake
from trajlake.store.reads import NO_OUTCOME, imported_summary
from trajlake.train.eval_guard import best_eval_policy

SMALL = ["--demos", "64", "--sft-steps", "2", "--sft-every", "2", "--iterations", "1", "--tasks", "2",
         "--samples", "2", "--micro-batch", "4", "--eval-tasks", "2"]
#: what a third-party warning or chatter line holds (torch's FutureWarning, transformers' deprecation log,
#: DeepSpeed's build line and its [INFO]/[WARNING] log lines)
NOISE = re.compile(r"warn|deprecat|built successfully|\[INFO\]|Traceback", re.IGNORECASE)
#: a progress line: `NAME WHAT DONE/TOTAL  STATS  ELAPSEDs`
PROGRESS = re.compile(r"(collect|train|import) \S+ \d+/\d+(  \S.*)?  \d+s")
#: environment variables that would make rich treat the pipe as a terminal, change which warnings show, or
#: (left by an earlier test in this process: accelerate's, a trainer's) make the demo join a process group
NOT_PASSED = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "PYTHONWARNINGS", "TRAJLAKE_DEBUG", "RANK",
              "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _agentgym_rows(n: int) -> list[dict]:
    """AgentGym-format TextCraft trajectories (conversations only: no reward, so no success flag)."""
    rows = []
    for i in range(n):
        conv = [
            {"from": "human", "loss": None, "value": "You are a crafter."},
            {"from": "gpt", "loss": False, "value": "OK. I'll follow your instructions."},
            {"from": "human", "loss": None, "value": f"Goal: craft item {i}."},
            {"from": "gpt", "loss": True, "value": f"Thought:\nI get it.\n\nAction:\nget {i} stick"},
        ]
        rows.append({"data_source": "textcraft", "item_id": f"textcraft_{i}", "conversations": conv,
                     "reward_model": {"style": "rule", "ground_truth": json.dumps({"item": i})},
                     "extra_info": {"split": "textcraft", "index": i}})
    return rows


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each rich table in `text`: its column names and its body rows, as cells."""
    tables, header, body = [], None, None
    for line in text.splitlines():
        if line.startswith("┏"):
            header, body = [], []
        elif line.startswith("┃") and header == []:
            header = [c.strip() for c in line.strip("┃").split("┃")]
        elif line.startswith("│") and body is not None:
            body.append([c.strip() for c in line.strip("│").split("│")])
        elif line.startswith("└") and body is not None:
            tables.append((header, body))
            header = body = None
    return tables


@pytest.mark.slow  # 23 s: the demo recipe end to end in a subprocess
def test_the_demo_in_a_pipe_reads_cleanly(tmp_path, tmp_path_factory):
    models = tmp_path / "models"
    shutil.copytree(tiny_model_dir(tmp_path_factory), models / "tiny")
    data = tmp_path / "data" / "textcraft"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_agentgym_rows(12)), data / "train.parquet")
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
    args = [sys.executable, "-m", "trajlake.recipes.demo", "--lake", "lake", "--models", str(models),
            "--data", str(tmp_path / "data"), "--report", "report", "--checkpoints", "ckpt", *SMALL]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err[-6000:]

    # no third-party warning, deprecation or build line, on either stream
    noisy = [line for line in (out + err).splitlines() if NOISE.search(line)]
    assert noisy == [], noisy
    # progress: whole lines, never a bar drawn once and cut at 80 columns
    assert err.strip() and all(PROGRESS.fullmatch(line) for line in err.splitlines()), err
    assert "━" not in err and "…" not in out + err

    # every table row on one line, every cell a whole value: the cells are the values the store holds
    tables = {tuple(header): body for header, body in _tables(out)}
    with Lake.open(str(tmp_path / "lake")) as lake:
        grpo = best_eval_policy(lake, "demo-grpo").policy_id  # the RL policy: its best checkpoint on val
        curve = lake.query("SELECT step FROM train_steps WHERE run_id = 'demo-grpo' AND step > 0 ORDER BY 1")
        assert lake.query("SELECT count(success) FROM episodes e JOIN runs r USING (run_id) "
                          "WHERE r.kind = 'import'").item() == 0
        imported = [[str(v) for v in row] for row in imported_summary(lake).iter_rows()]
    assert imported == [["textcraft", "12", "1.0", NO_OUTCOME]]
    assert tables[("env", "episodes", "mean_turns", "success_rate")] == imported
    assert [row[0] for row in tables[("sft_step", "val_success")]] == ["2"]
    results = tables[("stage", "policy", "episodes", "success", "reward", "format_errors", "turns", "tokens",
                      "held_out")]
    assert [row[:3] for row in results] == [["start", "tiny", "2"], ["SFT plateau (step 2)", "demo-sft/step-2", "2"],
                                            [f"GRPO (best on val, {grpo.rsplit('/', 1)[-1]})", grpo, "2"]]
    assert all(re.fullmatch(r"\d\.\d\d \[\d\.\d\d, \d\.\d\d\]", row[3]) and row[8] == "clean" for row in results)
    curve_rows = tables[("iteration", "sampled_success", "greedy_val_success", "groups_with_outcome_difference",
                         "rounds", "kl_to_start", "reward_mean", "entropy", "collect_s", "update_s")]
    assert [row[0] for row in curve_rows] == [str(s) for s in curve["step"]]
    for body in tables.values():
        assert all(all(cell for cell in row) for row in body), body  # a folded row leaves empty cells

    # prose and rules: one line each, whole
    lines = out.splitlines()
    assert any(line.startswith("held-out greedy success on doors") and line.endswith("success 0.06")
               for line in lines), out
    assert any("5. SFT on the successful demonstrations, a checkpoint every 2 steps, each on val" in line
               for line in lines)
    assert any("tensorboard --logdir" in line and line.endswith("--lake lake view") for line in lines)
