"""Several processes: ZeRO-2 and ZeRO-3 on two processes of one node, and on two node ranks launched apart as on
two machines (DeepSpeed's launcher, `--no_ssh`, the master on the loopback), take the same step as one process on
the same batch; and the whole loop runs under DeepSpeed's launcher with the lake on rank 0 only (slow: each process
starts torch, DeepSpeed and a process group)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_model_dir, varied_spec
from trajlake.collect.envs.agentgym_launch import free_port

ROOT = Path(__file__).resolve().parents[1]
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")
pytestmark = pytest.mark.slow

STEP = """
import json, os, sys
import torch
from tests.helpers import flat_params, small_cfg, synthetic
from trajlake.train import distributed as D
from trajlake.train import engine as E
from trajlake.train.algos import make_kl_controller
from trajlake.train.batch import collate
from trajlake.train.steps import prepare, rl_update

model, out, stage = os.environ["T_MODEL"], os.environ["T_OUT"], int(os.environ["T_STAGE"])
cfg = small_cfg(model, zero_stage=stage, minibatch_size=8, micro_batch=2, lr=1e-3, epochs=2, entropy_coef=0.01)
eng = E.build_engines(cfg, model)
kl = make_kl_controller("fixed", 0.0)
batch = collate(synthetic(16, group_size=4, scores=[0, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0]), eng.pad_id)
prep, _ = prepare(eng, batch, cfg, kl)
m = rl_update(eng, prep, cfg, kl, seed=0)
if stage == 3:
    sd = eng.actor._zero3_consolidated_16bit_state_dict()
    params = torch.cat([v.float().reshape(-1) for k, v in sorted(sd.items())]) if D.is_main() else None
else:
    params = torch.cat([v.float().reshape(-1) for k, v in sorted(eng.actor.module.state_dict().items())])
if D.is_main():
    torch.save({"metrics": m, "world": eng.world, "params": params, "old": prep.old_logprobs,
                "nodes": int(os.environ.get("CROSS_SIZE", "1"))}, out)
# every rank leaves together, as the train loop's iterations end: a rank that tore its group down while the
# other still saved aborted now and then on a loaded machine ("terminate called without an active exception")
D.barrier()
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["DS_ACCELERATOR"] = "cpu" if not torch.cuda.is_available() else env.get("DS_ACCELERATOR", "cuda")
    env.update(extra)
    return env


def _deepspeed() -> str | None:
    return shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or shutil.which("deepspeed")


def _launch(how: str, script: Path, env: dict, tmp_path: Path) -> None:
    """Run `script` as one process, as two processes of one node (torchrun), or as two node ranks, each launched
    on its own as on two machines (`deepspeed --no_ssh --node_rank R` with the same hostfile and master)."""
    if how == "one":
        cmds = [[sys.executable, str(script)]]
    elif how == "two processes":  # torchrun sets RANK/WORLD_SIZE/MASTER_* per process; works with DS_ACCELERATOR=cpu
        cmds = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]]
    else:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
        port = str(free_port())
        cmds = [[_deepspeed(), "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(rank), "--master_addr",
                 "127.0.0.1", "--master_port", port, str(script)] for rank in (0, 1)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in cmds]
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-5000:]


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_two_processes_and_two_nodes_match_one(stage, tmp_path_factory, tmp_path):
    if _deepspeed() is None:
        pytest.skip("the deepspeed launcher is not installed")
    model = tiny_model_dir(tmp_path_factory)
    script = tmp_path / "step.py"
    script.write_text(STEP)
    got = {}
    for how in ("one", "two processes", "two nodes"):
        out = tmp_path / f"{how.replace(' ', '-')}.pt"
        _launch(how, script, _env(T_MODEL=str(model), T_OUT=str(out), T_STAGE=str(stage)), tmp_path)
        got[how] = torch.load(out, weights_only=True)  # the test's own tensors and numbers
    one = got["one"]
    assert one["world"] == 1 and got["two processes"]["world"] == 2 and got["two nodes"]["world"] == 2
    assert got["two nodes"]["nodes"] == 2, "the launcher saw two node ranks"
    for how in ("two processes", "two nodes"):
        two = got[how]
        for k in ("loss", "pg_loss", "grad_norm", "entropy", "pg_clipfrac", "ppo_kl"):
            assert two["metrics"][k] == pytest.approx(one["metrics"][k], rel=1e-4, abs=1e-6), (how, k)
        assert torch.allclose(one["old"], two["old"], atol=1e-5), how  # old log-probs, computed in shares
        assert torch.allclose(one["params"], two["params"], atol=1e-4), how  # Adam amplifies tiny rounding


def test_the_loop_under_the_deepspeed_launcher(tmp_path_factory, tmp_path):
    launcher = _deepspeed()
    if launcher is None:
        pytest.skip("the deepspeed launcher is not installed")
    model = tiny_model_dir(tmp_path_factory)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text("\n".join([
        'algo = "grpo"', f'model = "{model}"', 'run_id = "two"', "difficulty = 1", "tasks = 2", "samples = 2",
        "iterations = 2", "max_turns = 1", 'template = "action"', "max_new_tokens = 8", "zero_stage = 2",
        "minibatch_size = 4", "micro_batch = 2", f'checkpoint_dir = "{tmp_path / "ckpt"}"', "eval_every = 2",
        "eval_tasks = 2", "progress = false", f'reward_spec = "{varied_spec(tmp_path)}"']))
    lake = tmp_path / "lake"
    p = subprocess.run([launcher, "--num_gpus", "2", "--module", "trajlake.train", "--config", str(cfg),
                        "--lake", str(lake)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("run two: step 2, policy two/step-2") == 1  # printed by rank 0 only
    from trajlake.store import Lake

    with Lake.open(str(lake)) as lk:
        steps = lk.query("SELECT step, policy_id, metrics FROM train_steps WHERE run_id = 'two' ORDER BY step")
        assert steps["step"].to_list() == [0, 1, 2] and steps["policy_id"][2] == "two/step-2"
        assert "eval_success" in json.loads(steps["metrics"][2])
        assert lk.query("SELECT count(*) FROM episodes WHERE run_id LIKE 'two/it-%'")[0, 0] == 8
        before = (lk.snapshots().to_dicts(), lk.count("runs"), lk.count("train_steps"))
    # a refused restart (other settings) is refused on rank 0, which alone reads the lake, and raised on every
    # rank: the other one is not left waiting in a broadcast, and nothing is written
    cfg.write_text(cfg.read_text() + "\nlr = 0.5\n")
    p = subprocess.run([launcher, "--num_gpus", "2", "--module", "trajlake.train", "--config", str(cfg),
                        "--lake", str(lake)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0
    refusal = "error: run two already exists with lr 1e-06; given 0.5 (use a new --run-id)"
    assert (p.stdout + p.stderr).count(refusal) == 2, p.stdout[-3000:] + p.stderr[-3000:]  # one line per rank
    with Lake.open(str(lake)) as lk:
        assert (lk.snapshots().to_dicts(), lk.count("runs"), lk.count("train_steps")) == before


def test_the_process_group_is_destroyed_before_the_interpreter_exits(tmp_path):
    # an exit handler registered before the group exists runs after the trainer's own (atexit is last in, first
    # out): it sees the group gone, so gloo's threads are not left to the interpreter's teardown to destroy
    script = tmp_path / "leave.py"
    script.write_text("\n".join([
        "import atexit, torch.distributed as dist",
        "from trajlake.train.distributed import init_distributed",
        "atexit.register(lambda: print('group at exit:', dist.is_initialized(), flush=True))",
        "print('ranks:', init_distributed(), 'group:', dist.is_initialized(), flush=True)",
    ]))
    p = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ranks: (0, 1) group: True" in p.stdout and "group at exit: False" in p.stdout, p.stdout
