"""The training loops: `train` (GRPO/PPO iterations over the store) and `sft` (fine-tuning on a store query).

An iteration: collect `samples` episodes of each of `tasks` tasks with the current policy into the store
(collect run `<run_id>/it-<n>`), score them with the reward spec, read them back as a batch at a pinned
snapshot, compute advantages, run the epochs, checkpoint (a new row in `policies`), evaluate on held-out
tasks every `eval_every` iterations, and record a `train_steps` row (metrics, snapshot read, policy).

Only rank 0 touches the store (a DuckDB-file lake admits one process); batches reach the other ranks by
broadcast. A run restarted with the same run id continues after its last checkpoint (train/train_run.py: the
run's row in the run ledger, its resume point and engines); an iteration cut short re-collects under the same
collect run id, which resumes instead of replaying what is stored.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trajlake.core.errors import TrajlakeError
from trajlake.schemas.allocations import ALLOCATIONS
from trajlake.store import Lake
from trajlake.train.algos import ADVANTAGES, ALGOS, SFT_LOOP, make_kl_controller
from trajlake.train.batch import check_episode_filter, collate, load_episodes
from trajlake.train.config import ConfigError, TrainConfig
from trajlake.train.distributed import barrier, broadcast, init_distributed
from trajlake.train.eval_guard import EvalPoint, eval_points, regression, stopped_reason
from trajlake.train.finite import NonFiniteError
from trajlake.train.progress import NoSignalStreak, TrainProgress
from trajlake.train.sources import IterationEpisodes
from trajlake.train.sources.asynchronous import AsyncRollouts, check_async_lake
from trajlake.train.sources.evaluation import eval_config, evaluate
from trajlake.train.sources.fresh import FreshRollouts, choose_rollout_engine, rollout_config
from trajlake.train.sources.stored import StoredRollouts
from trajlake.train.steps import iteration_update, sft_update
from trajlake.train.train_run import TrainRun, on_main


@dataclass
class RunResult:
    """What a train or sft run ended with."""

    run_id: str
    policy_id: str
    step: int
    history: list[dict[str, Any]] = field(default_factory=list)


def train(config: TrainConfig, lake: Lake | None) -> RunResult:
    """GRPO/PPO iterations (or, for algo sft, `sft`). Every rank calls it; only rank 0 needs `lake`."""
    if ALGOS[config.run.algo].loop == SFT_LOOP:
        return sft(config, lake)
    from trajlake.rewards import default_spec, load_spec

    c = config
    spec = load_spec(c.run.reward_spec) if c.run.reward_spec else default_spec()
    r = TrainRun(config, lake, "train", spec_id=spec.spec_id)

    check_before_writing(r, spec)
    algo = ALGOS[c.run.algo]
    with r.life():  # the lease before the engines; finished, or failed with the error, once started
        engines = r.build(critic=algo.needs_critic, ref=algo.needs_reference(c))
        kl_ctl, data = _start_rl(r, engines, spec)
        result = RunResult(r.run_id, r.policy_id, r.step)
        source = rollout_source(r, engines, spec, data)
        streak = NoSignalStreak(c.rollout.temperature)
        # the source closed when the run ends however it ends (the async collectors stop playing)
        with contextlib.closing(source), TrainProgress(c.run.iterations, enabled=c.run.progress and r.main,
                                                       run_id=r.run_id, done=r.step) as bar:
            if r.step == 0 and c.eval.every:
                m = evaluate(r, engines, r.policy_id, r.model_path, 0)
                if r.main:
                    r.commit(step=0, metrics=m, snapshot_read=None)
                result.history.append(m)
            guard = on_main(r.main, lambda: _guard_state(r))
            if guard["stopped"] and r.main:
                bar.warn(f"stopped earlier: {guard['stopped']}; a new run id trains again")
            while r.step < c.run.iterations and not guard["stopped"]:
                metrics = _iteration(r, engines, source, spec, kl_ctl, data, streak, guard, bar)
                result.policy_id, result.step = r.policy_id, r.step
                result.history.append(metrics)
                bar.update(r.step, metrics)
    return result


def rollout_source(r: TrainRun, engines, spec, data):
    """Where the iterations' episodes come from: the stored ones of train_filter, the async collectors' (the
    collectors start here), or each iteration's own fresh rollouts."""
    if data is not None:
        return StoredRollouts(r, data, spec)
    if r.cfg.asynchronous.collectors:
        return AsyncRollouts(r, spec)
    return FreshRollouts(r, engines, spec)


def _start_rl(r: TrainRun, engines, spec) -> tuple[Any, Any]:
    """(the KL controller, restored on a resume; the stored rollouts of train_filter, scored and pinned, else
    None), and the run's row written: the first write, every check before it only read."""
    from trajlake.train.sources.stored import stored_data

    c = r.cfg
    kl_ctl = make_kl_controller(c.kl.controller, c.kl.coef, c.kl.target, c.kl.horizon)
    if "kl_controller" in r.state:
        kl_ctl.load_state_dict(r.state["kl_controller"])
    data = None
    if c.data.train_filter:
        pinned = r.stored.config.get("train_snapshot_read") if r.stored else None
        data = on_main(r.main, lambda: stored_data(r.lake, c, spec, pinned))
    # the engine its rollouts and evaluations play on, recorded with the run's config (rank 0 plays them)
    chosen = {"rollout_engine_chosen": choose_rollout_engine(r, engines)} if r.main else {}
    r.start(**({"train_snapshot_read": data.snapshot} if data else {}), **chosen)  # the run's row
    return kl_ctl, data


def _iteration(r: TrainRun, engines, source, spec, kl_ctl, data, streak: NoSignalStreak, guard: dict[str, Any],
               bar: TrainProgress) -> dict[str, Any]:
    """One RL iteration: its episodes (rank 0, broadcast), the update, the checkpoint, the held-out evaluation
    when due (stopping the run on a regression), the train_steps row; returns its metrics."""
    c, it = r.cfg, r.step
    t0 = time.perf_counter()
    got: IterationEpisodes = broadcast(source.episodes(it) if r.main else None)
    if not got.seqs:
        raise TrajlakeError(f"iteration {it + 1}: the rollouts produced no agent tokens to train on")
    t1 = time.perf_counter()
    r.settle()  # the last checkpoint's optimizer state on disk before the update changes it
    try:
        batch, m_upd = iteration_update(engines, got.seqs, c, kl_ctl, it)
    except NonFiniteError as e:  # before its checkpoint: nothing of the iteration is stored
        raise e.stopped(r.run_id, f"iteration {it + 1}", c) from None
    metrics = iteration_metrics(it, batch, m_upd, got, collect_s=t1 - t0, update_s=time.perf_counter() - t1)
    if data is not None:  # the stored groups too small to use
        metrics.update(groups_left_out=data.small_groups)
    warning = streak.update(metrics)
    if warning and r.main:
        bar.warn(warning)
    r.step = it + 1
    row, path = r.checkpoint(engines, {"step": r.step, "kl_controller": kl_ctl.state_dict()}, background=True)
    if c.eval.every and (r.step % c.eval.every == 0 or r.step == c.run.iterations):
        metrics.update(evaluate(r, engines, row.policy_id, str(path), r.step))
        now = EvalPoint(r.step, metrics["eval_success"], metrics["eval_episodes"])
        why = regression(guard["start"], now) if c.eval.stop_on_regression else None
        if why:
            metrics["stopped"] = guard["stopped"] = why
            if r.main:
                bar.warn(f"stopping: {why}")
    if r.main:
        r.commit(step=r.step, metrics=metrics, snapshot_read=got.snapshot, policy=row,
                 spec_id=spec.spec_id, episode_ids=tuple(s.episode_id for s in got.seqs))
    barrier()
    r.policy_id, r.model_path = row.policy_id, str(path)
    return metrics


def _guard_state(r: TrainRun) -> dict[str, Any]:
    """Rank 0: the run's start evaluation (its step-0 row) and, for a run restarted after it stopped on a
    regression, why it stopped."""
    start = next((p for p in eval_points(r.lake, r.run_id) if p.step == 0), None)
    return {"start": start, "stopped": stopped_reason(r.lake, r.run_id)}


def check_before_writing(r: TrainRun, spec) -> None:
    """Every check of an RL run that reads the store, before its first write: collect's own checks of the
    rollouts' and evals' settings, the train and replay filters, and an estimator that discounts across turns
    under a spec that discounts too."""
    from trajlake.train.sources.stored import check_train_filter

    c = r.cfg
    on_main(r.main, lambda: rollout_config(r, r.policy_id, 0))
    if c.eval.every:
        on_main(r.main, lambda: eval_config(r, r.policy_id, 0))
    if c.data.train_filter:
        on_main(r.main, lambda: check_train_filter(r.lake, c))
    if c.data.replay_filter:
        on_main(r.main, lambda: check_episode_filter(r.lake, c.data.replay_filter, field="replay_filter"))
    if c.asynchronous.collectors:
        on_main(r.main, lambda: check_async_lake(r.lake))
    if ADVANTAGES[c.advantage_name].turn_level and ALLOCATIONS[spec.allocation.strategy].discounts:
        raise ConfigError(f"train config: advantage {c.advantage_name} discounts across turns itself (gamma); the "
                          f"reward_spec {spec.name} discounts them in its allocation too: use allocation last_token "
                          "or per_turn")


def iteration_metrics(it: int, batch, update: dict[str, float], got: IterationEpisodes, *, collect_s: float,
                      update_s: float) -> dict[str, Any]:
    """An RL iteration's train_steps metrics: the batch's rewards and success, its agent tokens, the times of
    the rollouts and the update, the update's own metrics, and its lineage (`episodes_where`: the query that
    selects the episodes it trained on at the row's snapshot_read; the row's episode_ids lists them)."""
    agent_tokens = int(batch.loss_mask.sum())
    return {"iteration": it + 1, "episodes": batch.size, "reward_mean": float(batch.scores.mean()),
            "reward_std": float(batch.scores.std()) if batch.size > 1 else 0.0,
            "success_mean": float(batch.success.float().mean()), "agent_tokens": agent_tokens,
            "collect_s": collect_s, "update_s": update_s,
            "rollout_tokens_per_s": agent_tokens / max(collect_s, 1e-9), **update,
            "episodes_where": got.where, "replayed": got.replayed / len(got.seqs), "sampling_rounds": got.rounds,
            **got.metrics}


def sft(config: TrainConfig, lake: Lake | None) -> RunResult:
    """Supervised fine-tuning on the episodes `config.sft.filter` selects (e.g. successful scripted-expert
    ones): cross-entropy on their response tokens, `sft_steps` optimizer steps of `minibatch_size`."""
    r = TrainRun(config, lake, "sft")
    c = config
    snap, seqs = on_main(r.main, lambda: _sft_episodes(r))
    if not seqs:
        raise ConfigError(f"train config: no episodes match sft_filter ({c.sft.filter}) at snapshot {snap} (episodes "
                          "that ended in an env error or hold no agent tokens never do)")
    with r.life():  # the lease before the engines; finished, or failed with the error, once started
        engines = r.build()
        batch = collate(seqs, engines.pad_id)
        r.start()  # the first write: everything above only read, so a refused run left no trace
        result = RunResult(r.run_id, r.policy_id, r.step)
        with TrainProgress(c.sft.steps, enabled=c.run.progress and r.main, run_id=r.run_id, done=r.step,
                           every=c.run.log_every) as bar:
            _sft_steps(r, engines, batch, snap, result, bar)
    return result


def _sft_steps(r: TrainRun, engines, batch, snap: int, result: RunResult, bar: TrainProgress) -> None:
    """SFT's steps from where the run is to sft_steps: a checkpoint and a train_steps row every
    checkpoint_every steps and at the last, a metrics row every log_every."""
    c, n, t0 = r.cfg, batch.size, time.perf_counter()
    rows_of = _sft_rows(n, min(c.optim.minibatch_size, n), c.run.seed)
    trained: dict[str, None] = {}  # lineage: the episodes of the steps since the last row, in order
    while r.step < c.sft.steps:
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
        last = r.step == c.sft.steps
        if last or (c.checkpoint.every and r.step % c.checkpoint.every == 0):
            row, path = r.checkpoint(engines, {"step": r.step})
            if r.main:
                r.commit(step=r.step, metrics=m, snapshot_read=snap, policy=row, episode_ids=tuple(trained))
            trained.clear()
            r.policy_id = result.policy_id = row.policy_id
            result.step = r.step
        elif r.step % c.run.log_every == 0 and r.main:
            r.commit(step=r.step, metrics=m, snapshot_read=snap, episode_ids=tuple(trained))
            trained.clear()


def _sft_episodes(r: TrainRun) -> tuple[int, list]:
    """Rank 0: (the snapshot SFT reads: sft_snapshot, else the one a resumed run read, else the latest; the
    episodes sft_filter selects there). A snapshot the lake lacks, or a bad filter, is refused naming it."""
    c = r.cfg
    snap = c.sft.snapshot or (r.resume.snapshot_read if r.resume else None) or r.lake.current_snapshot()
    if c.sft.snapshot is not None and c.sft.snapshot not in r.lake.snapshots()["snapshot_id"].to_list():
        raise ConfigError(f"train config: sft_snapshot {c.sft.snapshot} is not a snapshot of the lake "
                          "(trajlake snapshots lists them)")
    check_episode_filter(r.lake, c.sft.filter, field="sft_filter", snapshot=snap)  # a bad filter names it
    return snap, load_episodes(r.lake, c.sft.filter, snapshot=snap)


def _sft_rows(n: int, mb: int, seed: int):
    """`rows_of(step)`: the `mb` rows (of `n`) SFT step `step` trains on, from a fixed stream of shuffled epochs
    (seeded by `seed`), so a resumed run picks up exactly where it stopped."""
    @functools.lru_cache(maxsize=4)
    def perm(epoch: int) -> list[int]:
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()

    def rows_of(step: int) -> list[int]:
        return [perm(k // n)[k % n] for k in range(step * mb, (step + 1) * mb)]

    return rows_of


def run(config: TrainConfig, lake_uri: str | None = None) -> RunResult:
    """Entry point of `trajlake train` and `python -m trajlake.train`: opens the lake on rank 0 only."""
    rank, _ = init_distributed()
    lake = Lake.open(lake_uri) if rank == 0 else None
    try:
        return train(config, lake)
    finally:
        if lake is not None:
            lake.close()
