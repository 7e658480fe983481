"""The train loop's rollouts and held-out evals: collect runs played by the actor itself (transformers, in this
process), or by a rollout engine started once (`rollout_engine` vllm, or `replicas` > 1 on Ray) into which each
new checkpoint is loaded. Only rank 0 plays; the others wait for what it stored.
"""

from __future__ import annotations

from trajlake.core.errors import TrajlakeError
from trajlake.train.distributed import broadcast, device
from trajlake.train.engine import Engines
from trajlake.train.rollout_engines import ROLLOUT_ENGINES
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
    seed = (c.seed + it + round_ * ROUND_SEED_STRIDE) % 2**31  # each round its own sampler stream
    cc = CollectConfig(**rollout_fields(c, concurrency=min(c.concurrency, c.tasks * c.samples),
                                        max_turns=c.turns_at(it)),
                       policy=f"policy:{policy_id}", tasks=c.tasks, samples=c.samples, seed=seed,
                       run_id=round_run_id(r.run_id, it, round_), progress=False, run_kind="collect",
                       parent_run_id=r.run_id)
    env = make_env(cc.env, **cc.env_args)
    if is_query(c.task_selector):
        return replace(cc, task_positions=selected_positions(r, env, cc, it, played))
    if not c.rotate_tasks:
        return cc
    block = it * c.sampling_rounds + round_
    return replace(cc, task_offset=rotation_offset(block, c.tasks, env.split_size(cc.split)))


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
    pool = c.task_pool or env.split_size(cc.split)
    if pool is None:
        raise TaskSelectorError(f"task_selector {c.task_selector}: split {cc.split!r} of {cc.env} has no end; set "
                                "task_pool (how many of its first tasks to choose from)")
    if pool < c.tasks * c.sampling_rounds:
        rounds = f" x sampling_rounds {c.sampling_rounds}" if c.sampling_rounds > 1 else ""
        raise TaskSelectorError(f"task_selector {c.task_selector}: task_pool {pool} is smaller than tasks "
                                f"{c.tasks}{rounds}")
    candidates = env.tasks(cc.split, n=pool, difficulty=cc.difficulty)
    return select_positions(r.lake, selector_query(c.task_selector), c.task_selector, candidates, run_id=r.run_id,
                            iteration=it + 1, n=c.tasks, samples=c.samples, start_policy=r.start_pid,
                            exclude=played)


def eval_config(r: TrainRun, policy_id: str, step: int):
    """The collect run of a held-out eval of this train run, made by evaluate's own code: greedy, one sample
    of `eval_tasks` tasks of `eval_split`, played as the rollouts are."""
    from trajlake.collect.config import rollout_fields
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.run import eval_collect_config

    c, policy = r.cfg, f"policy:{policy_id}"
    ec = EvalConfig(**rollout_fields(c, split=c.eval_split, concurrency=min(c.concurrency, c.eval_tasks)),
                    policies=(policy,), tasks=c.eval_tasks, greedy=True, seed=c.seed, progress=False)
    return eval_collect_config(ec, policy, f"{r.run_id}/eval-{step}", parent_run_id=r.run_id)


def _engine_policy(r: TrainRun, policy_id: str, path: str):
    """The run's rollout policy when it is not the actor itself (replicas > 1, or rollout_engine vllm): started
    once, then each new checkpoint `path` loaded into it without a restart."""
    c = r.cfg
    engine = ROLLOUT_ENGINES[c.rollout_engine]
    if r.rollout is None:
        if c.replicas > 1:
            from trajlake.collect.policies.replicas import ReplicatedPolicy

            r.rollout = ReplicatedPolicy(f"{engine.scheme}:{path}", c.replicas, policy_id=policy_id)
        else:
            r.rollout = engine.start(path, policy_id)
    elif r.rollout_loaded != path:
        r.rollout.reload(path)
    r.rollout.policy_id, r.rollout_loaded = policy_id, path
    return r.rollout


def collect_run(r: TrainRun, engines: Engines, policy_id: str, path: str, cc) -> str:
    """Rank 0 plays the collect run `cc` with the actor (or its replicas) into the store; returns its run id."""
    from trajlake.collect.rollout import EnvErrorsOnly, collect

    separate = r.cfg.replicas > 1 or not ROLLOUT_ENGINES[r.cfg.rollout_engine].in_process
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


def evaluate(r: TrainRun, engines: Engines, policy_id: str, path: str, step: int) -> dict[str, float]:
    """Greedy episodes on held-out tasks (rank 0); success rate and mean env reward, on every rank."""
    from trajlake.evaluate.run import success_rate

    out = None
    if r.main:
        out = success_rate(r.lake, collect_run(r, engines, policy_id, path, eval_config(r, policy_id, step)))
    return broadcast(out)
