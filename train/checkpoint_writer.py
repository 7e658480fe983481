"""DeepSpeed's checkpoint files written on a background thread, so that the disk writes the optimizer state while
the next iteration's rollouts play.

An RL iteration's checkpoint holds the optimizer state (Adam's two moments: 1.07 GB for SmolLM2-135M), and its
save is bound by the disk, not the CPU (bench/README.md: 2.2-4.4 s a step at 345 MB/s). DeepSpeed hands every file
of a save to its checkpoint engine (`engine.checkpoint_engine.save(state_dict, path)`); `BackgroundWriter`'s
engine queues each write on one thread instead, as `<file stem>.partial` renamed to `<file>` when whole, and the
checkpoint's `trainer_state.json` after them (the same queue, so it is written last: a checkpoint is complete
when that file is there, `checkpoint.is_complete`). Nothing writes the state while it is queued: the RL loop
calls `wait()` before its next update changes it (rollouts and evaluations read the weights, not the optimizer),
and before the run ends. A write that failed raises there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

#: the suffix of a file being written; renamed away once it is whole
PARTIAL = ".partial"


class BackgroundWriter:
    """One thread that writes, in order, what `submit` gives it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: list[Future] = []

    def submit(self, write: Callable[[], Any]) -> None:
        self._pending.append(self._pool.submit(write))

    def engine(self, zipfile_serialization: bool) -> TorchCheckpointEngine:
        """A DeepSpeed checkpoint engine whose file writes go to this writer."""
        return _QueuedEngine(self, zipfile_serialization)

    def wait(self) -> None:
        """Block until every queued write is on disk; the first that failed is raised."""
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


def write_whole(path: str | os.PathLike, write: Callable[[str], Any]) -> None:
    """`write(partial)` to `path` with its suffix replaced by `.partial`, then rename it to `path`: a file at `path`
    is always whole. The suffix is replaced, not appended to, because torch.save names its archive's records after
    the file's name less its suffix: so a state file written this way holds the same bytes as one saved in place."""
    partial = str(Path(path).with_suffix(PARTIAL))
    write(partial)
    os.replace(partial, path)


class _QueuedEngine(TorchCheckpointEngine):
    """TorchCheckpointEngine with each `save` queued on a BackgroundWriter (the same file format)."""

    def __init__(self, writer: BackgroundWriter, zipfile_serialization: bool) -> None:
        super().__init__(None)
        self.zipfile_serialization = zipfile_serialization
        self._writer = writer

    def save(self, state_dict, path: str) -> None:
        zipfile = self.zipfile_serialization
        self._writer.submit(lambda: write_whole(path, lambda p: torch.save(
            state_dict, p, _use_new_zipfile_serialization=zipfile)))


__all__ = ["BackgroundWriter", "PARTIAL", "write_whole"]
