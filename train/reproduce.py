"""`trajlake train --replay RUN_ID --step N`: recompute step N of a GRPO/PPO run from the store and check it.

A step is determined by what the store and the checkpoints keep: the policy it started from (checkpoint
N-1 with its DeepSpeed optimizer and trainer state; for step 1 the run's start policy and a fresh optimizer),
the episodes it trained on (its train_steps row's `episodes_where`, read at its `snapshot_read`, with the
token rewards of its `spec_id`), and the run's stored config and seed. The replay rebuilds the engines from
them, runs the step's update (the loop's own `iteration_update`) and compares the actor's weights with
checkpoint N: bit for bit where the torch version, intra-op thread count and world size are those the step
ran with (its trainer_state.json records them); elsewhere it reports the largest difference.

Nothing is written: not to the lake, not to the checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake, runs
from trajlake.train.algos import ALGOS, SFT_LOOP, make_kl_controller
from trajlake.train.batch import load_episodes
from trajlake.train.checkpoint import DS_DIR, STATE_FILE, load_state, machine_state, resolve_model
from trajlake.train.config import config_from_stored
from trajlake.train.engine import build_engines
from trajlake.train.steps import iteration_update

STEP_SQL = """
SELECT s.step, s.policy_id, s.snapshot_read, s.metrics, s.spec_id, s.episode_ids, p.checkpoint_uri FROM train_steps s
LEFT JOIN policies p USING (policy_id) WHERE s.run_id = ? AND s.step IN (?, ?)
"""


class ReplayError(TrajlakeError):
    """A step that cannot be recomputed from what is stored (the message says what is missing)."""


@dataclass(frozen=True)
class StepReplay:
    """How a recomputed step compares with its stored checkpoint."""

    run_id: str
    step: int
    checkpoint: str
    episodes: int
    snapshot: int
    spec_id: str
    tensors: int
    differing: int
    max_abs_diff: float
    worst: str | None  # the tensor with the largest difference
    machine: dict[str, Any] = field(default_factory=dict)  # what this replay ran with
    recorded: dict[str, Any] = field(default_factory=dict)  # what the step ran with (empty: not recorded)

    @property
    def bit_exact(self) -> bool:
        return self.differing == 0

    def describe(self) -> str:
        what = (f"step {self.step} of run {self.run_id} recomputed from {self.episodes} episodes at snapshot "
                f"{self.snapshot} under spec {self.spec_id}")
        if self.bit_exact:
            return f"{what}: all {self.tensors} tensors equal checkpoint {self.checkpoint} bit for bit"
        text = (f"{what}: {self.differing} of {self.tensors} tensors differ from checkpoint {self.checkpoint}, "
                f"max |difference| {self.max_abs_diff:.3g} (in {self.worst})")
        changed = {k: (self.recorded[k], v) for k, v in self.machine.items()
                   if k in self.recorded and self.recorded[k] != v}
        if changed:
            text += ("; the step ran with " + ", ".join(f"{k} {a}" for k, (a, _) in changed.items()) + ", this replay "
                     "with " + ", ".join(f"{k} {b}" for k, (_, b) in changed.items())
                     + ": bit-equality holds only with the same (e.g. torch.set_num_threads / OMP_NUM_THREADS)")
        elif self.recorded:
            text += "; with the same torch, thread count and world size: the checkpoint was changed or a kernel is " \
                    "not deterministic"
        return text


def _stored_config(lake: Lake, run_id: str):
    run = runs.stored(lake, run_id)
    if run is None:
        raise ReplayError(f"no run {run_id!r} in the lake (trajlake sql 'SELECT run_id, kind FROM runs')")
    if run.kind != "train":
        raise ReplayError(f"run {run_id} is a {run.kind} run: --replay recomputes a step of a train run")
    stored = run.config
    # run_id left out: a replay writes nothing under it, and a run from before run ids were checked (`a/b`)
    # still replays
    cfg = config_from_stored(stored, f"run {run_id}'s stored config", run_id=None, progress=False)
    if ALGOS[cfg.run.algo].loop == SFT_LOOP:
        raise ReplayError(f"run {run_id} is an {cfg.run.algo} run: --replay recomputes RL iterations (an SFT step "
                          "is a mini-batch of its sft_filter; its checkpoints are every checkpoint_every steps)")
    return cfg, stored


def _start_path(lake: Lake, stored: dict[str, Any], run_id: str) -> str:
    pid = stored.get("start_policy")
    if not pid:
        raise ReplayError(f"run {run_id}'s stored config names no start_policy (a run from an older trajlake)")
    path, *_ = resolve_model(lake, pid if pid.startswith("hf:") else f"policy:{pid}")
    return path


def _rows(lake: Lake, run_id: str, step: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The train_steps rows of steps `step - 1` (None for step 1, whose start is the run's) and `step`."""
    rows = {r["step"]: r for r in lake.query(STEP_SQL, [run_id, step - 1, step]).to_dicts()}
    done = lake.query("SELECT max(step) AS n FROM train_steps WHERE run_id = ? AND policy_id IS NOT NULL",
                      [run_id]).item()
    this = rows.get(step)
    if this is None or not this["policy_id"]:
        raise ReplayError(f"run {run_id} has no checkpointed step {step} (its steps: 1 to {done or 0})")
    for r in rows.values():
        m = r["metrics"]
        r["metrics"] = json.loads(m) if isinstance(m, str) else (m or {})
    if not this["metrics"].get("episodes_where") or not this["spec_id"] or this["episode_ids"] is None:
        raise ReplayError(f"step {step} of run {run_id} records no lineage (its episodes_where, spec_id and "
                          "episode_ids: steps trained by an older trajlake lack them), so its episodes are unknown")
    return (rows.get(step - 1) if step > 1 else None), this


def _checkpoint(row: dict[str, Any], run_id: str, *, optimizer: bool) -> Path:
    uri = row["checkpoint_uri"]
    path = Path(uri) if uri else None
    if path is None or not (path / "config.json").is_file():
        raise ReplayError(f"the checkpoint of step {row['step']} of run {run_id} is not on disk ({uri})")
    if optimizer and not (path / DS_DIR / "actor").is_dir():
        raise ReplayError(f"checkpoint {path} holds no optimizer state (the run had save_optimizer = false), so "
                          f"step {row['step'] + 1} cannot be recomputed exactly; step 1 can, from the start policy")
    return path


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    if not out:
        raise ReplayError(f"checkpoint {path} holds no safetensors weights")
    return out


def compare(actor, stored: dict[str, torch.Tensor]) -> tuple[int, float, str | None]:
    """(tensors that differ, the largest absolute difference, the tensor holding it) between the actor
    engine's weights (gathered under ZeRO-3) and a checkpoint's."""
    sd = actor._zero3_consolidated_16bit_state_dict() if actor.zero_optimization_stage() == 3 \
        else actor.module.state_dict()
    differing, worst, worst_name = 0, 0.0, None
    for name, want in stored.items():
        if name not in sd:
            raise ReplayError(f"the checkpoint holds a tensor {name} the model does not")
        got = sd[name].detach().cpu()
        if got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want):
            continue
        differing += 1
        d = float((got.double() - want.double()).abs().max()) if got.shape == want.shape else float("inf")
        if d >= worst:
            worst, worst_name = d, name
    return differing, worst, worst_name


def replay_step(lake: Lake, run_id: str, step: int) -> StepReplay:
    """Recompute step `step` (from 1) of train run `run_id` and compare it with its checkpoint; writes nothing."""
    if step < 1:
        raise ReplayError(f"--step must be 1 or more (step {step} is no update), got {step}")
    cfg, stored = _stored_config(lake, run_id)
    prev, this = _rows(lake, run_id, step)
    start = _start_path(lake, stored, run_id)
    prev_path = _checkpoint(prev, run_id, optimizer=True) if prev is not None else None
    if step > 1 and prev is None:
        raise ReplayError(f"run {run_id} has no checkpointed step {step - 1} to start step {step} from")
    target = _checkpoint(this, run_id, optimizer=False)
    where, spec_id, snap = this["metrics"]["episodes_where"], this["spec_id"], this["snapshot_read"]
    try:
        seqs = load_episodes(lake, where, snapshot=snap, spec_id=spec_id)
    except TrajlakeError as e:
        raise ReplayError(f"step {step} of run {run_id}: its episodes cannot be read at snapshot {snap} as they "
                          f"were: {e}") from None
    if [s.episode_id for s in seqs] != list(this["episode_ids"]):
        raise ReplayError(f"step {step} of run {run_id} trained on {len(this['episode_ids'])} episodes; its "
                          f"episodes_where reads {len(seqs)} others or in another order at snapshot {snap} now")
    algo = ALGOS[cfg.run.algo]
    engines = build_engines(cfg, str(prev_path or start), critic=algo.needs_critic, ref=algo.needs_reference(cfg),
                              ref_path=start, critic_path=start)
    state = load_state(engines, prev_path) if prev_path is not None else {}
    kl_ctl = make_kl_controller(cfg.kl.controller, cfg.kl.coef, cfg.kl.target, cfg.kl.horizon)
    if "kl_controller" in state:
        kl_ctl.load_state_dict(state["kl_controller"])
    iteration_update(engines, seqs, cfg, kl_ctl, step - 1)
    stored_weights = _weights(target)
    differing, worst, name = compare(engines.actor, stored_weights)
    recorded_file = target / STATE_FILE
    recorded = json.loads(recorded_file.read_text()) if recorded_file.is_file() else {}
    machine = machine_state(engines.world)
    return StepReplay(run_id, step, str(target), len(seqs), snap, spec_id, len(stored_weights), differing, worst,
                      name, machine, {k: recorded[k] for k in machine if k in recorded})


__all__ = ["replay_step", "StepReplay", "ReplayError", "compare"]
