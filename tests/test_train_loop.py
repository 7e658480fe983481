"""The training loops over a real store: a GRPO/PPO iteration end to end, SFT from a store query, checkpoints
as policies that collect can load, and resuming a run killed mid-way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers import SYSTEM, small_cfg, tiny_model_dir, varied_spec
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.store import Lake
from trajlake.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
#: what a launcher sets; a trainer started from a test must not see this process's
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture
def lake(tmp_path):
    lk = Lake.open(str(tmp_path / "lake"))
    yield lk
    lk.close()


def _steps(lake, run_id):
    rows = lake.query("SELECT step, policy_id, snapshot_read, metrics FROM train_steps WHERE run_id = ? "
                      "ORDER BY step", [run_id]).to_dicts()
    for r in rows:
        r["metrics"] = json.loads(r["metrics"]) if isinstance(r["metrics"], str) else r["metrics"]
    return rows


def test_grpo_iteration_end_to_end(model, lake, tmp_path):
    cfg = small_cfg(model, run_id="g1", tasks=2, samples=2, iterations=1, eval_every=1, eval_tasks=2,
                    minibatch_size=4, micro_batch=2, reward_spec=varied_spec(tmp_path))
    res = train(cfg, lake)
    assert res.policy_id == "g1/step-1" and res.step == 1
    steps = _steps(lake, "g1")
    assert [s["step"] for s in steps] == [0, 1]
    assert steps[0]["policy_id"] is None and "eval_success" in steps[0]["metrics"]
    s1 = steps[1]
    assert s1["policy_id"] == "g1/step-1" and s1["snapshot_read"] is not None
    for k in ("pg_loss", "entropy", "pg_clipfrac", "grad_norm", "kl_coef", "reward_mean", "success_mean",
              "train_tokens_per_s", "eval_success", "episodes"):
        assert k in s1["metrics"], k
    assert s1["metrics"]["episodes"] == 4
    # the batch was read at the recorded snapshot: the iteration's episodes are all there
    n = lake.query("SELECT count(*) AS n FROM episodes WHERE run_id = 'g1/it-1'", snapshot=s1["snapshot_read"])
    assert n["n"][0] == 4
    pol = lake.query("SELECT * FROM policies WHERE policy_id = 'g1/step-1'").to_dicts()[0]
    assert pol["parent_policy_id"] == f"hf:{Path(model).absolute()}" and pol["step"] == 1
    assert pol["base_model"] == str(Path(model).absolute()) and pol["run_id"] == "g1"
    ckpt = Path(pol["checkpoint_uri"])
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "tokenizer.json").is_file()
    assert lake.query("SELECT status FROM runs WHERE run_id = 'g1'")["status"][0] == "finished"
    # the checkpoint holds the trained weights, not the starting ones
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(ckpt).state_dict()
    b = AutoModelForCausalLM.from_pretrained(model).state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)
    # collect loads the checkpoint as policy:ID
    rid = collect(CollectConfig(env="doors", policy="policy:g1/step-1", tasks=2, difficulty=1, max_turns=1,
                                template="action", system_prompt=SYSTEM, max_new_tokens=8, progress=False), lake)
    got = lake.query("SELECT DISTINCT policy_id FROM episodes WHERE run_id = ?", [rid])["policy_id"].to_list()
    assert got == ["g1/step-1"]


@pytest.mark.slow  # over 8 s on 2 cores; PPO's step is tested fast in test_train_steps
def test_ppo_iteration(model, lake):
    cfg = small_cfg(model, algo="ppo", run_id="p1", tasks=2, samples=1, iterations=1, minibatch_size=2,
                    micro_batch=2, kl_coef=0.05, kl_mode="reward", critic_lr=1e-3, save_optimizer=True)
    res = train(cfg, lake)
    m = _steps(lake, "p1")[-1]["metrics"]
    assert res.step == 1 and "critic_vf_loss" in m and "kl" in m
    ckpt = Path(lake.query("SELECT checkpoint_uri FROM policies WHERE policy_id = 'p1/step-1'")[0, 0])
    assert (ckpt / "deepspeed" / "critic").is_dir() and (ckpt / "deepspeed" / "actor").is_dir()


def test_sft_from_store_query(model, lake):
    collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=8, difficulty=1,
                          template="action", system_prompt=SYSTEM, run_id="expert", progress=False), lake)
    cfg = small_cfg(model, algo="sft", run_id="s1", sft_filter="success AND policy_id LIKE 'scripted:%'",
                    sft_steps=4, log_every=1, checkpoint_every=2, lr=3e-3, minibatch_size=4, micro_batch=2)
    res = train(cfg, lake)
    assert res.policy_id == "s1/step-4" and len(res.history) == 4
    assert res.history[-1]["nll"] < res.history[0]["nll"]
    steps = _steps(lake, "s1")
    assert [(s["step"], s["policy_id"]) for s in steps] == [(1, None), (2, "s1/step-2"), (3, None),
                                                             (4, "s1/step-4")]
    assert {s["snapshot_read"] for s in steps} == {steps[0]["snapshot_read"]}
    # lineage: each row lists its step's mini-batch (minibatch_size 4 of the 8 expert episodes)
    rows = lake.query("SELECT episode_ids FROM train_steps WHERE run_id = 's1' ORDER BY step")["episode_ids"]
    expert = set(lake.query("SELECT episode_id FROM episodes WHERE run_id = 'expert'")["episode_id"])
    assert [len(r) for r in rows] == [4, 4, 4, 4] and set().union(*rows) == expert
    parent = lake.query("SELECT parent_policy_id FROM policies WHERE policy_id = 's1/step-4'")[0, 0]
    assert parent == "s1/step-2"
    with pytest.raises(Exception, match="no episodes match"):
        train(cfg.replace(run_id="s2", sft_filter="false"), lake)


KILLER = """
import os, signal, sys
from trajlake.store import Lake
from trajlake.train import loop, train_run
from tests.helpers import small_cfg
real = train_run.commit_step  # the train_steps commit, as the run calls it
def commit(lake, **kw):
    if kw["step"] == 2:  # after iteration 2 collected, trained and saved its checkpoint, before recording it
        os.kill(os.getpid(), signal.SIGKILL)
    return real(lake, **kw)
train_run.commit_step = commit
cfg = small_cfg(sys.argv[1], **{CFG})
loop.train(cfg, Lake.open(sys.argv[2]))
"""


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_resume_after_a_kill(model, tmp_path):
    kw = dict(run_id="r1", tasks=2, samples=2, iterations=3, minibatch_size=4, micro_batch=2, save_optimizer=True,
              checkpoint_dir=str(tmp_path / "ckpt"), reward_spec=varied_spec(tmp_path))
    script = tmp_path / "killer.py"
    script.write_text(textwrap.dedent(KILLER).replace("{CFG}", repr(kw)))
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, str(script), str(model), str(tmp_path / "lake")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == -9, p.stderr[-3000:]
    with Lake.open(str(tmp_path / "lake")) as lake:
        assert [s["step"] for s in _steps(lake, "r1")] == [1]
        assert lake.query("SELECT status FROM runs WHERE run_id = 'r1'")[0, 0] == "running"
        res = train(small_cfg(model, **kw), lake)
        assert res.step == 3 and [h["iteration"] for h in res.history] == [2, 3]
        steps = _steps(lake, "r1")
        assert [s["step"] for s in steps] == [1, 2, 3]
        parents = dict(lake.query("SELECT policy_id, parent_policy_id FROM policies WHERE run_id = 'r1'").iter_rows())
        assert parents["r1/step-2"] == "r1/step-1" and parents["r1/step-3"] == "r1/step-2"
        counts = dict(lake.query("SELECT run_id, count(*) FROM episodes WHERE run_id LIKE 'r1/it-%' "
                                 "GROUP BY run_id").iter_rows())
        assert counts == {"r1/it-1": 4, "r1/it-2": 4, "r1/it-3": 4}  # the cut iteration was not replayed twice
        assert lake.query("SELECT status FROM runs WHERE run_id = 'r1'")[0, 0] == "finished"


def test_module_entry_point(model, tmp_path, capsys):
    """`python -m trajlake.train --config PATH [--algo sft]`: what the CLI and the launchers run."""
    from trajlake.train.__main__ import main

    lake_uri = str(tmp_path / "lake")
    with Lake.open(lake_uri) as lk:
        collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=4, difficulty=1,
                              template="action", run_id="expert", progress=False), lk)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'model = "{model}"\nalgo = "grpo"\nsft_steps = 2\nminibatch_size = 4\nmicro_batch = 4\n'
                   f'progress = false\ncheckpoint_dir = "{tmp_path / "ckpt"}"\n')
    assert main(["--config", str(cfg), "--algo", "sft", "--run-id", "cli-sft", "--lake", lake_uri]) == 0
    assert "run cli-sft: step 2, policy cli-sft/step-2" in capsys.readouterr().out
    cfg.write_text(f'model = "{model}"\nlearning_rate = 1\n')
    assert main(["--config", str(cfg), "--lake", lake_uri]) == 1
    assert "learning_rate" in capsys.readouterr().err


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_iterations_rotate_through_the_split_and_run_names_a_checkpoint(model, lake):
    cfg = small_cfg(model, run_id="rot", tasks=2, samples=2, iterations=2, minibatch_size=4, micro_batch=4)
    train(cfg, lake)
    tasks = {rid: set(lake.query("SELECT DISTINCT task_id FROM episodes WHERE run_id = ?", [rid])["task_id"])
             for rid in ("rot/it-1", "rot/it-2")}
    assert len(tasks["rot/it-1"]) == 2 and not tasks["rot/it-1"] & tasks["rot/it-2"]  # new tasks each iteration
    kinds = lake.query("SELECT DISTINCT kind, parent_run_id FROM runs WHERE run_id LIKE 'rot/%'").rows()
    assert kinds == [("collect", "rot")]
    # model = run:ID starts from that run's last checkpoint, recorded as the new run's parent
    res = train(small_cfg("run:rot", run_id="next", tasks=2, samples=2, iterations=1, minibatch_size=4,
                          micro_batch=4, rotate_tasks=False), lake)
    parent = lake.query("SELECT parent_policy_id FROM policies WHERE policy_id = ?", [res.policy_id])[0, 0]
    assert parent == "rot/step-2"
    first = set(lake.query("SELECT DISTINCT task_id FROM episodes WHERE run_id = 'next/it-1'")["task_id"])
    assert first == tasks["rot/it-1"]  # rotate_tasks = False plays the first tasks of the split
    with pytest.raises(Exception, match="train run 'nope' has no checkpoint"):
        train(small_cfg("run:nope", run_id="x"), lake)


def test_an_iteration_whose_rollouts_all_hit_env_errors_fails_and_a_restart_retries_them(model, lake, flaky_env):
    from trajlake.core.errors import TrajlakeError

    cfg = small_cfg(model, env="test-flaky", run_id="tf", tasks=2, samples=2, iterations=1, minibatch_size=4,
                    micro_batch=4, eval_every=0)
    flaky_env.down = True
    with pytest.raises(TrajlakeError, match=r"^train run tf: collect run tf/it-1 failed: all 4 episodes ended with "
                                            r"an env error .*; re-run the train run \(--run-id tf\) once the env"):
        train(cfg, lake)
    status = dict(lake.query("SELECT run_id, status FROM runs").iter_rows())
    assert status == {"tf": "failed", "tf/it-1": "failed"}
    flaky_env.down = False
    res = train(cfg, lake)  # the same run again: iteration 1 re-collects, retrying the 4 errored episodes
    assert res.step == 1 and res.history[-1]["episodes"] == 4  # the batch holds the replays, not the errors
    counts = dict(lake.query("SELECT status = 'error', count(*) FROM episodes GROUP BY ALL").iter_rows())
    assert counts == {True: 4, False: 4}
    assert dict(lake.query("SELECT run_id, status FROM runs").iter_rows()) == {"tf": "finished", "tf/it-1": "finished"}


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_iterations_without_a_learning_signal_say_so_and_warn(model, lake, tmp_path, capsys, monkeypatch):
    """A reward that is the same for every episode gives every advantage 0: nothing is trained, and the run says
    so in each iteration's metrics and, from NO_SIGNAL_WARN in a row (3; 2 here, to keep the test short), warns
    with the likely cause."""
    import trajlake.train.progress

    monkeypatch.setattr(trajlake.train.progress, "NO_SIGNAL_WARN", 2)
    flat = tmp_path / "flat.toml"
    flat.write_text('name = "flat"\n[[components]]\nkind = "sql"\nexpr = "0.5"\n')
    cfg = small_cfg(model, run_id="flat", tasks=2, samples=2, iterations=2, minibatch_size=4, micro_batch=2,
                    reward_spec=str(flat))
    train(cfg, lake)
    metrics = [s["metrics"] for s in _steps(lake, "flat")]
    assert [m["signal_rows"] for m in metrics] == [0.0, 0.0]
    assert [m["no_signal_streak"] for m in metrics] == [1, 2]
    assert [m["outcome_groups"] for m in metrics] == [0.0, 0.0]
    assert "warning" not in metrics[0] and "2 iterations in a row without an outcome signal" in metrics[1]["warning"]
    assert "0 of 2 groups had samples that differ in success; nothing trained" in metrics[1]["warning"]
    err = capsys.readouterr().err
    assert "warning: train flat: 2 iterations in a row without an outcome signal" in err
    # the same rows, readable while a run holds a DuckDB-file lake: <checkpoint_dir>/<run>/metrics.jsonl
    logged = [json.loads(line) for line in (Path("ckpt") / "flat" / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["policy_id"]) for row in logged] == [(1, "flat/step-1"), (2, "flat/step-2")]
    assert [row["metrics"] for row in logged] == metrics
    assert any(cause in err for cause in ("no episode succeeded", "every episode succeeded", "all won or all lost"))


def test_no_signal_causes():
    from trajlake.train.progress import no_signal_cause

    assert "warm-start" in no_signal_cause({"success_mean": 0.0}, 1.0)
    assert "harder tasks" in no_signal_cause({"success_mean": 1.0}, 1.0)
    assert "or the temperature (now 0.3)" in no_signal_cause({"success_mean": 0.5}, 0.3)
    assert "task_selector learnable" in no_signal_cause({"success_mean": 0.0}, 1.0)
