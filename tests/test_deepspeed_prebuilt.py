"""DeepSpeed's CPU backend loads its shared-memory comm op in every process group, a one-process one too; `make
setup` builds it into the install, so a first train starts its first step without compiling (issue 37: the first
train on a fresh install compiled a C++ extension with ninja before it began)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_process_group_loads_the_prebuilt_comm_op_and_compiles_nothing(tmp_path):
    """In a fresh process with an empty extensions folder, DeepSpeed's comm backend finds the op the install
    holds: nothing lands in the folder torch would JIT-build into."""
    ext = tmp_path / "torch_extensions"
    code = ("from deepspeed.comm.torch import build_shm_op\n"
            "op = build_shm_op()\n"
            "print(op.__file__ if op is not None else 'none')\n")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(ext)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    where = out.stdout.strip().splitlines()[-1]
    assert where.endswith(".so") and "site-packages" in where, (
        f"DeepSpeed's shm comm op is not in the install ({where}): run `make setup`, which builds it")
    assert not ext.exists() or not any(ext.iterdir()), f"something was compiled: {sorted(ext.rglob('*'))[:5]}"
