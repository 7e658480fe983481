"""The process group the trainer runs in, and what its processes exchange.

One process by default: when the process was not started by a launcher (no RANK in the environment),
`init_distributed` sets up a one-process group on a free localhost port, so the same code runs as one
process, as N processes on one machine (`deepspeed --num_gpus N`, or `torchrun --nproc_per_node N`, which
set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) or on many nodes. On CPU (DS_ACCELERATOR=cpu) the backend is
gloo (or oneCCL when installed); on GPUs, NCCL.

Every helper works without a group too (one process: broadcast returns its argument, and so on).
"""

from __future__ import annotations

import atexit
import os
import socket
from typing import Any

import torch

from trajlake.core.quiet import DEEPSPEED_BUILT, dropping_lines


def _accelerator():
    """DeepSpeed's accelerator (CPU or CUDA here). DeepSpeed picks it once, on first use, from DS_ACCELERATOR,
    else by probing the machine; so DS_ACCELERATOR is set (unless given) right before that first use, to
    CUDA when torch sees a GPU and CPU otherwise. It is set here and not when trajlake is imported: importing
    a module should not change the environment of the process (and of every process it starts)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Join (or make, for a lone process) the process group; returns (rank, world size)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = _accelerator().communication_backend_name()
        import deepspeed  # after _accelerator(): importing deepspeed makes it pick its accelerator

        def start() -> None:  # DeepSpeed prints a line to stdout when it builds its shared-memory op: dropped
            with dropping_lines(DEEPSPEED_BUILT):
                deepspeed.init_distributed(dist_backend=backend, verbose=False)

        if "RANK" not in os.environ:  # not started by a launcher: a group of one on a free localhost port
            rendezvous = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
            os.environ.update(LOCAL_RANK="0", LOCAL_SIZE="1", **rendezvous)
            try:
                start()
            finally:  # so that processes this one starts (e.g. a trainer in a test) do not join this group
                for k in rendezvous:
                    os.environ.pop(k, None)
        else:
            start()
        atexit.register(_leave_group)
    return dist.get_rank(), dist.get_world_size()


def _leave_group() -> None:
    """Destroy the process group before the interpreter exits. Left to the interpreter's teardown, gloo's
    threads were sometimes destroyed still running, and the process aborted ("terminate called without an
    active exception", SIGABRT) after its work was done: the launcher then killed the other ranks and the run
    failed (seen with ZeRO-3 on two processes of a busy 2-core machine)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def device() -> torch.device:
    """The device this process computes on."""
    return torch.device(_accelerator().current_device_name())


def is_main() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (pickled)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_mean(values: dict[str, float]) -> dict[str, float]:
    """Average a dict of floats over the ranks (same keys on every rank)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, t.tolist(), strict=True)}
