"""RL on stored rollouts: a train config's `train_filter` (SQL over episodes columns, any runs, policies and
envs) chooses the episodes the iterations train on instead of collecting fresh ones; or `replay_ratio` mixes
a share of the run's own earlier rollouts (`replay_filter`, `replay_staleness`) into each fresh batch.

The episodes are read at one pinned snapshot (`train_snapshot`, else the snapshot just after they were
scored with the run's reward spec), so every iteration, and a restart of the run, sees the same data. They
are dealt to the iterations by GRPO group (the stored `group_id`, an episode alone when it has none): `tasks`
groups an iteration, in group order, wrapping around after the last (one pass over the data is an epoch).
Groups too small for an estimator that compares a group's samples are left out and counted, never used.

The policies that played them are not the one being trained: the update's importance ratio is taken against
their stored behaviour log-probs (`old_logprobs = "behaviour"`, or `is_cap` truncated weights), so an episode
played by a text-only policy (a scripted expert, an API model), which has none, is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajlake.core.sql_text import sql_list
from trajlake.rewards.score import score
from trajlake.store import Lake
from trajlake.train.algos import ADVANTAGES
from trajlake.train.batch import check_episode_filter, load_episodes
from trajlake.train.config import ConfigError, TrainConfig
from trajlake.train.sources import IterationEpisodes
from trajlake.train.train_run import TrainRun

GROUPS_SQL = """
SELECT coalesce(group_id, episode_id) AS g, count(*) AS n FROM episodes
WHERE ({where}\n) AND status IS DISTINCT FROM 'error' GROUP BY g ORDER BY g
"""

TEXT_ONLY_SQL = """
SELECT e.episode_id, e.policy_id, count(*) OVER () AS n FROM episodes e
WHERE ({where}\n) AND e.status IS DISTINCT FROM 'error' AND EXISTS (
    SELECT 1 FROM turns t WHERE t.episode_id = e.episode_id AND t.num_response_tokens > 0
    AND t.response_logprobs IS NULL)
ORDER BY e.episode_id LIMIT 1
"""


@dataclass(frozen=True)
class StoredData:
    """The stored episodes a run trains on: its filter, the snapshot they are read at, the groups dealt to the
    iterations, and how many groups were left out as too small."""

    where: str
    snapshot: int
    groups: tuple[str, ...]
    small_groups: int

    def iteration_filter(self, it: int, per_iteration: int) -> str:
        """The filter of iteration `it` (from 0): its `per_iteration` groups, wrapping around the data."""
        n = len(self.groups)
        chosen = [self.groups[(it * per_iteration + k) % n] for k in range(min(per_iteration, n))]
        return f"({self.where}) AND coalesce(group_id, episode_id) IN ({sql_list(chosen)})"


def check_train_filter(lake: Lake, config: TrainConfig) -> None:
    """Raise, reading only, when `train_filter` is not a filter, matches nothing, selects episodes without
    behaviour log-probs (text-only policies: naming one of them and its policy), or has no group large enough
    for the advantage estimator."""
    where, snap = config.data.train_filter, config.data.train_snapshot
    n = check_episode_filter(lake, where, field="train_filter", snapshot=snap)
    if n == 0:
        raise ConfigError(f"train config: train_filter {where!r} matches no episodes (none that ended without an "
                          f"env error) at snapshot {snap if snap is not None else lake.current_snapshot()}")
    bad = lake.query(TEXT_ONLY_SQL.format(where=where), snapshot=snap)
    if bad.height:
        row = bad.row(0, named=True)
        raise ConfigError(f"train config: train_filter selects {row['n']} episode(s) played by text-only policies, "
                          f"with no behaviour log-probs for the off-policy ratio (e.g. {row['episode_id']} of "
                          f"{row['policy_id']}): leave them out of the filter (e.g. AND policy_id NOT LIKE "
                          "'scripted%'), or train on them with algo sft")
    _groups(lake, config, snap)


def _groups(lake: Lake, config: TrainConfig, snapshot: int | None) -> tuple[tuple[str, ...], int]:
    """The groups of the filter's episodes usable by the advantage estimator, and how many were too small."""
    where = config.data.train_filter
    rows = lake.query(GROUPS_SQL.format(where=where), snapshot=snapshot)
    need = ADVANTAGES[config.advantage_name].min_group_size  # 2 for an estimator comparing a group's samples
    groups = tuple(g for g, n in rows.iter_rows() if n >= need)
    if not groups:
        raise ConfigError(f"train config: train_filter {where!r} has no group of {need} or more episodes for "
                          f"advantage {config.advantage_name} (which compares a group's samples)")
    return groups, rows.height - len(groups)


def stored_data(lake: Lake, config: TrainConfig, spec, pinned: int | None) -> StoredData:
    """Score what `train_filter` selects (unless `train_snapshot` pins data already scored) and deal its
    groups; `pinned`: the snapshot a restarted run read before (the same data again)."""
    where = config.data.train_filter
    snap = pinned if pinned is not None else config.data.train_snapshot
    if snap is None:
        score(lake, spec, where=where, run_id=config.run.id)  # what is scored already is skipped
        snap = lake.current_snapshot()
    groups, small = _groups(lake, config, snap)
    return StoredData(where, snap, groups, small)


class StoredRollouts:
    """This iteration's groups of the stored episodes the run trains on, at their pinned snapshot."""

    def __init__(self, run: TrainRun, data: StoredData, spec) -> None:
        self.run, self.data, self.spec = run, data, spec

    def episodes(self, it: int) -> IterationEpisodes:
        where = self.data.iteration_filter(it, self.run.cfg.rollout.tasks)
        seqs = load_episodes(self.run.lake, where, snapshot=self.data.snapshot, spec_id=self.spec.spec_id)
        return IterationEpisodes(self.data.snapshot, where, seqs, len(seqs))

    def close(self) -> None:
        """Nothing to end: the episodes were stored before the run."""


__all__ = ["GROUPS_SQL", "StoredData", "StoredRollouts", "check_train_filter", "stored_data"]
