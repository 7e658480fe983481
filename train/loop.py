"""The training loops: `train` (GRPO/PPO iterations over the store) and `sft` (fine-tuning on a store query).

An iteration: collect `samples` episodes of each of `tasks` tasks with the current policy into the store
(collect run `<run_id>/it-<n>`), score them with the reward spec, read them back as a batch at a pinned
snapshot, compute advantages, run the epochs, checkpoint (a new row in `policies`), evaluate on held-out
tasks every `eval_every` iterations, and record a `train_steps` row (metrics, snapshot read, policy).

Only rank 0 touches the store (a DuckDB-file lake admits one process); batches reach the other ranks by
broadcast. A run restarted with the same run id continues after its last checkpoint; an iteration cut
short re-collects under the same collect run id, which resumes instead of replaying what is stored.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from trajlake.collect.config import describe_differences
from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_str
from trajlake.schemas import Run
from trajlake.store import Lake
from trajlake.store import lease as run_lease
from trajlake.train import checkpoint as C
from trajlake.train import distributed as D
from trajlake.train import engine as E
from trajlake.train.algos import ADVANTAGES, ALGOS, SFT_LOOP, make_kl_controller
from trajlake.train.batch import check_episode_filter, collate, load_episodes
from trajlake.train.config import ConfigError, TrainConfig
from trajlake.train.finite import NonFiniteError
from trajlake.train.progress import NO_SIGNAL_WARN, TrainProgress, no_signal_cause
from trajlake.train.rollouts import collect_run, eval_config, evaluate, rollout_config
from trajlake.train.steps import iteration_update, sft_update


@dataclass
class RunResult:
    """What a train or sft run ended with."""

    run_id: str
    policy_id: str
    step: int
    history: list[dict[str, Any]] = field(default_factory=list)






class _Run:
    """What train and sft share: process group, run id, resume point, engines, run row.

    Constructing it only reads: it resolves the starting model, finds where a restarted run left off and
    refuses a restart with other settings. `start()` makes the run's first write, once everything that can be
    checked without training was checked, so a command refused before it leaves the lake as it was."""

    def __init__(self, config: TrainConfig, lake: Lake | None, kind: str, spec_id: str | None = None):
        self.cfg = config
        self.spec_id = spec_id  # the reward spec's content id: a restart compares it, not the spec's path
        self.rank, self.world = D.init_distributed()
        self.main = self.rank == 0
        if self.main and lake is None:
            raise TrajlakeError("rank 0 needs the lake")
        self.lake = lake if self.main else None
        rid = config.run_id or f"{kind}-{utc_now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"

        def resolve():
            run_lease.check(lake, rid)  # another live process runs it: refused before any work (reads only)
            try:
                start_path, start_pid, base, new_row = C.resolve_model(lake, config.model)
            except ConfigError:
                raise
            except TrajlakeError as e:  # name the field: the path or id alone may not say which setting it is
                raise ConfigError(f"train config: model {config.model!r}: {e}") from None
            resume = C.last_checkpoint(lake, rid)
            stored = stored_train_run(lake, config, rid, start_pid, resume, spec_id=spec_id)
            return rid, start_path, start_pid, base, new_row, resume, stored

        (self.run_id, self.start_path, self.start_pid, self.base, self.new_row, self.resume,
         self.stored) = on_main(self.main, resolve)
        self.lease: run_lease.Lease | None = None  # rank 0, from acquire() to finish()
        self.rollout = None  # replicas > 1 or rollout_engine vllm: what the rollouts play on (rank 0)
        self.rollout_loaded: str | None = None  # the checkpoint it holds
        self.trackers = None  # report_to's trackers (rank 0, from start())
        self.step = self.resume.step if self.resume else 0
        self.policy_id = self.resume.policy_id if self.resume else self.start_pid
        self.model_path = self.resume.checkpoint_uri if self.resume else self.start_path

    def acquire(self) -> None:
        """Take the run id's lease (store/lease.py) before the run's first write, on rank 0: one live process
        per run id. What __init__ read before it may have moved on meanwhile (a process that held the lease
        then checkpointed): then this one gives the lease back and is refused, to start again from there."""
        def take() -> None:
            self.lease = run_lease.acquire(self.lake, self.run_id, "train")
            if C.last_checkpoint(self.lake, self.run_id) != self.resume:
                self.release()
                raise TrajlakeError(f"run {self.run_id} moved on while this process started (another process ran "
                                    "it meanwhile): run it again to resume from where it is now")

        on_main(self.main, take)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def start(self, **resolved: Any) -> None:
        """Rank 0 records the run (a restart: marks it running again, with this restart's RESUMABLE_FIELDS in
        its config) and its starting model's policy row. `resolved`: what settings resolved to, stored beside
        the config (e.g. the snapshot stored rollouts are read at)."""
        if not self.main:
            return
        from trajlake.train.trackers import Trackers

        config = {**self.cfg.to_dict(), "start_policy": self.start_pid, **resolved}  # what `model` resolved to
        if self.spec_id:
            config["reward_spec_id"] = self.spec_id  # what `reward_spec` held
        # before the first write: a tracker that cannot start (not installed) leaves the lake as it was
        self.trackers = Trackers(self.cfg.report_to, self.metrics_log.parent, self.run_id, config)
        rows: dict[str, list] = {}
        if self.stored is None:
            rows["runs"] = [Run(self.run_id, "train", config=config, status="running", started_at=utc_now())]
        if self.new_row:  # already stored for a restart: the append then skips it and writes nothing
            rows["policies"] = [C.PolicyRow(self.start_pid, run_id=self.run_id, base_model=self.base,
                                            checkpoint_uri=self.start_path, created_at=utc_now())]
        if rows:
            self.lake.append(rows, stage="train", run_id=self.run_id, message=f"train: start run {self.run_id}")
        if self.stored is not None:
            changes: dict[str, Any] = {}
            if self.stored["status"] != "running":
                changes.update(status="running", finished_at=None)
            if json.loads(json.dumps(config)) != self.stored["config"]:
                changes["config"] = config
            if changes:
                self.lake.update("runs", {"run_id": self.run_id}, changes, stage="train", run_id=self.run_id,
                                 message=f"train: resume run {self.run_id}")

    def build(self, critic: bool = False, ref: bool = False) -> E.Engines:
        engines = E.build_engines(self.cfg, self.model_path, critic=critic, ref=ref, ref_path=self.start_path,
                                  critic_path=self.start_path)
        self.state = C.load_state(engines, self.model_path) if self.resume else {}
        return engines

    def checkpoint(self, engines: E.Engines, state: dict[str, Any]) -> tuple[C.PolicyRow, Any]:
        path = C.checkpoint_path(self.cfg.checkpoint_dir, self.run_id, self.step)
        C.save(engines, path, state={**state, **C.machine_state(self.world)}, save_optimizer=self.cfg.save_optimizer)
        return C.policy_row(run_id=self.run_id, step=self.step, path=path, base_model=self.base,
                            parent=self.policy_id), path

    @property
    def metrics_log(self) -> Any:
        """`<checkpoint_dir>/<run>/metrics.jsonl`: every train_steps row, also readable while the run holds
        the lake (a DuckDB-file lake admits one process at a time)."""
        return C.checkpoint_path(self.cfg.checkpoint_dir, self.run_id, 0).parent / "metrics.jsonl"

    def commit(self, *, step: int, metrics: dict[str, Any], snapshot_read: int | None,
               policy: C.PolicyRow | None = None, spec_id: str | None = None,
               episode_ids: tuple[str, ...] | None = None) -> None:
        """Rank 0: one train_steps row (and the policy's) in the lake, and the same metrics as a line of
        `metrics_log`."""
        C.commit(self.lake, run_id=self.run_id, step=step, metrics=metrics, snapshot_read=snapshot_read,
                 policy=policy, spec_id=spec_id, episode_ids=episode_ids)
        self.trackers.log(step, metrics)
        self.metrics_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_log, "a") as f:
            f.write(json.dumps({"run_id": self.run_id, "step": step, "policy_id": policy.policy_id if policy else None,
                                "metrics": C.clean_metrics(metrics)}) + "\n")

    def finish(self, status: str) -> None:
        try:
            if self.trackers is not None:
                self.trackers.close()
            if self.rollout is not None:
                self.rollout.close()
                self.rollout = None
            if self.main:
                self.lake.update("runs", {"run_id": self.run_id}, {"status": status, "finished_at": utc_now()},
                                 stage="train", run_id=self.run_id)
        finally:  # ended, failed or interrupted: the next process may run it
            self.release()


def on_main(main: bool, fn: Any) -> Any:
    """`fn()` run on rank 0 and its result on every rank; a TrajlakeError it raises is raised on every rank
    (not only on rank 0, which would leave the others waiting in the broadcast)."""
    out: Any = None
    if main:
        try:
            out = fn()
        except TrajlakeError as e:
            out = e
    out = D.broadcast(out)
    if isinstance(out, TrajlakeError):
        raise out
    return out


def stored_train_run(lake: Lake, config: TrainConfig, run_id: str, start_policy: str,
                     resume: C.Resume | None, *, spec_id: str | None = None) -> dict[str, Any] | None:
    """The stored run row (status, config) that `config` restarts, or None for a new run. Raises, writing
    nothing, when `run_id` is not a train run, was started with other RUN_FIELDS, or has done more steps than
    `config` asks for."""
    rows = lake.query("SELECT kind, status, config FROM runs WHERE run_id = ?", [run_id])
    if rows.height == 0:
        return None
    row = rows.row(0, named=True)
    if row["kind"] != "train":
        raise ConfigError(f"run {run_id} already exists as a {row['kind']} run, not a train run (use a new --run-id)")
    stored = row["config"]
    row["config"] = stored = json.loads(stored) if isinstance(stored, str) else dict(stored or {})
    diffs = config.differences(stored, start_policy=start_policy, spec_id=spec_id)
    if diffs:
        raise ConfigError(describe_differences(run_id, diffs))
    done = resume.step if resume else 0
    field = ALGOS[config.algo].counter  # iterations or sft_steps, as the algo's loop counts
    if getattr(config, field) < done:
        raise ConfigError(f"train config: {field} {getattr(config, field)} is fewer than the {done} run {run_id} "
                          f"has done already: give {field} >= {done} to resume it (or use a new --run-id)")
    return row


def train(config: TrainConfig, lake: Lake | None) -> RunResult:
    """GRPO/PPO iterations (or, for algo sft, `sft`). Every rank calls it; only rank 0 needs `lake`."""
    if ALGOS[config.algo].loop == SFT_LOOP:
        return sft(config, lake)
    from trajlake.rewards import default_spec, load_spec
    from trajlake.rewards.score import score
    from trajlake.train.replay import check_train_filter, replay_filter, stored_data

    c = config
    spec = load_spec(c.reward_spec) if c.reward_spec else default_spec()
    r = _Run(config, lake, "train", spec_id=spec.spec_id)

    def check_collect() -> None:  # collect's own checks of the rollouts' and evals' settings, before any write
        rollout_config(r, r.policy_id, 0)
        if c.eval_every:
            eval_config(r, r.policy_id, 0)

    on_main(r.main, check_collect)
    if c.train_filter:
        on_main(r.main, lambda: check_train_filter(r.lake, c))  # reads only, before any write
    if c.replay_filter:
        on_main(r.main, lambda: check_episode_filter(r.lake, c.replay_filter, field="replay_filter"))
    if ADVANTAGES[c.advantage_name].turn_level and spec.allocation.strategy == "discounted":
        raise ConfigError(f"train config: advantage {c.advantage_name} discounts across turns itself (gamma); the "
                          f"reward_spec {spec.name} discounts them in its allocation too: use allocation last_token "
                          "or per_turn")
    algo = ALGOS[c.algo]
    engines = r.build(critic=algo.needs_critic, ref=algo.needs_reference(c))
    kl_ctl = make_kl_controller(c.kl_controller, c.kl_coef, c.kl_target, c.kl_horizon)
    if "kl_controller" in r.state:
        kl_ctl.load_state_dict(r.state["kl_controller"])
    data = None
    r.acquire()
    try:
        if c.train_filter:  # the stored rollouts, scored (the first write: every check above only read), pinned
            pinned = (r.stored or {}).get("config", {}).get("train_snapshot_read")
            data = on_main(r.main, lambda: stored_data(r.lake, c, spec, pinned))
        r.start(**({"train_snapshot_read": data.snapshot} if data else {}))  # the run's row
    except BaseException:
        r.release()
        raise
    result = RunResult(r.run_id, r.policy_id, r.step)
    no_signal = 0  # iterations in a row whose update had no learning signal
    try:
        with TrainProgress(c.iterations, enabled=c.progress and r.main, run_id=r.run_id, done=r.step) as bar:
            if r.step == 0 and c.eval_every:
                m = evaluate(r, engines, r.policy_id, r.model_path, 0)
                if r.main:
                    r.commit(step=0, metrics=m, snapshot_read=None)
                result.history.append(m)
            while r.step < c.iterations:
                it = r.step
                t0 = time.perf_counter()
                payload = None
                if r.main and data is None:  # fresh rollouts of the current policy, scored
                    crun = collect_run(r, engines, r.policy_id, r.model_path, rollout_config(r, r.policy_id, it))
                    where = f"run_id = {sql_str(crun)}"
                    score(r.lake, spec, where=where, run_id=r.run_id)
                    snap = r.lake.current_snapshot()
                    seqs = load_episodes(r.lake, where, snapshot=snap, spec_id=spec.spec_id)
                    replay = replay_filter(c, r.run_id, it, r.lake, snap)  # earlier rollouts mixed in, if asked
                    replayed = load_episodes(r.lake, replay, snapshot=snap, spec_id=spec.spec_id) if replay else []
                    where = f"({where}\n) OR ({replay}\n)" if replay else where
                    # in episode_id order, as one load of `where` gives them: a replay of the step gets this batch
                    payload = (snap, where, sorted(seqs + replayed, key=lambda s: s.episode_id), len(replayed))
                elif r.main:  # this iteration's groups of the stored rollouts
                    where = data.iteration_filter(it, c.tasks)
                    seqs = load_episodes(r.lake, where, snapshot=data.snapshot, spec_id=spec.spec_id)
                    payload = (data.snapshot, where, seqs, len(seqs))
                snap, where, seqs, n_replayed = D.broadcast(payload)
                if not seqs:
                    raise TrajlakeError(f"iteration {it + 1}: the rollouts produced no agent tokens to train on")
                t1 = time.perf_counter()
                try:
                    batch, m_upd = iteration_update(engines, seqs, c, kl_ctl, it)
                except NonFiniteError as e:  # before its checkpoint: nothing of the iteration is stored
                    raise e.stopped(r.run_id, f"iteration {it + 1}", c) from None
                t2 = time.perf_counter()
                agent_tokens = int(batch.loss_mask.sum())
                metrics = {"iteration": it + 1, "episodes": batch.size, "reward_mean": float(batch.scores.mean()),
                           "reward_std": float(batch.scores.std()) if batch.size > 1 else 0.0,
                           "success_mean": float(batch.success.float().mean()), "agent_tokens": agent_tokens,
                           "collect_s": t1 - t0, "update_s": t2 - t1,
                           "rollout_tokens_per_s": agent_tokens / max(t1 - t0, 1e-9), **m_upd}
                # lineage: the episodes this step trained on are `episodes_where` at snapshot_read (the query; the
                # row's episode_ids lists them), scored by the row's spec_id
                metrics.update(episodes_where=where, replayed=n_replayed / len(seqs))
                if data is not None:  # the stored groups too small to use
                    metrics.update(groups_left_out=data.small_groups)
                no_signal = no_signal + 1 if metrics.get("signal_rows", 1.0) == 0 else 0
                metrics["no_signal_streak"] = no_signal
                if no_signal >= NO_SIGNAL_WARN:
                    metrics["warning"] = (f"{no_signal} iterations in a row without a learning signal (every "
                                          f"advantage 0, nothing trained): {no_signal_cause(metrics, c.temperature)}")
                    if r.main:
                        bar.warn(metrics["warning"])
                r.step = it + 1
                row, path = r.checkpoint(engines, {"step": r.step, "kl_controller": kl_ctl.state_dict()})
                if c.eval_every and (r.step % c.eval_every == 0 or r.step == c.iterations):
                    metrics.update(evaluate(r, engines, row.policy_id, str(path), r.step))
                if r.main:
                    r.commit(step=r.step, metrics=metrics, snapshot_read=snap, policy=row, spec_id=spec.spec_id,
                             episode_ids=tuple(s.episode_id for s in seqs))
                D.barrier()
                r.policy_id, r.model_path = row.policy_id, str(path)
                result.policy_id, result.step = r.policy_id, r.step
                result.history.append(metrics)
                bar.update(r.step, metrics)
        r.finish("finished")
    except BaseException:
        r.finish("failed")
        raise
    return result


def sft(config: TrainConfig, lake: Lake | None) -> RunResult:
    """Supervised fine-tuning on the episodes `config.sft_filter` selects (e.g. successful scripted-expert
    ones): cross-entropy on their response tokens, `sft_steps` optimizer steps of `minibatch_size`."""
    r = _Run(config, lake, "sft")
    c = config

    def read() -> tuple[int, list]:
        snap = c.sft_snapshot or (r.resume.snapshot_read if r.resume else None) or r.lake.current_snapshot()
        if c.sft_snapshot is not None and c.sft_snapshot not in r.lake.snapshots()["snapshot_id"].to_list():
            raise ConfigError(f"train config: sft_snapshot {c.sft_snapshot} is not a snapshot of the lake "
                              "(trajlake snapshots lists them)")
        check_episode_filter(r.lake, c.sft_filter, field="sft_filter", snapshot=snap)  # a bad filter names it
        return snap, load_episodes(r.lake, c.sft_filter, snapshot=snap)

    snap, seqs = on_main(r.main, read)
    if not seqs:
        raise ConfigError(f"train config: no episodes match sft_filter ({c.sft_filter}) at snapshot {snap} (episodes "
                          "that ended in an env error or hold no agent tokens never do)")
    engines = r.build()
    batch = collate(seqs, engines.pad_id)
    n, mb = batch.size, min(c.minibatch_size, batch.size)

    @functools.lru_cache(maxsize=4)
    def perm(epoch: int) -> list[int]:
        return torch.randperm(n, generator=torch.Generator().manual_seed(c.seed * 100_003 + epoch)).tolist()

    def rows_of(step: int) -> list[int]:  # a fixed stream of shuffled epochs, so a resumed run picks up exactly
        return [perm(k // n)[k % n] for k in range(step * mb, (step + 1) * mb)]

    r.acquire()
    try:
        r.start()  # the first write: everything above only read, so a refused run left no trace
    except BaseException:
        r.release()
        raise
    result = RunResult(r.run_id, r.policy_id, r.step)
    t0 = time.perf_counter()
    try:
        with TrainProgress(c.sft_steps, enabled=c.progress and r.main, run_id=r.run_id, done=r.step,
                           every=c.log_every) as bar:
            trained: dict[str, None] = {}  # lineage: the episodes of the steps since the last row, in order
            while r.step < c.sft_steps:
                rows = rows_of(r.step)
                try:
                    m = sft_update(engines, batch, rows, c)
                except NonFiniteError as e:  # before its checkpoint or metrics row: nothing of the step is stored
                    raise e.stopped(r.run_id, f"step {r.step + 1}", c) from None
                trained.update((batch.episode_ids[i], None) for i in rows)
                r.step += 1
                m = {"step": r.step, "episodes": n, **m, "elapsed_s": time.perf_counter() - t0}
                result.history.append(m)
                bar.update(r.step, m)
                last = r.step == c.sft_steps
                if last or (c.checkpoint_every and r.step % c.checkpoint_every == 0):
                    row, path = r.checkpoint(engines, {"step": r.step})
                    if r.main:
                        r.commit(step=r.step, metrics=m, snapshot_read=snap, policy=row, episode_ids=tuple(trained))
                    trained.clear()
                    r.policy_id = result.policy_id = row.policy_id
                    result.step = r.step
                elif r.step % c.log_every == 0 and r.main:
                    r.commit(step=r.step, metrics=m, snapshot_read=snap, episode_ids=tuple(trained))
                    trained.clear()
        r.finish("finished")
    except BaseException:
        r.finish("failed")
        raise
    return result


def run(config: TrainConfig, lake_uri: str | None = None) -> RunResult:
    """Entry point of `trajlake train` and `python -m trajlake.train`: opens the lake on rank 0 only."""
    rank, _ = D.init_distributed()
    lake = Lake.open(lake_uri) if rank == 0 else None
    try:
        return train(config, lake)
    finally:
        if lake is not None:
            lake.close()
