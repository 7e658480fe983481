"""Fresh rollouts: each iteration's collect runs, played by the actor itself (transformers, in this process), or
by a rollout engine started once (`rollout_engine` vllm, or `replicas` > 1 on Ray) into which each new checkpoint
is loaded, then scored and read back (`FreshRollouts`), with a share of the run's earlier rollouts replayed
(`replay_filter`). Only rank 0 plays; the others wait for what it stored.
"""

from __future__ import annotations

import random

import torch

from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_list, sql_str
from trajlake.rewards.score import score
from trajlake.store import Lake
from trajlake.train.algos import ADVANTAGES
from trajlake.train.algos.groups import outcome_groups
from trajlake.train.batch import EpisodeSeq, load_episodes
from trajlake.train.config import TrainConfig
from trajlake.train.distributed import device
from trajlake.train.engine import Engines
from trajlake.train.rollout_engines import ROLLOUT_ENGINES, EngineFacts, resolve_engine
from trajlake.train.sources import IterationEpisodes
from trajlake.train.sources.stored import GROUPS_SQL
from trajlake.train.train_run import TrainRun


def _in_memory_policy(engines: Engines, policy_id: str, path: str):
    """The actor as a collect policy without a round trip through disk (ZeRO 0-2: rank 0 holds every weight);
    None under ZeRO-3 (collect then loads the checkpoint)."""
    if engines.actor.zero_optimization_stage() == 3:
        return None
    from trajlake.collect.policies.hf import HFPolicy

    return HFPolicy(path, policy_id=policy_id, model=engines.actor.module, tokenizer=engines.tokenizer,
                    device=str(device()))


def rotation_offset(iteration: int, tasks: int, split_size: int | None) -> int:
    """The first task of iteration `iteration` (from 0) when each plays the next `tasks` tasks of a split: block
    after block, and on a split with an end (`split_size` tasks) around again from its start, so that a train
    run never reaches past its split into another's tasks. The last `split_size % tasks` tasks of a bounded
    split are left out of the rotation, which cycles through whole blocks."""
    if split_size is None:
        return iteration * tasks
    blocks = split_size // tasks
    if blocks == 0:
        raise TrajlakeError(f"tasks per iteration ({tasks}) exceed the split's {split_size} tasks; lower tasks")
    return (iteration % blocks) * tasks


#: how far apart the sampler seeds of an iteration's rounds are (a prime: round k of iteration i and round 0 of
#: iteration i + k * stride never meet in a run of fewer iterations)
ROUND_SEED_STRIDE = 1_000_003


def round_run_id(run_id: str, it: int, round_: int = 0) -> str:
    """The collect run of round `round_` (from 0) of iteration `it` (from 0): `<run_id>/it-<n>`, and for the
    further rounds of dynamic sampling `<run_id>/it-<n>/round-<k>` (k from 2)."""
    first = f"{run_id}/it-{it + 1}"
    return first if round_ == 0 else f"{first}/round-{round_ + 1}"


def rollout_config(r: TrainRun, policy_id: str, it: int, round_: int = 0, played: frozenset[int] = frozenset()):
    """The collect run of round `round_` of iteration `it` (from 0) of this train run (collect's own checks run
    on it): the train config's rollout settings, sampled with seed + it (and the round), at the horizon
    curriculum's turn cap of that iteration (`TrainConfig.turns_at`: max_turns when it is off), on the next
    `tasks` tasks of the split (`rotation_offset`; with sampling_rounds R, iteration i's rounds take blocks
    i*R .. i*R+R-1) or those the run's task_selector query chooses outside `played` (`selected_positions`)."""
    from dataclasses import replace

    from trajlake.collect.config import CollectConfig, rollout_fields
    from trajlake.collect.envs import make_env
    from trajlake.train.task_select import is_query

    c = r.cfg
    seed = (c.run.seed + it + round_ * ROUND_SEED_STRIDE) % 2**31  # each round its own sampler stream
    ro = c.rollout
    cc = CollectConfig(**rollout_fields(ro, concurrency=min(ro.concurrency, ro.tasks * ro.samples),
                                        max_turns=c.turns_at(it)),
                       policy=f"policy:{policy_id}", tasks=c.rollout.tasks, samples=c.rollout.samples, seed=seed,
                       run_id=round_run_id(r.run_id, it, round_), progress=False, run_kind="collect",
                       parent_run_id=r.run_id)
    env = make_env(cc.env, **cc.env_args)
    if is_query(c.rollout.task_selector):
        return replace(cc, task_positions=selected_positions(r, env, cc, it, played))
    if not c.rollout.rotate_tasks:
        return cc
    block = it * c.rollout.sampling_rounds + round_
    return replace(cc, task_offset=rotation_offset(block, c.rollout.tasks, env.split_size(cc.split)))


def selected_positions(r: TrainRun, env, cc, it: int, played: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """The tasks iteration `it` plays under a query task_selector: those its collect run recorded when it was
    begun already (a restarted iteration plays what it started), else the query's first `tasks` over the
    split's first task_pool tasks, as the lake is now, other than the positions `played` (this iteration's
    earlier rounds)."""
    from trajlake.store import runs
    from trajlake.train.task_select import TaskSelectorError, select_positions, selector_query

    c = r.cfg
    begun = runs.stored(r.lake, cc.run_id)
    if begun is not None and begun.config.get("task_positions"):
        return tuple(begun.config["task_positions"])
    pool = c.rollout.task_pool or env.split_size(cc.split)
    if pool is None:
        raise TaskSelectorError(f"task_selector {c.rollout.task_selector}: split {cc.split!r} of {cc.env} has no "
                                "end; set task_pool (how many of its first tasks to choose from)")
    if pool < c.rollout.tasks * c.rollout.sampling_rounds:
        rounds = f" x sampling_rounds {c.rollout.sampling_rounds}" if c.rollout.sampling_rounds > 1 else ""
        raise TaskSelectorError(f"task_selector {c.rollout.task_selector}: task_pool {pool} is smaller than tasks "
                                f"{c.rollout.tasks}{rounds}")
    candidates = env.tasks(cc.split, n=pool, difficulty=cc.difficulty)
    selector = c.rollout.task_selector
    return select_positions(r.lake, selector_query(selector), selector, candidates, run_id=r.run_id,
                            iteration=it + 1, n=c.rollout.tasks, samples=c.rollout.samples, start_policy=r.start_pid,
                            exclude=played)


def choose_rollout_engine(r: TrainRun, engines: Engines) -> str:
    """The engine the run's rollouts and evaluations play on (`rollout_engine`, or what `auto` chooses for it:
    train/rollout_engines.py), kept as `r.engine` and printed with why; its name."""
    import importlib.util

    c = r.cfg

    def facts() -> EngineFacts:
        params = sum(getattr(p, "ds_numel", p.numel()) for p in engines.actor.parameters())  # ZeRO-3: partitioned
        evals = (c.run.iterations // c.eval.every + 1) * c.eval.tasks if c.eval.every else 0
        ro = c.rollout  # a train_filter run plays none (stored rollouts)
        played = 0 if c.data.train_filter else c.run.iterations * ro.tasks * ro.samples * ro.sampling_rounds
        episodes = played + evals
        return EngineFacts(params, episodes * c.rollout.max_turns * c.rollout.max_new_tokens,
                           importlib.util.find_spec("vllm") is not None)

    r.engine, why = resolve_engine(c.rollout.engine, facts)
    if c.run.progress and c.rollout.engine != r.engine:
        from trajlake.core.display import console

        console.print(f"rollout engine: {r.engine} ({c.rollout.engine}: {why})", soft_wrap=True, highlight=False)
    return r.engine


def _engine_policy(r: TrainRun, policy_id: str, path: str):
    """The run's rollout policy when it is not the actor itself (replicas > 1, or the engine vllm): started
    once, then each new checkpoint `path` loaded into it without a restart."""
    c = r.cfg
    engine = ROLLOUT_ENGINES[r.engine]
    if r.rollout is None:
        if c.rollout.replicas > 1:
            from trajlake.collect.policies.replicas import ReplicatedPolicy

            r.rollout = ReplicatedPolicy(f"{engine.scheme}:{path}", c.rollout.replicas, policy_id=policy_id)
        else:
            r.rollout = engine.start(path, policy_id)
    elif r.rollout_loaded != path:
        r.rollout.reload(path)
    r.rollout.policy_id, r.rollout_loaded = policy_id, path
    return r.rollout


def collect_run(r: TrainRun, engines: Engines, policy_id: str, path: str, cc) -> str:
    """Rank 0 plays the collect run `cc` with the actor (or its replicas) into the store; returns its run id."""
    from trajlake.collect.rollout import EnvErrorsOnly, collect

    separate = r.cfg.rollout.replicas > 1 or not ROLLOUT_ENGINES[r.engine].in_process
    policy = _engine_policy(r, policy_id, path) if separate else _in_memory_policy(engines, policy_id, path)
    engines.actor.eval()
    try:
        return collect(cc, r.lake, policy=policy)
    except EnvErrorsOnly as e:  # a restart of the train run re-collects (and so retries) this run
        raise TrajlakeError(f"train run {r.run_id}: collect run {cc.run_id} failed: {e.what}; re-run the train run "
                            f"(--run-id {r.run_id}) once the env works") from None
    finally:
        if policy is not None and not separate:
            policy.close()


class FreshRollouts:
    """Rollouts of the current policy, collected, scored with the run's spec and read back at once; with
    min_outcome_groups, further rounds on other tasks until enough groups' outcomes differ (DAPO's dynamic
    sampling), at most sampling_rounds."""

    def __init__(self, run: TrainRun, engines: Engines, spec) -> None:
        self.run, self.engines, self.spec = run, engines, spec

    def episodes(self, it: int) -> IterationEpisodes:
        r, spec = self.run, self.spec
        where, rounds = self._rounds(it)
        snap = r.lake.current_snapshot()
        seqs = load_episodes(r.lake, where, snapshot=snap, spec_id=spec.spec_id)
        replay = replay_filter(r.cfg, r.run_id, it, r.lake, snap)  # earlier rollouts mixed in, if asked
        if not replay:
            return IterationEpisodes(snap, where, seqs, 0, rounds)
        replayed = load_episodes(r.lake, replay, snapshot=snap, spec_id=spec.spec_id)
        return IterationEpisodes(snap, f"({where}\n) OR ({replay}\n)",
                                 sorted(seqs + replayed, key=lambda s: s.episode_id), len(replayed), rounds)

    def _rounds(self, it: int) -> tuple[str, int]:
        """Play and score the iteration's rounds: (the filter selecting their episodes, the rounds played). A
        restarted iteration resumes each stored round, whose outcomes decide again as they did."""
        r, c = self.run, self.run.cfg
        run_ids: list[str] = []
        played: frozenset[int] = frozenset()
        for k in range(c.rollout.sampling_rounds):
            cc = rollout_config(r, r.policy_id, it, k, played)
            run_ids.append(collect_run(r, self.engines, r.policy_id, r.model_path, cc))
            score(r.lake, self.spec, where=f"run_id = {sql_str(run_ids[-1])}", run_id=r.run_id)
            played |= set(cc.task_positions or ())
            if not c.rollout.min_outcome_groups or k + 1 == c.rollout.sampling_rounds:
                break
            seqs = load_episodes(r.lake, _runs_filter(run_ids), snapshot=r.lake.current_snapshot())
            if outcome_group_count(seqs) >= c.rollout.min_outcome_groups:
                break
        return _runs_filter(run_ids), len(run_ids)

    def close(self) -> None:
        """Nothing to end: the rollout engine is the run's own (TrainRun closes it)."""


def _runs_filter(run_ids: list[str]) -> str:
    if len(run_ids) == 1:
        return f"run_id = {sql_str(run_ids[0])}"
    return f"run_id IN ({', '.join(sql_str(x) for x in run_ids)})"


def outcome_group_count(seqs: list[EpisodeSeq]) -> int:
    """How many groups of `seqs` hold both a success and a failure (the update's own count)."""
    if not seqs:
        return 0
    success = torch.tensor([s.success for s in seqs])
    return outcome_groups(success, [s.group_id for s in seqs])[1]


def replay_filter(config: TrainConfig, run_id: str, it: int, lake: Lake, snapshot: int) -> str | None:
    """The replayed share of iteration `it` (from 0) of a run mixing replay into fresh rollouts: a filter of
    `replay_ratio / (1 - replay_ratio)` groups per fresh group, drawn (seeded by seed + it) from this run's
    rollouts of the last `replay_staleness` iterations (each one's every round) that `replay_filter`
    keeps. None: nothing to replay (no replay, the first iteration, or an empty pool)."""
    if config.data.replay_ratio <= 0 or it == 0:
        return None
    runs = [round_run_id(run_id, j, k) for j in range(max(0, it - config.data.replay_staleness), it)
            for k in range(config.rollout.sampling_rounds)]
    narrowed = config.data.replay_filter
    pool = f"run_id IN ({sql_list(runs)})" + (f" AND ({narrowed})" if narrowed else "")
    need = ADVANTAGES[config.advantage_name].min_group_size
    groups = [g for g, n in lake.query(GROUPS_SQL.format(where=pool), snapshot=snapshot).iter_rows() if n >= need]
    want = round(config.rollout.tasks * config.data.replay_ratio / (1 - config.data.replay_ratio))
    if not groups or want == 0:
        return None
    chosen = random.Random(config.run.seed + it).sample(groups, min(want, len(groups)))
    return f"({pool}) AND coalesce(group_id, episode_id) IN ({sql_list(sorted(chosen))})"


__all__ = ["FreshRollouts", "collect_run", "outcome_group_count", "replay_filter", "rollout_config",
           "rotation_offset", "round_run_id", "selected_positions"]
