"""Asynchronous RL: collectors and the learner meet only through the lake (`async_collectors` N > 0).

N collector processes (Ray actors, over the cluster's nodes where `RAY_ADDRESS` names one) keep playing the newest
policy of the run stored in `policies` (the start policy until the first checkpoint). Each plays chunk after
chunk, a chunk being one collect run `<run_id>/async-<a>-<k>` of `tasks` tasks x `samples` (the split's next
block of tasks), its episodes tagged with the policy that played them. The learner (the train loop, with this
source) trains each iteration on the `tasks` complete groups it has not trained on that were played first,
among those whose policy is at most `async_staleness` steps behind the one it updates; older groups are skipped
and counted (`stale_groups`).
A collector waits while BACKLOG_ITERATIONS iterations' worth of fresh groups lie unused, so that it neither
plays what would go stale nor takes the cores from the learner for nothing.
The update's ratio is taken against the stored behaviour log-probs (old_logprobs = "behaviour", or is_cap):
the importance correction for rows an older policy played.

Nothing lives only in memory. What the learner has trained on is in `train_steps.episode_ids`, so a learner
killed and restarted with the same run id goes on from its last checkpoint with the groups it has not used; a
collector killed loses only the episodes it had in flight (Ray restarts it, and its next chunk gets the next
number after those stored). The lake must take writes from several processes: a sqlite: or postgres: catalog.
"""

from __future__ import annotations

import time
from dataclasses import replace

from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_list, sql_str
from trajlake.rewards.score import score
from trajlake.store import Lake
from trajlake.train.batch import load_episodes
from trajlake.train.config import ConfigError, TrainConfig
from trajlake.train.sources import IterationEpisodes
from trajlake.train.train_run import TrainRun

#: how often the learner looks in the lake for new groups while it waits (seconds)
POLL_S = 0.5
#: how many times Ray restarts a collector that died (a killed process, a lost node) before the run fails
COLLECTOR_RESTARTS = 3
#: how long the learner waits for its killed collectors' loops to end before marking their chunks (seconds)
STOP_WAIT_S = 30
#: the collectors wait while this many iterations' worth of fresh groups lie unused: more would only go stale
BACKLOG_ITERATIONS = 2

#: the groups of the run's collectors that the learner has not trained on: complete (`samples` episodes, none
#: ended in an env error), each with the oldest policy step among its episodes (0: the start policy), in the order
#: they were played (first in, first out: taking the newest policy's first ended lower on doors, bench/README.md)
UNUSED_GROUPS_SQL = """
WITH played AS (
    SELECT e.episode_id, coalesce(e.group_id, e.episode_id) AS g, e.status, e.finished_at,
           CASE WHEN p.run_id = {run} THEN coalesce(p.step, 0) ELSE 0 END AS version
    FROM episodes e LEFT JOIN policies p USING (policy_id)
    WHERE starts_with(e.run_id, {prefix})
), used AS (
    SELECT unnest(episode_ids) AS episode_id FROM train_steps WHERE run_id = {run} AND episode_ids IS NOT NULL
)
SELECT g, min(version) AS version FROM played
WHERE episode_id NOT IN (SELECT episode_id FROM used)
GROUP BY g HAVING count(*) = {samples} AND bool_and(status IS DISTINCT FROM 'error')
ORDER BY max(finished_at), g
"""


def chunk_prefix(run_id: str) -> str:
    """What every collect run of the run's collectors starts with."""
    return f"{run_id}/async-"


def chunk_run_id(run_id: str, collector: int, chunk: int) -> str:
    """Collector `collector`'s chunk `chunk` (both from 0 and 1)."""
    return f"{chunk_prefix(run_id)}{collector}-{chunk}"


def unused_groups(lake: Lake, config: TrainConfig) -> list[tuple[str, int]]:
    """(group, policy step) of every complete group of the run's collectors that its learner has not trained on,
    first played first (UNUSED_GROUPS_SQL)."""
    rows = lake.query(UNUSED_GROUPS_SQL.format(run=sql_str(config.run.id), prefix=sql_str(chunk_prefix(config.run.id)),
                                               samples=int(config.rollout.samples)))
    return list(rows.iter_rows())


def check_async_lake(lake: Lake) -> None:
    """Refuse, in one line, a lake that only one process may open: the collectors write while the learner does."""
    if not lake.catalog.multi_process:
        raise ConfigError(f"train config: async_collectors write the lake from their own processes while the learner "
                          f"writes it too; lake {lake.catalog.raw} is a DuckDB file, which admits one process: use "
                          "a sqlite:FILE or postgres:CONNINFO lake")


class _Collector:
    """A Ray actor: chunk after chunk of the run's rollouts with its newest stored policy, into the lake."""

    def __init__(self, uri: str, config: TrainConfig, index: int, collectors: int, start_policy: str):
        import torch

        torch.set_num_threads(1)
        self.lake = Lake.open(uri)
        self.cfg, self.index, self.collectors, self.start_policy = config, index, collectors, start_policy

    def run(self) -> None:
        """Play until killed (the learner's end, or its process gone), waiting while the learner has plenty."""
        while True:
            while self.backlog() >= BACKLOG_ITERATIONS * self.cfg.rollout.tasks:
                time.sleep(POLL_S)
            self.play(self.next_chunk())

    def backlog(self) -> int:
        """The complete groups the learner has not used that are fresh enough for its next update."""
        c = self.cfg
        newest = self.lake.query(f"SELECT coalesce(max(step), 0) AS n FROM policies WHERE run_id = "
                                 f"{sql_str(c.run.id)}")["n"][0]
        return sum(1 for _, v in unused_groups(self.lake, c) if v >= newest - c.asynchronous.staleness)

    def next_chunk(self) -> int:
        """The number after this collector's stored chunks (a restarted collector never replays one)."""
        mine = f"{chunk_prefix(self.cfg.run.id)}{self.index}-"
        ids = self.lake.query(f"SELECT run_id FROM runs WHERE starts_with(run_id, {sql_str(mine)})")["run_id"]
        return 1 + max((int(x.removeprefix(mine)) for x in ids if x.removeprefix(mine).isdigit()), default=0)

    def newest_policy(self) -> str:
        row = self.lake.query(f"SELECT policy_id FROM policies WHERE run_id = {sql_str(self.cfg.run.id)} "
                              "ORDER BY step DESC NULLS LAST LIMIT 1")
        return row["policy_id"][0] if row.height else self.start_policy

    def play(self, chunk: int) -> None:
        from trajlake.collect.config import CollectConfig, rollout_fields
        from trajlake.collect.envs import make_env
        from trajlake.collect.rollout import collect
        from trajlake.train.sources.fresh import rotation_offset

        c = self.cfg
        block = (chunk - 1) * self.collectors + self.index  # the collectors' chunks take the split's blocks in turn
        ro = c.rollout
        cc = CollectConfig(**rollout_fields(ro, concurrency=min(ro.concurrency, ro.tasks * ro.samples),
                                            max_turns=ro.max_turns),
                           policy=f"policy:{self.newest_policy()}", tasks=c.rollout.tasks, samples=c.rollout.samples,
                           seed=(c.run.seed + block) % 2**31, run_id=chunk_run_id(c.run.id, self.index, chunk),
                           progress=False, run_kind="collect", parent_run_id=c.run.id)
        env = make_env(cc.env, **cc.env_args)
        collect(replace(cc, task_offset=rotation_offset(block, c.rollout.tasks, env.split_size(cc.split))), self.lake)

    def pid(self) -> int:
        import os

        return os.getpid()


class AsyncRollouts:
    """The groups the run's collectors stored, as each iteration's episodes (rank 0 only starts and reads)."""

    def __init__(self, run: TrainRun, spec) -> None:
        self.run, self.spec = run, spec
        self.actors: list = []
        self.loops: list = []
        if run.main:
            self._start()

    def _start(self) -> None:
        from trajlake.collect.ray_init import ensure_ray

        r, c = self.run, self.run.cfg
        self.ray = ray = ensure_ray(c.asynchronous.collectors)
        # no collector of this run lives before the learner starts them (a driver's actors die with it), so a
        # chunk still marked running was cut off with an earlier learner process
        end_chunks_in_flight(r.lake, r.run_id, "its collector ended with an earlier learner process")
        actor = ray.remote(num_cpus=1, scheduling_strategy="SPREAD", max_restarts=COLLECTOR_RESTARTS,
                           max_task_retries=COLLECTOR_RESTARTS)(_Collector)
        self.actors = [actor.remote(r.lake.catalog.raw, c, a, c.asynchronous.collectors, r.start_pid)
                       for a in range(c.asynchronous.collectors)]
        self.loops = [a.run.remote() for a in self.actors]

    def _check_collectors(self) -> None:
        """Raise when a collector's loop ended: it only ends by failing past its restarts."""
        done, _ = self.ray.wait(self.loops, num_returns=len(self.loops), timeout=0)
        for ref in done:
            try:
                self.ray.get(ref)
            except Exception as e:  # the collector's own error, as Ray carries it
                raise TrajlakeError(f"train run {self.run.run_id}: collector {self.loops.index(ref)} failed "
                                    f"{COLLECTOR_RESTARTS + 1} times, the last: {str(e).strip().splitlines()[-1]}; "
                                    "re-run the train run to resume it") from None

    def episodes(self, it: int) -> IterationEpisodes:
        r, c = self.run, self.run.cfg
        t0 = time.perf_counter()
        while True:
            groups = unused_groups(r.lake, c)
            fresh = [(g, v) for g, v in groups if v >= it - c.asynchronous.staleness]
            if len(fresh) >= c.rollout.tasks:
                break
            self._check_collectors()
            time.sleep(POLL_S)
        chosen = fresh[:c.rollout.tasks]
        where = (f"starts_with(run_id, {sql_str(chunk_prefix(r.run_id))}) AND coalesce(group_id, episode_id) IN "
                 f"({sql_list(sorted(g for g, _ in chosen))})")
        score(r.lake, self.spec, where=where, run_id=r.run_id)
        snap = r.lake.current_snapshot()
        seqs = load_episodes(r.lake, where, snapshot=snap, spec_id=self.spec.spec_id)
        waited = {"learner_wait_s": time.perf_counter() - t0, "stale_groups": len(groups) - len(fresh),
                  "staleness_mean": sum(it - v for _, v in chosen) / len(chosen)}
        return IterationEpisodes(snap, where, seqs, 0, metrics=waited)

    def close(self) -> None:
        """Stop the collectors, and mark the chunks they were playing failed: no run of the learner's stays
        `running` after it (a chunk's finished episodes stay, as a stopped collect run's do)."""
        for a in self.actors:
            self.ray.kill(a, no_restart=True)
        if self.actors:  # once their loops have ended (a kill is asynchronous), so no chunk commits after this
            self.ray.wait(self.loops, num_returns=len(self.loops), timeout=STOP_WAIT_S)
            end_chunks_in_flight(self.run.lake, self.run.run_id, "its collector was stopped with the learner")
        self.actors, self.loops = [], []


def end_chunks_in_flight(lake: Lake, run_id: str, why: str) -> None:
    """Mark failed, saying `why`, every chunk of the run's collectors still marked running whose process is gone
    (store/runs.py `fail_abandoned`)."""
    from trajlake.store import runs

    left = lake.query(f"SELECT run_id FROM runs WHERE starts_with(run_id, {sql_str(chunk_prefix(run_id))}) "
                      "AND status = 'running' ORDER BY run_id")["run_id"].to_list()
    runs.fail_abandoned(lake, left, stage="train", why=f"stopped mid-chunk: {why}")


__all__ = ["AsyncRollouts", "UNUSED_GROUPS_SQL", "check_async_lake", "chunk_prefix", "chunk_run_id",
           "end_chunks_in_flight"]
