"""The docs' `shell` blocks (docs/train.md's multi-node ones: a Ray cluster of three nodes, DeepSpeed with two node
ranks): each runs as written, as one script, in a fresh folder beside the repository's configs and in a process
namespace of its own (`unshare --pid`), so that the Ray cluster it starts is its own and its `ray stop` stops that
cluster only, not the Ray of a test beside it (slow tier)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_pages import ROOT, blocks

pytestmark = pytest.mark.slow

SHELL_BLOCKS = [b for b in blocks() if b.kind == "shell"]
#: the command that gives a script its own process namespace (and /proc, which `ray stop` reads)
NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]


def _namespace_problem() -> str | None:
    if shutil.which("unshare") is None:
        return "no `unshare` on this machine (util-linux)"
    r = subprocess.run([*NAMESPACE, "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"`unshare --pid` is not permitted here: {r.stderr.strip()}"


def _env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("TRAJLAKE_LAKE", "RAY_ADDRESS")}
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    return e


def test_the_docs_have_the_multi_node_blocks():
    assert any("ray start --head" in b.body and "RAY_ADDRESS=" in b.body for b in SHELL_BLOCKS), \
        "docs/train.md's local Ray cluster block is gone"
    assert any("--node_rank 1" in b.body and "--node_rank 0" in b.body for b in SHELL_BLOCKS), \
        "docs/train.md's two-node DeepSpeed block is gone"


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: f"{b.page}:{b.body.splitlines()[0][:40]}")
def test_shell_block_runs_as_written_in_a_namespace_of_its_own(block, tmp_path):
    problem = _namespace_problem()
    if problem:
        pytest.skip(problem)
    for folder in ("train", "rewards"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    script = "set -euo pipefail\n" + block.body
    r = subprocess.run([*NAMESPACE, "bash", "-c", script], cwd=tmp_path, env=_env(), capture_output=True,
                       text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{block.page}: the block failed (exit {r.returncode}):\n{out[-4000:]}"
    if "--replicas 3 --workers 3" in block.body:  # the cluster block: every node ran a replica and an env worker
        assert "3 policy replicas on 3 nodes, 3 env workers on 3 nodes" in out, out[-3000:]
        assert "episodes,tasks\n6,6" in out, out[-2000:]  # the sql command's csv: each task played once
    if "--node_rank 1" in block.body:  # the two node ranks took the one step together; rank 0 wrote it
        assert "step,policy_id\n1,two-nodes/step-1" in out, out[-3000:]
        assert out.count("run two-nodes: step 1, policy two-nodes/step-1") == 1, out[-3000:]  # rank 0 only
