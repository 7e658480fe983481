"""A train or sft run as the loops see it (`TrainRun`): its process group, run id, resume point, engines and
its row in the run ledger (trajlake.store.runs), and `on_main`, how rank 0's store reads reach every rank.

Constructing a TrainRun only reads; `with run.life():` holds the run in the ledger (`runs.open`: its lease, taken
before the engines are built) and ends it, `start` makes the run's first write. The loops (train/loop.py) and
their episode sources (train/sources/) both use it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trajlake.core.clock import utc_now
from trajlake.core.config_types import DEFAULTS_KEY, stored_defaults
from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import path_component
from trajlake.schemas import Run
from trajlake.store import Lake, runs
from trajlake.store import lease as run_lease
from trajlake.store.outputs import check_output_path
from trajlake.train.algos import ALGOS
from trajlake.train.checkpoint import (
    PolicyRow,
    Resume,
    checkpoint_path,
    clean_metrics,
    last_checkpoint,
    load_state,
    machine_state,
    policy_row,
    resolve_model,
)
from trajlake.train.checkpoint import commit as commit_step
from trajlake.train.checkpoint import save as save_checkpoint
from trajlake.train.checkpoint_writer import BackgroundWriter
from trajlake.train.config import ConfigError, TrainConfig
from trajlake.train.distributed import broadcast, init_distributed
from trajlake.train.engine import Engines, build_engines


class TrainRun:
    """What train and sft share: process group, run id, resume point, engines, run row (in the run ledger,
    trajlake.store.runs).

    Constructing it only reads: it resolves the starting model, finds where a restarted run left off and
    refuses a restart with other settings. `start()` makes the run's first write, once everything that can be
    checked without training was checked, so a command refused before it leaves the lake as it was."""

    def __init__(self, config: TrainConfig, lake: Lake | None, kind: str, spec_id: str | None = None):
        self.cfg = config
        self.spec_id = spec_id  # the reward spec's content id: a restart compares it, not the spec's path
        self.rank, self.world = init_distributed()
        self.main = self.rank == 0
        if self.main and lake is None:
            raise TrajlakeError("rank 0 needs the lake")
        self.lake = lake if self.main else None
        rid = config.run.id or runs.new_run_id(kind)

        def resolve():
            # the checkpoints and the trackers' logs (under <checkpoint_dir>/<run>) must not land among the lake's
            # files: refused here, before the lease, the model or the engines
            check_output_path(lake.catalog, config.checkpoint.dir, "train config: checkpoint_dir")
            # and the run's own folder in it (checkpoint_dir "." beside ./lake with run id "lake" is the lake)
            check_output_path(lake.catalog, Path(config.checkpoint.dir) / path_component(rid),
                              "train config: the run's checkpoint folder")
            run_lease.check(lake, rid)  # another live process runs it: refused before any work (reads only)
            try:
                start_path, start_pid, base, new_row = resolve_model(lake, config.run.model)
            except ConfigError:
                raise
            except TrajlakeError as e:  # name the field: the path or id alone may not say which setting it is
                raise ConfigError(f"train config: model {config.run.model!r}: {e}") from None
            resume = last_checkpoint(lake, rid)
            stored = stored_train_run(lake, config, rid, start_pid, resume, spec_id=spec_id)
            return rid, start_path, start_pid, base, new_row, resume, stored

        (self.run_id, self.start_path, self.start_pid, self.base, self.new_row, self.resume,
         self.stored) = on_main(self.main, resolve)
        self.ledger: runs.OpenRun | None = None  # rank 0, inside life()
        self.engine = self.cfg.rollout.engine  # the engine the rollouts play on: an `auto` run's choice (fresh.py)
        self.rollout = None  # replicas > 1 or rollout_engine vllm: what the rollouts play on (rank 0)
        self.rollout_loaded: str | None = None  # the checkpoint it holds
        self.trackers = None  # report_to's trackers (rank 0, from start())
        self.writer: BackgroundWriter | None = None  # the checkpoints' background writes (checkpoint())
        self.step = self.resume.step if self.resume else 0
        self.policy_id = self.resume.policy_id if self.resume else self.start_pid
        self.model_path = self.resume.checkpoint_uri if self.resume else self.start_path

    @contextlib.contextmanager
    def life(self) -> Iterator[None]:
        """The run's life in the ledger: on rank 0 `runs.open` (refused, on every rank, when another live process
        holds the run id or the run is stored with other settings) with its lease held throughout, and refused
        too when the run moved on since this process read where it left off (a process that held the lease then
        checkpointed: run it again to start from there). On leaving: the trackers and rollout engine closed, then
        a run that `start` wrote marked finished, or failed with the error, and the lease given back."""
        stack = contextlib.ExitStack()

        def enter() -> None:
            self.ledger = stack.enter_context(runs.open(
                self.lake, "train", self.cfg, run_id=self.run_id, error=ConfigError, start_policy=self.start_pid,
                spec_id=self.spec_id))
            if last_checkpoint(self.lake, self.run_id) != self.resume:
                raise TrajlakeError(f"run {self.run_id} moved on while this process started (another process ran "
                                    "it meanwhile): run it again to resume from where it is now")

        try:
            on_main(self.main, enter)
        except BaseException:
            stack.close()
            raise
        with stack:
            try:
                yield
            except BaseException:
                self._close(failing=True)
                raise
            self._close()

    def _close(self, failing: bool = False) -> None:
        """The last checkpoint's writes finished (a failed write fails the run, unless it is failing already),
        the trackers and the rollout engine closed."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            try:
                writer.close()
            except Exception:
                if not failing:
                    raise
        if self.trackers is not None:
            self.trackers.close()
        if self.rollout is not None:
            self.rollout.close()
            self.rollout = None

    def start(self, **resolved: Any) -> None:
        """Rank 0 records the run (a restart: marks it running again, with this restart's RESUMABLE_FIELDS in
        its config) and its starting model's policy row. `resolved`: what settings resolved to, stored beside
        the config (e.g. the snapshot stored rollouts are read at)."""
        if not self.main:
            return
        from trajlake.train.trackers import Trackers

        config = {**self.cfg.to_dict(), "start_policy": self.start_pid, **resolved,  # what `model` resolved to
                  DEFAULTS_KEY: stored_defaults(type(self.cfg))}
        if self.spec_id:
            config["reward_spec_id"] = self.spec_id  # what `reward_spec` held
        # before the first write: a tracker that cannot start (not installed) leaves the lake as it was
        self.trackers = Trackers(self.cfg.run.report_to, self.metrics_log.parent, self.run_id, config)
        policies = [PolicyRow(self.start_pid, run_id=self.run_id, base_model=self.base,
                                checkpoint_uri=self.start_path, created_at=utc_now())] if self.new_row else []
        message = f"train: start run {self.run_id}"
        if self.stored is None:
            run = Run(self.run_id, "train", config=config, status="running", started_at=utc_now())
            self.ledger.begin(run, message=message, rows={"policies": policies} if policies else None)
            return
        if policies:  # already stored for a restart: the append then skips it and writes nothing
            self.lake.append({"policies": policies}, stage="train", run_id=self.run_id, message=message)
        self.ledger.restart(config=config)

    def build(self, critic: bool = False, ref: bool = False) -> Engines:
        """The engines, inside `life()` (the run's lease held): DeepSpeed's setup takes seconds to minutes (more
        where it builds an op on first use), and a second process with this run id must be refused before it."""
        engines = build_engines(self.cfg, self.model_path, critic=critic, ref=ref, ref_path=self.start_path,
                                critic_path=self.start_path)
        self.state = load_state(engines, self.model_path) if self.resume else {}
        return engines

    def checkpoint(self, engines: Engines, state: dict[str, Any], *, background: bool = False) -> tuple[PolicyRow, Any]:
        """Save step `self.step`'s checkpoint; its policy row. `background` (the RL loop, one process): the
        optimizer state is written while the loop goes on (`settle` waits for it before the next update)."""
        path = checkpoint_path(self.cfg.checkpoint.dir, self.run_id, self.step)
        if background and self.world == 1 and self.writer is None:
            self.writer = BackgroundWriter()
        save_checkpoint(engines, path, state={**state, **machine_state(self.world)},
                        save_optimizer=self.cfg.checkpoint.save_optimizer,
                        writer=self.writer if background else None)
        return policy_row(run_id=self.run_id, step=self.step, path=path, base_model=self.base,
                            parent=self.policy_id), path

    def settle(self) -> None:
        """Wait until the last checkpoint is whole on disk (its optimizer state written in the background): before
        an update changes that state, and before the run ends."""
        if self.writer is not None:
            self.writer.wait()

    @property
    def metrics_log(self) -> Any:
        """`<checkpoint_dir>/<run>/metrics.jsonl`: every train_steps row, also readable while the run holds
        the lake (a DuckDB-file lake admits one process at a time)."""
        return checkpoint_path(self.cfg.checkpoint.dir, self.run_id, 0).parent / "metrics.jsonl"

    def commit(self, *, step: int, metrics: dict[str, Any], snapshot_read: int | None,
               policy: PolicyRow | None = None, spec_id: str | None = None,
               episode_ids: tuple[str, ...] | None = None) -> None:
        """Rank 0: one train_steps row (and the policy's) in the lake, and the same metrics as a line of
        `metrics_log`."""
        commit_step(self.lake, run_id=self.run_id, step=step, metrics=metrics, snapshot_read=snapshot_read,
                 policy=policy, spec_id=spec_id, episode_ids=episode_ids)
        self.trackers.log(step, metrics)
        self.metrics_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_log, "a") as f:
            f.write(json.dumps({"run_id": self.run_id, "step": step, "policy_id": policy.policy_id if policy else None,
                                "metrics": clean_metrics(metrics)}) + "\n")

def on_main(main: bool, fn: Any) -> Any:
    """`fn()` run on rank 0 and its result on every rank; a TrajlakeError it raises is raised on every rank
    (not only on rank 0, which would leave the others waiting in the broadcast)."""
    out: Any = None
    if main:
        try:
            out = fn()
        except TrajlakeError as e:
            out = e
    out = broadcast(out)
    if isinstance(out, TrajlakeError):
        raise out
    return out


def stored_train_run(lake: Lake, config: TrainConfig, run_id: str, start_policy: str,
                     resume: Resume | None, *, spec_id: str | None = None) -> runs.StoredRun | None:
    """The stored run that `config` restarts, or None for a new run. Raises, writing nothing, when `run_id` is
    not a train run, was started with other RUN_FIELDS, or has done more steps than `config` asks for."""
    run = runs.find(lake, run_id, config, kinds=("train",), error=ConfigError, start_policy=start_policy,
                    spec_id=spec_id)
    if run is None:
        return None
    done = resume.step if resume else 0
    field = ALGOS[config.run.algo].counter  # iterations or sft_steps, as the algo's loop counts
    if config.value(field) < done:
        raise ConfigError(f"train config: {field} {config.value(field)} is fewer than the {done} run {run_id} "
                          f"has done already: give {field} >= {done} to resume it (or use a new --run-id)")
    return run
