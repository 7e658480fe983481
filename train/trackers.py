"""Experiment trackers: a train config's `report_to` sends every train_steps row, as it is committed, to
TensorBoard and/or Weights & Biases too, under the metric names the peer trainers use (verl, verl-agent,
OpenRLHF: `actor/pg_loss`, `critic/vf_loss`, `response_length/mean`, `env/success_rate`, ...), so their
dashboards carry over. A metric without a peer name goes under `trajlake/<name>`; text metrics (the lineage
query, warnings) stay in the store only.

Where they write: `<checkpoint_dir>/<run_id>/tensorboard` (event files; `tensorboard --logdir` reads them)
and `<checkpoint_dir>/<run_id>/wandb`. W&B runs online when it is logged in (WANDB_API_KEY, or `wandb login`)
and offline otherwise, or as WANDB_MODE says: an offline run is uploaded later with `wandb sync`. A restarted
train run appends to the same TensorBoard folder and resumes the same W&B run (its id is the run id's).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from trajlake.core.errors import TrajlakeError
from trajlake.core.registry import Registry

#: trajlake metric -> the peers' name for it
PEER_NAMES = {
    "pg_loss": "actor/pg_loss", "pg_clipfrac": "actor/pg_clipfrac", "ppo_kl": "actor/ppo_kl",
    "entropy": "actor/entropy", "grad_norm": "actor/grad_norm", "loss": "actor/loss", "nll": "actor/nll",
    "kl": "actor/kl_loss", "kl_coef": "actor/kl_coef", "ratio_mean": "actor/ratio_mean",
    "is_weight_mean": "actor/is_weight_mean",
    "critic_vf_loss": "critic/vf_loss", "critic_vf_clipfrac": "critic/vf_clipfrac",
    "critic_grad_norm": "critic/grad_norm",
    "reward_mean": "critic/score/mean", "reward_std": "critic/score/std",
    "adv_mean": "critic/advantages/mean", "adv_abs_mean": "critic/advantages/abs_mean",
    "success_mean": "env/success_rate", "eval_success": "val/success_rate", "eval_env_reward": "val/env_reward",
    "collect_s": "timing_s/gen", "update_s": "timing_s/update_actor", "elapsed_s": "timing_s/elapsed",
    "rollout_tokens_per_s": "perf/rollout_tokens_per_s", "train_tokens_per_s": "perf/train_tokens_per_s",
    "behaviour_kl": "rollout/behaviour_kl", "replayed": "rollout/replayed", "episodes": "rollout/episodes",
    "agent_tokens": "response_length/sum",
}


def peer_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics of a train_steps row under the peers' names (plus `response_length/mean`, agent
    tokens per episode); NaN/inf and text left out."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[PEER_NAMES.get(k, f"trajlake/{k}")] = float(v)
    if metrics.get("agent_tokens") is not None and metrics.get("episodes"):
        out["response_length/mean"] = float(metrics["agent_tokens"]) / float(metrics["episodes"])
    return out


class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class TensorBoardTracker:
    """Scalars into event files under `folder`."""

    def __init__(self, folder: Path, run_id: str, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k} = {v!r}" for k, v in sorted(config.items())), 0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()  # a dashboard open beside the run sees each step as it lands

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run named and keyed by the train run id, its files under `folder/wandb`."""

    def __init__(self, folder: Path, run_id: str, config: dict[str, Any]):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_logged_in() else "offline")
        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "trajlake"), name=run_id,
                              id=re.sub(r"[^A-Za-z0-9_-]", "-", run_id), resume="allow", dir=str(folder),
                              config=config, mode=mode, settings=wandb.Settings(silent=True, console="off"))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


#: every tracker `report_to` may name
TRACKERS: Registry[Callable[[Path, str, dict[str, Any]], Tracker]] = Registry("tracker")
TRACKERS.add("tensorboard", TensorBoardTracker)
TRACKERS.add("wandb", WandbTracker)


class Trackers:
    """The trackers a run reports to (none: every call does nothing)."""

    def __init__(self, names: tuple[str, ...], folder: Path, run_id: str, config: dict[str, Any]):
        self.trackers: list[Tracker] = []
        for name in names:
            try:
                self.trackers.append(TRACKERS[name](folder, run_id, config))
            except ImportError as e:
                self.close()
                raise TrajlakeError(f"report_to {name}: {e.name or e} is not installed (pip install "
                                    f"'trajlake[trackers]')") from None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.trackers:
            peer = peer_metrics(metrics)
            for t in self.trackers:
                t.log(step, peer)

    def close(self) -> None:
        for t in self.trackers:
            t.close()
        self.trackers = []


__all__ = ["TRACKERS", "Trackers", "peer_metrics", "PEER_NAMES"]
