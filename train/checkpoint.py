"""Checkpoints as policy versions in the store, and resuming a run from its last one.

A checkpoint is a folder `<checkpoint_dir>/<run_id>/step-<n>` (the run id as one safe file name:
`checkpoint_path`) holding the actor as safetensors and its
tokenizer (save_pretrained; under ZeRO-3 the partitioned weights are gathered on rank 0 first), so
`collect --policy policy:ID` and `hf:PATH` load it as any model; with `save_optimizer`, also the DeepSpeed
state of the actor (without its weights, which the safetensors hold) and the critic (`deepspeed/`) and the
trainer's own state (`trainer_state.json`).

Each checkpoint becomes, in one snapshot, a row in `policies` (policy_id `<run_id>/step-<n>`, parent the
policy it was trained from) and a row in `train_steps` (run_id, step, policy_id, snapshot_read, metrics).
A run restarted with the same run id continues from its last train_steps row that names a policy.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import path_component
from trajlake.schemas import Policy as PolicyRow
from trajlake.schemas import TrainStep
from trajlake.store import Lake
from trajlake.train.checkpoint_writer import BackgroundWriter, write_whole
from trajlake.train.distributed import barrier, is_main
from trajlake.train.engine import Engines

STATE_FILE = "trainer_state.json"
DS_DIR = "deepspeed"




def policy_id_for(run_id: str, step: int) -> str:
    return f"{run_id}/step-{step}"


def checkpoint_path(checkpoint_dir: str | Path, run_id: str, step: int) -> Path:
    """`<checkpoint_dir>/<run folder>/step-<step>`, absolute. The run id becomes one file name (ids.path_component:
    no separator, `..` or control character survives), and the resolved path is checked to lie inside the
    resolved checkpoint_dir: a run id can come from a lake (`run:ID`, a stored config), which is data, not
    something this process chose (`../../outside/escaped` wrote checkpoints outside the folder)."""
    root = Path(checkpoint_dir).absolute()
    path = root / path_component(run_id) / f"step-{int(step)}"
    if not path.resolve().is_relative_to(root.resolve()):  # e.g. a symlinked run folder pointing elsewhere
        raise TrajlakeError(f"run {run_id!r}: its checkpoint folder {path} resolves to {path.resolve()}, outside "
                            f"checkpoint_dir {root.resolve()}; remove that link or use another checkpoint_dir")
    return path


def save(engines: Engines, path: Path, *, state: dict[str, Any], save_optimizer: bool,
         writer: BackgroundWriter | None = None) -> None:
    """Write the checkpoint folder (every rank must call: gathering weights and DeepSpeed saves are collective).
    With `writer` (one process), the actor's DeepSpeed state and then `trainer_state.json` are queued on it
    (train/checkpoint_writer.py): the weights are on disk when this returns, the rest once `writer.wait()`
    returns, and the folder is complete (`is_complete`) only then."""
    actor = engines.actor
    if is_main():
        path.mkdir(parents=True, exist_ok=True)
    barrier()
    if actor.zero_optimization_stage() == 3:
        sd = actor._zero3_consolidated_16bit_state_dict()  # collective; the full state dict on rank 0
        if is_main():
            actor.module.save_pretrained(path, state_dict=sd, safe_serialization=True)
    elif is_main():
        actor.module.save_pretrained(path, safe_serialization=True)
    if is_main():
        engines.tokenizer.save_pretrained(path)
    if save_optimizer:
        _save_without_module(actor, path / DS_DIR, "actor", writer)
        if engines.critic is not None:  # its weights are nowhere else: saved with its state
            engines.critic.save_checkpoint(str(path / DS_DIR), tag="critic", save_latest=False)
    if is_main():  # written last: a checkpoint folder is complete once it is there
        text = json.dumps(state, indent=1)

        def write_state() -> None:
            write_whole(path / STATE_FILE, lambda partial: Path(partial).write_text(text))

        if writer is not None:
            writer.submit(write_state)
        else:
            write_state()
    barrier()


def is_complete(path: str | Path) -> bool:
    """Whether a checkpoint folder is whole: its weights (`config.json`) and its `trainer_state.json`, which
    `save` writes after everything else (a process stopped while its optimizer state was being written in the
    background leaves a folder without it)."""
    path = Path(path)
    return (path / "config.json").is_file() and (path / STATE_FILE).is_file()


def _save_without_module(engine, folder: Path, tag: str, writer: BackgroundWriter | None = None) -> None:
    """The DeepSpeed state of the actor (optimizer moments, step counts) without the module's weights, which
    the checkpoint folder's safetensors hold and a resume loads from there (`load_state`): on SmolLM2-135M
    514 MB of the 1.6 GB DeepSpeed writes per checkpoint. Under ZeRO-3 the whole state (its partitions are
    the weights)."""
    own = engine.checkpoint_engine
    if writer is not None:  # this save's files queued on the writer (the instance's own engine, for this save)
        engine.checkpoint_engine = writer.engine(getattr(own, "zipfile_serialization", True))
    try:
        if engine.zero_optimization_stage() == 3:
            engine.save_checkpoint(str(folder), tag=tag, save_latest=False)
            return
        engine.module_state_dict = lambda *a, **k: {}  # the instance's own, for this save only
        try:
            engine.save_checkpoint(str(folder), tag=tag, save_latest=False)
        finally:
            del engine.module_state_dict
    finally:
        engine.checkpoint_engine = own


def _load_module(src: dict, dst) -> None:
    """DeepSpeed's module load, where a checkpoint saved without the module (`_save_without_module`) leaves
    the weights the engine was built with (the same checkpoint's safetensors); a checkpoint with them loads
    them strictly."""
    if src:
        dst.load_state_dict(src, strict=True)


def machine_state(world: int) -> dict[str, Any]:
    """What a checkpoint's numbers depend on beyond its inputs (kept in trainer_state.json): the torch version,
    its intra-op thread count (float sums are reduced in another order with another count) and the world size.
    A replay of the step (`trajlake train --replay`) is bit-exact only where they are the same."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "world": world}


def load_state(engines: Engines, path: str | Path) -> dict[str, Any]:
    """Restore the DeepSpeed state saved with a checkpoint (when there is one); returns the trainer state."""
    path = Path(path)
    ds = path / DS_DIR
    if (ds / "actor").is_dir():
        engines.actor.load_checkpoint(str(ds), tag="actor", load_module_strict=True, custom_load_fn=_load_module)
    if engines.critic is not None and (ds / "critic").is_dir():
        engines.critic.load_checkpoint(str(ds), tag="critic")
    f = path / STATE_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def clean_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe metrics (train_steps and metrics.jsonl): numbers as plain Python numbers (numpy and one-element
    torch values too), floats rounded, and a NaN or inf as null with its name listed under `non_finite`. A NaN
    never lands as a number (JSON has none, and a report's mean over it would be NaN); a metric with no value
    (a mean over nothing) stays visible as such. The loss is never stored non-finite: train/finite.py stops the
    run before its step is stored."""
    bad: list[str] = []
    out = {k: _clean(v, k, bad) for k, v in metrics.items()}
    if bad:
        out["non_finite"] = bad
    return out


def _clean(v: Any, name: str, bad: list[str]) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        if math.isfinite(v):
            return round(float(v), 6)
        bad.append(name)
        return None
    if isinstance(v, dict):
        return {k: _clean(x, f"{name}.{k}", bad) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x, f"{name}[{i}]", bad) for i, x in enumerate(v)]
    return v


def commit(lake: Lake, *, run_id: str, step: int, metrics: dict[str, Any], snapshot_read: int | None,
           policy: PolicyRow | None = None, spec_id: str | None = None,
           episode_ids: tuple[str, ...] | None = None) -> int | None:
    """One snapshot: the train_steps row (naming `policy` when given, and its lineage: the spec and the
    episodes it trained on) and the policy's row."""
    rows: dict[str, list] = {"train_steps": [TrainStep(run_id, step, policy.policy_id if policy else None,
                                                       snapshot_read, clean_metrics(metrics), spec_id,
                                                       episode_ids)]}
    if policy is not None:
        rows["policies"] = [policy]
    what = f"checkpoint {policy.policy_id}" if policy else "metrics"
    return lake.append(rows, stage="train", run_id=run_id, message=f"train: {run_id} step {step}: {what}").snapshot_id


def policy_row(*, run_id: str, step: int, path: Path, base_model: str, parent: str | None) -> PolicyRow:
    return PolicyRow(policy_id_for(run_id, step), run_id=run_id, step=step, base_model=base_model,
                     checkpoint_uri=str(path), parent_policy_id=parent, created_at=utc_now())


@dataclass(frozen=True)
class Resume:
    """Where a run left off: its last step with a checkpoint."""

    step: int
    policy_id: str
    checkpoint_uri: str
    snapshot_read: int | None
    metrics: dict[str, Any]


def last_checkpoint(lake: Lake, run_id: str) -> Resume | None:
    """The last train_steps row of `run_id` that names a policy with a checkpoint on disk (None: a new run)."""
    rows = lake.query(
        "SELECT s.step, s.policy_id, s.snapshot_read, s.metrics, p.checkpoint_uri FROM train_steps s "
        "JOIN policies p USING (policy_id) WHERE s.run_id = ? ORDER BY s.step DESC", [run_id]).to_dicts()
    for r in rows:
        uri = r["checkpoint_uri"]
        if uri and is_complete(uri):
            m = r["metrics"]
            return Resume(int(r["step"]), r["policy_id"], uri, r["snapshot_read"],
                          json.loads(m) if isinstance(m, str) else (m or {}))
    return None


def resolve_model(lake: Lake | None, model: str) -> tuple[str, str, str, bool]:
    """(checkpoint folder, policy id, base model, needs a policies row) of a config's `model`."""
    if model.startswith("run:"):
        rid = model.split(":", 1)[1]
        if lake is None:
            raise TrajlakeError(f"{model} needs a lake to look it up in")
        last = last_checkpoint(lake, rid)
        if last is None:
            raise TrajlakeError(f"train run {rid!r} has no checkpoint in the store yet (run it first, or see "
                                "trajlake sql 'SELECT run_id, policy_id FROM policies')")
        model = f"policy:{last.policy_id}"
    if model.startswith("policy:"):
        pid = model.split(":", 1)[1]
        if lake is None:
            raise TrajlakeError(f"{model} needs a lake to look it up in")
        rows = lake.query("SELECT checkpoint_uri, base_model FROM policies WHERE policy_id = ?", [pid]).to_dicts()
        if not rows or not rows[0]["checkpoint_uri"]:
            raise TrajlakeError(f"no checkpoint for policy {pid!r} in the store "
                                "(trajlake sql 'SELECT * FROM policies')")
        return rows[0]["checkpoint_uri"], pid, rows[0]["base_model"] or rows[0]["checkpoint_uri"], False
    path = model.split(":", 1)[1] if model.startswith("hf:") else model
    p = Path(path).absolute()
    if not (p / "config.json").is_file():
        raise TrajlakeError(f"no model at {p}: expected a save_pretrained folder (config.json) or policy:ID")
    return str(p), f"hf:{p}", str(p), True
