"""No poisoned checkpoints: an optimizer step whose loss, gradient norm or updated weights are not finite stops
the run before anything of that step is stored.

A NaN or inf does not fix itself: AdamW carries it into every later step, and a checkpoint of NaN weights
becomes a policy that other runs start from (`lr = inf` once exited 0 and stored a checkpoint whose weights were
all NaN). So every optimizer step is checked (`check_update`, collective: every rank learns that one of them saw
a non-finite value, so none is left waiting in a collective), and the loops turn the `NonFiniteError` into one
line naming the step (`NonFiniteError.stopped`), raised before the checkpoint: the run is marked failed as any
failed run is, with no checkpoint, policy or train_steps row for that step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from trajlake.core.errors import TrajlakeError
from trajlake.train.distributed import all_mean

if TYPE_CHECKING:
    from trajlake.train.config import TrainConfig

#: what is checked, in the order a message names it (the first that is not finite on any rank)
CHECKED = ("loss", "gradient norm", "weights")


class NonFiniteError(TrajlakeError):
    """An optimizer step produced a NaN or inf. `what`: the loss, the gradient norm or the weights (prefixed by
    the model, e.g. `critic loss`); `value`: the value this process saw, when it saw one."""

    def __init__(self, what: str, value: float | None = None, message: str | None = None):
        self.what, self.value = what, value
        super().__init__(message or f"the {what} {self._was} not finite{self._seen}")

    @property
    def _was(self) -> str:
        return "were" if self.what.endswith("weights") else "was"

    @property
    def _seen(self) -> str:
        return f" ({self.value})" if self.value is not None else ""

    def stopped(self, run_id: str, step: str, cfg: TrainConfig) -> NonFiniteError:
        """The error as the run reports it: which run, which step (`iteration 3`, `step 12`), what was not
        finite, that nothing of the step was stored, and what to change."""
        lr = ("critic_lr", cfg.critic.lr) if self.what.startswith("critic") else ("lr", cfg.optim.lr)
        return NonFiniteError(self.what, self.value, (
            f"train run {run_id} stopped at {step}: the {self.what} {self._was} not finite{self._seen}; nothing "
            f"of that step was stored (no checkpoint, no policy) and the run is marked failed: lower {lr[0]} (it "
            f"is {lr[1]:g}) or set grad_clip, and start again under a new --run-id"))


def weights_finite(engine) -> bool:
    """Whether every weight this process holds is finite (under ZeRO-3, its partition of each).

    First one norm over all of them (torch's vectorised reduction, no boolean copy of each tensor): finite
    means every weight is. Only when it is not (a NaN or inf, or squares of weights past 1e19 that overflow)
    is each tensor checked element by element."""
    module = getattr(engine, "module", engine)
    tensors = []
    for p in module.parameters():
        t = getattr(p, "ds_tensor", None)  # ZeRO-3: p itself is an empty placeholder outside a gather
        t = p.data if t is None else t
        if t.numel():
            tensors.append(t)
    if not tensors or math.isfinite(float(torch.nn.utils.get_total_norm(tensors))):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def check_update(engine, *, loss: float, grad_norm: float | None, prefix: str = "") -> None:
    """After an optimizer step of `engine`: raise NonFiniteError when the step's `loss` (this process's share),
    its `grad_norm` (None: not known) or the weights it left are not finite on any process. Collective: every
    process calls it after the same step."""
    local = {"loss": loss, "gradient norm": grad_norm}
    bad = {
        "loss": not math.isfinite(loss),
        "gradient norm": grad_norm is not None and not math.isfinite(grad_norm),
        "weights": not weights_finite(engine),
    }
    anywhere = all_mean({k: float(v) for k, v in bad.items()})  # > 0 where any process saw one
    for what in CHECKED:
        if anywhere[what] > 0:
            value = local.get(what) if bad[what] else None
            raise NonFiniteError(f"{prefix}{what}", value)


__all__ = ["NonFiniteError", "check_update", "weights_finite"]
